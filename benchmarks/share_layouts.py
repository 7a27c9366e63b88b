# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One rank's share of a W-rank node on this GPU, beside a single-wave GEMM, for several model layers.

The measurement is the share package (benchmarks/share/, `python benchmarks/share --help`); this script runs it for
one or more model layers and writes share_<layout>.json and share_<layout>.png (GEMM slowdown against side-work HBM
rate, one point per implementation) to --out. Usage:

    python benchmarks/share_layouts.py --out DIR [--layouts llama3-8b-layer,llama3-70b-layer] [--ranks 8]
        [--link-gbps 370] [--runs 31] [--sides ag-share,rs-share,...] [--reduce-max-ctas N] [--reduce-cta-bytes B]
        [--piece-bytes 4M] [--rs-chunk-bytes B] [--order gemm-after-first|side-first] [--incoming-source device|host]
        [--tag NAME]

--order and --incoming-source are the share package's (its docstring says what each measures); --tag names the
output files share_<layout>_<tag>.* so that several settings can be written side by side.

Exit status: non-zero if a share produced a wrong result or a side failed (the others still run).
"""

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
try:
    import nccl_tide  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "pytorch_glue"))


def main(argv=None):
    from share import cli as share
    from share.method import MIN_RUNS, ORDERS
    from share.plan import SOURCES
    from share.sides import DEFAULT_SIDES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="llama3-8b-layer")
    ap.add_argument("--ranks", default="8")
    ap.add_argument("--link-gbps", default="370")
    ap.add_argument("--runs", default=str(MIN_RUNS))
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES))
    ap.add_argument("--reduce-max-ctas", default="0")
    ap.add_argument("--reduce-cta-bytes", default="0", help="the RS share's bytes per reduce CTA (0: the rule's)")
    ap.add_argument("--piece-bytes", default="4M")
    ap.add_argument("--rs-chunk-bytes", default="0", help="the layout's RS chunk (0: the library's)")
    ap.add_argument("--order", default=ORDERS[0], choices=ORDERS)
    ap.add_argument("--incoming-source", default=SOURCES[0], choices=SOURCES)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    status = 0
    for layout in [x for x in a.layouts.split(",") if x]:
        path = os.path.join(a.out, f"share_{layout}" + (f"_{a.tag}" if a.tag else ""))
        args = ["both", "--layout", layout, "--ranks", a.ranks, "--link-gbps", a.link_gbps, "--runs", a.runs,
                "--sides", a.sides, "--reduce-max-ctas", a.reduce_max_ctas, "--reduce-cta-bytes", a.reduce_cta_bytes,
                "--piece-bytes", a.piece_bytes, "--rs-chunk-bytes", a.rs_chunk_bytes,
                "--order", a.order, "--incoming-source", a.incoming_source,
                "-J", path + ".json", "--plot", path + ".png"]
        print(f"=== share {' '.join(args)}", flush=True)
        rc = share.main(args)
        print(f"=== {layout}: exit status {rc}", flush=True)
        status = status or rc
        if os.path.exists(path + ".json"):
            with open(path + ".json") as f:
                res = json.load(f)
            for d in res["sides"]:
                print(share.side_line(d))
    return status


if __name__ == "__main__":
    sys.exit(main())
