// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Symbol visibility for the C API. The library is built with -fvisibility=hidden, so only functions marked
// TIDE_EXPORT (and matched by plugin/exports.map) leave libnccl-tide.so.
#ifndef TIDE_CORE_EXPORT_H_
#define TIDE_CORE_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define TIDE_EXPORT __attribute__((visibility("default")))
#else
#define TIDE_EXPORT
#endif

#endif  // TIDE_CORE_EXPORT_H_
