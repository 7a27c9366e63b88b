# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""GPU tests of the CUDA data path (marker gpu; tests/conftest.py skips them without torch or a CUDA device).

CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA initializes: loopback worlds of up to 8 virtual ranks keep up
to 16 streams busy with cross-stream flag waits (see nccl_tide/cuda.py).
"""

import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
