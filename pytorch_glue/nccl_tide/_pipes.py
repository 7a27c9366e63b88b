# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The command-line entry points' way out when their reader has gone (`tide-perf ... | head -2`)."""

import os
import signal
import sys


def closed_pipe_exit() -> int:
    """The exit status of a command whose output pipe closed: 128 + SIGPIPE, what a shell reports for a command the
    signal ended. stdout is pointed at /dev/null first, so that the interpreter's flush at exit, which would meet
    the closed pipe again, prints nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind sys.stdout: nothing to redirect
        pass
    return 128 + signal.SIGPIPE
