"""tide-perf: nccl-tests-style benchmark of TIDE all-gather and reduce-scatter."""
