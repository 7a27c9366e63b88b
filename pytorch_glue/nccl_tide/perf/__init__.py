# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf: nccl-tests-style benchmark of TIDE all-gather and reduce-scatter."""
