#!/usr/bin/env bash
# Next session's first device call (< 10 min), written at the end of session 28 when no device time was left:
# NCCL_TIDE_FENCE_ONCE (relaxed resets and phases, one barrier per run of token writes; default 0, never run on a GPU)
# against its default in host_issue's GPU column (fence, nofence, twice), then every tests/gpu file, the flag-touching
# ones first (test_eager_graphs flips NCCL_TIDE_FENCE_ONCE to 1 in a subprocess for every graph test). If the tests
# pass and the AG's GPU time at W = 8 drops (run 28.1: five barriered writes cost 20-28 us), make 1 the default
# (params.cc, docs/env.md, docs/architecture.md "Memory barriers on flag writes"). Archive: $OUT/session29.tgz.
export TAG="${TAG:-session29}" AB="${AB:-fence nofence fence nofence}"
exec bash "$(dirname "$0")/gpu_session28.sh" "${@:-ab all}"
