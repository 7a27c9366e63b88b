# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The -J document: nccl-tests' JSON, file version 3 (src/util.cu of nccl-tests 2.19.6), with tide-perf's own keys
under one top-level `extras` key.

nccl-tests' part, in its order: version, start_time, args, env, nccl_version; config (nthreads, ngpus, sizes and
steps, iteration counts, validation, graph, blocking_collectives, per_iter_timing, per_iter_skip, parallel_init,
devices [{rank, group, pid, hostname, device, device_hex, device_info}]); results, one per size of the first
implementation of --impl ({size, count, type, redop, root, out_of_place, out_of_place_per_iter with -I 1, in_place,
in_place_per_iter, actual_iterations, experiment_name}); out_of_bounds, average_bus_bandwidth, errors, end_time.
Booleans are the strings "true"/"false" and root its padded text, as nccl-tests writes them. A variant tide-perf
could not measure has null figures. `extras.results` holds every implementation's rows with tide-perf's columns.
"""

import time
from typing import List, Optional

from . import report
from .report import Row, Variant

JSON_FILE_VERSION = 3


def tf(b: bool) -> str:
    return "true" if b else "false"


def device_json(d: dict) -> dict:
    return {"rank": d["rank"], "group": d["group"], "pid": d["pid"], "hostname": d["hostname"],
            "device": int(d["device"]), "device_hex": d.get("device_hex") or "unknown", "device_info": d["name"]}


def variant_json(v: Variant, cputime: bool) -> dict:
    return {"cpu_time" if cputime else "time": v.time_us, "alg_bw": v.algbw, "bus_bw": v.busbw, "nwrong": v.wrong}


def per_iter_json(v: Variant, skip: int) -> dict:
    doc = {"skipped_iterations": skip, **report.iter_stats(v.iter_us, skip), "times_us": list(v.iter_us)}
    if v.proc_iter_us and len(v.proc_iter_us) > 1:
        doc["per_process_max_times_us"] = [list(t) for t in v.proc_iter_us]
    return doc


def row_json(r: Row, iters: int, name: str, cputime: bool = False, skip: int = 0) -> dict:
    """One of nccl-tests' results records."""
    doc = {"size": r.size, "count": r.count, "type": r.type, "redop": r.redop, "root": "%6i" % r.root}
    for key, v in (("out_of_place", r.oop), ("in_place", r.ip)):
        doc[key] = variant_json(v, cputime)
        if v.iter_us:
            doc[key + "_per_iter"] = per_iter_json(v, skip)
    doc["actual_iterations"] = iters
    doc["experiment_name"] = name
    return doc


def extra_row_json(r: Row) -> dict:
    """A row with tide-perf's columns, for extras.results (every implementation)."""
    return {"impl": r.impl, "size": r.size, "count": r.count, "type": r.type, "redop": r.redop,
            "out_of_place": variant_json(r.oop, False), "in_place": variant_json(r.ip, False),
            "sm_time_us": r.sm_us, "gemm_slowdown": r.gemm_x, "host_issue_us_per_rank": r.host_us,
            "gpu_latency_us": r.gpu_us, "ran": r.ok, "note": r.note}


def document(head: dict, nccl_config: dict, devices: list, rows: List[Row], subject: str,
             min_busbw: Optional[float], iters: int, name: str, extras: dict, cputime: bool = False,
             skip: int = 0) -> dict:
    doc = dict(head)
    doc["version"] = JSON_FILE_VERSION
    doc["config"] = {**nccl_config, "devices": [device_json(d) for d in devices]}
    doc["results"] = [row_json(r, iters, name, cputime, skip) for r in rows if r.impl == subject]
    wrong = report.total_wrong(rows)
    avg = report.avg_busbw(rows, subject)
    doc["out_of_bounds"] = {"count": wrong, "okay": tf(wrong == 0)}
    doc["average_bus_bandwidth"] = {
        "bandwidth": avg,
        "okay": "unchecked" if min_busbw is None else tf(not report.busbw_gate_failed(avg, min_busbw)),
    }
    doc["errors"] = []
    doc["end_time"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    doc["extras"] = {
        **extras,
        "results": [extra_row_json(r) for r in rows],
        "average_bus_bandwidth_impl": subject,
        "average_bus_bandwidth_by_impl": {i: report.avg_busbw(rows, i) for i in report.impl_order(rows)},
        "min_busbw": min_busbw,
    }
    return doc
