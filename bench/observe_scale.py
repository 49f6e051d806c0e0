"""Peak memory of a long ``observe`` (issue 25 item 2): a generated workload of N requests
sent to the local SSE server of the observe tests (tests/observe/sse_server.py) with its
delays set to 0, so the run is as fast as the two processes allow.

The server runs in this process; ``blis-simpy observe`` runs in a child process ::

    blis-simpy observe --server-url URL --model m --rate R --num-requests N \\
        --prompt-tokens 8 (fixed) --output-tokens 4 (fixed) --max-concurrency 64 \\
        --trace-header H --trace-data D --results J

and the script prints the wall time, requests per wall-second and the child's peak resident
memory (``ru_maxrss`` from ``os.wait4``). Usage::

    python bench/observe_scale.py --sizes 20000,200000
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.observe import sse_server  # noqa: E402


def one(url: str, n: int, rate: float, folder: str) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one observe of ``n`` requests."""
    fixed = lambda flag, v: [flag, str(v), flag + "-stdev", str(v), flag + "-min", str(v),  # noqa: E731
                             flag + "-max", str(v)]
    args = [sys.executable, "-m", "blis_simpy", "observe", "--server-url", url, "--model", "m",
            "--rate", str(rate), "--num-requests", str(n), *fixed("--prompt-tokens", 8),
            *fixed("--output-tokens", 4), "--max-concurrency", "64",
            "--trace-header", f"{folder}/o.yaml", "--trace-data", f"{folder}/o.csv",
            "--results", f"{folder}/o.json"]
    t = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"observe failed ({status})")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20000,200000")
    ap.add_argument("--rate", type=float, default=5000.0)
    a = ap.parse_args()
    sse_server.FIRST_TOKEN_DELAY_S = sse_server.TOKEN_GAP_S = 0.0
    srv = sse_server.SSEServer().start()
    srv.received = collections.deque(maxlen=1)      # the server keeps no request history
    try:
        print("| requests | wall s | req/s | peak RSS |")
        print("|---|---|---|---|")
        for n in map(int, a.sizes.split(",")):
            with tempfile.TemporaryDirectory() as folder:
                wall, mb = one(srv.url, n, a.rate, folder)
            print(f"| {n:,} | {wall:.1f} | {n / wall:,.0f} | {mb:,.0f} MB |", flush=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
