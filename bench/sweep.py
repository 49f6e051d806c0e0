"""Sweep benchmark: a 64-point sweep of 2,000-request runs with ``blis-simpy sweep``.

The quickstart scenario (Llama-3.1-8B, H100, blackbox latency) with 2,000 requests, swept
over rate {5, 10, 20, 40} req/s x instances {1, 2, 4, 8} x 4 seeds = 64 points, run by
``blis-simpy sweep`` in a fresh process on a local Dask cluster (one worker per core) into a
new Parquet dataset. Prints the wall time of the whole command (cluster start-up included),
the CPU seconds the points took on their workers (sum of ``wall_s``) and checks that the
dataset has 64 ``ok`` rows of 2,000 completed requests each. Target (issue 12): under
3 minutes on a 2-core machine.

Usage: ``python bench/sweep.py [--workers N] [--requests 2000] [--keep DIR]``.
Wall times depend on the machine and its load: on a shared machine say so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 180.0

SWEEP = """\
name: bench-64
base: {base}
axes:
  workload.rate: [5, 10, 20, 40]
  cluster.num_instances: [1, 2, 4, 8]
  workload.num_requests: [{requests}]
seeds: [1, 2, 3, 4]
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=None, help="local worker processes (default: cores)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--keep", default=None, help="write the dataset here (default: a temporary folder)")
    args = ap.parse_args()
    script = Path(sys.executable).with_name("blis-simpy")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "blis_simpy"]
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep.yaml"
        sweep.write_text(SWEEP.format(base=REPO / "scenarios" / "quickstart.yaml", requests=args.requests))
        out = Path(args.keep) if args.keep else Path(tmp) / "out"
        argv = [*cmd, "sweep", str(sweep), "--out", str(out), "--format", "json"]
        if args.workers:
            argv += ["--workers", str(args.workers)]
        t0 = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        import pyarrow.dataset as ds
        rows = ds.dataset(str(out), format="parquet").to_table(
            columns=["status", "wall_s", "m.completed_requests"]).to_pylist()
    ok = [r for r in rows if r["status"] == "ok" and r["m.completed_requests"] == args.requests]
    busy = sum(r["wall_s"] for r in rows)
    print(p.stderr.strip())
    print(f"{len(rows)} points ({len(ok)} ok with {args.requests} completed requests) on "
          f"{args.workers or os.cpu_count()} workers: {wall:.1f} s wall for the whole command "
          f"(target < {TARGET_S:.0f} s), {busy:.1f} s of point time on the workers")
    return 0 if len(ok) == len(rows) == 64 and wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
