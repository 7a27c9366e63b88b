// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// EXPECT(cond, fmt, ...) for the native test programs: counts a failed check in `failures` and prints the condition
// and a message, then goes on, so one run reports every failing check. main() returns non-zero when failures > 0.
#pragma once

#include <cstdio>

static int failures = 0;

#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) {                           \
      ++failures;                            \
      fprintf(stderr, "FAILED %s: ", #cond); \
      fprintf(stderr, __VA_ARGS__);          \
      fprintf(stderr, "\n");                 \
    }                                        \
  } while (0)
