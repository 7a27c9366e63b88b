# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# FindNCCL: locates nccl.h (headers only: libnccl-tide.so never links libnccl; at run time it uses the NCCL that
# the process has already loaded).
#
# Search order:
#   1. -DNCCL_ROOT=... or the NCCL_HOME environment variable (<root>/include/nccl.h)
#   2. the nvidia-nccl-cu<major> pip wheel matching the CUDA major (TIDE_CUDA_MAJOR if set, else 13 then 12),
#      located by asking the Python interpreter for nvidia.nccl.__path__
#   3. system paths (/usr/include, /usr/local/include, CUDA toolkit include)
#
# Sets: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_HEADER_VERSION (NCCL_VERSION_CODE from nccl.h, e.g. 23203),
#       NCCL_VERSION_STRING (e.g. 2.32.3).

set(_nccl_hints "")
if(NCCL_ROOT)
  list(APPEND _nccl_hints "${NCCL_ROOT}/include" "${NCCL_ROOT}")
endif()
if(DEFINED ENV{NCCL_HOME})
  list(APPEND _nccl_hints "$ENV{NCCL_HOME}/include" "$ENV{NCCL_HOME}")
endif()

if(NOT NCCL_INCLUDE_DIR AND _nccl_hints)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS ${_nccl_hints} NO_DEFAULT_PATH)
endif()

if(NOT NCCL_INCLUDE_DIR)
  if(NOT Python3_EXECUTABLE)
    find_package(Python3 COMPONENTS Interpreter QUIET)
  endif()
  if(Python3_EXECUTABLE)
    if(TIDE_CUDA_MAJOR)
      set(_nccl_majors ${TIDE_CUDA_MAJOR})
    else()
      set(_nccl_majors 13 12)
    endif()
    # Both wheels install the same module, nvidia.nccl; the distribution name tells which CUDA major it is for.
    foreach(_major IN LISTS _nccl_majors)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c
                "import importlib.metadata as m, nvidia.nccl as n; m.version('nvidia-nccl-cu${_major}'); print(list(n.__path__)[0])"
        OUTPUT_VARIABLE _nccl_wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_rc)
      if(_nccl_rc EQUAL 0 AND EXISTS "${_nccl_wheel_dir}/include/nccl.h")
        set(NCCL_INCLUDE_DIR "${_nccl_wheel_dir}/include" CACHE PATH "Directory holding nccl.h" FORCE)
        set(NCCL_FROM_WHEEL "nvidia-nccl-cu${_major}")
        break()
      endif()
    endforeach()
  endif()
endif()

if(NOT NCCL_INCLUDE_DIR)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS /usr/include /usr/local/include /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
endif()

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH|VERSION_CODE) ")
  foreach(_line IN LISTS _nccl_lines)
    if(_line MATCHES "^#define NCCL_(MAJOR|MINOR|PATCH|VERSION_CODE) +([0-9]+)")
      set(_nccl_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
    endif()
  endforeach()
  if(DEFINED _nccl_VERSION_CODE)
    set(NCCL_HEADER_VERSION ${_nccl_VERSION_CODE})
  elseif(DEFINED _nccl_MAJOR)
    math(EXPR NCCL_HEADER_VERSION "${_nccl_MAJOR} * 10000 + ${_nccl_MINOR} * 100 + ${_nccl_PATCH}")
  endif()
  if(DEFINED _nccl_MAJOR)
    set(NCCL_VERSION_STRING "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIR NCCL_HEADER_VERSION
                                  VERSION_VAR NCCL_VERSION_STRING)
mark_as_advanced(NCCL_INCLUDE_DIR)
