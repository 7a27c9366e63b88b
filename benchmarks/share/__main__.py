# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""python benchmarks/share ... (or, with benchmarks/ on the path, python -m share ...)."""

import os
import sys

# Run as a directory, sys.path[0] is this package's own folder: the package and its neighbours (bench_lib) import
# from benchmarks/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from share.cli import main  # noqa: E402

sys.exit(main())
