"""Speed baseline: single-instance blackbox replays of 10k and 100k requests.

For each size this script writes a TraceV2 workload (Llama-3.1-8B blackbox coefficients on
one H100, arrivals at a constant rate, 36 req/s, at which 50-60 requests run at once), then
replays it in a fresh child process exactly as ``blis-simpy replay ... --format json``
would, and reports:

* requests per wall-second of the whole replay (trace parsing, token synthesis, simulation,
  report) and of the simulation alone;
* peak resident memory of the child (``ru_maxrss``), in MB and KB per request;
* the mean running-batch size actually reached.

``--front-end server|client`` puts an API server in front of the instance (:data:`FRONT_END`
costs, docs/frontend.md) and measures latencies there.

Usage: ``python bench/bench_replay.py [--sizes 10000,100000] [--rate 36] [--front-end MODE]``.
Wall times depend on the machine and its load; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALPHA = "232.46191091038054,1.752360364195244,3357.4400353290152"
BETA = "5752.705191348184,17.25086436834028,5.999143920128404"
KV_BLOCKS = 200_000
#: ``--front-end``: the API server's costs, µs (docs/frontend.md)
FRONT_END = "frontend: {request_us: 300, input_token_us: 0.5, step_output_us: 400, output_token_us: 20, network_us: 100}\n"


def write_workload(prefix: Path, n: int, rate: float, seed: int = 7) -> None:
    """``n`` requests at ``rate`` req/s: prompts 100–700 tokens (1 in 4 with a 256-token
    shared prefix from 8 groups), outputs 50–350 tokens."""
    import numpy as np

    from blis_simpy.workload import TraceHeader, TraceRecord, write_trace

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        grouped = rng.random() < 0.25
        rows.append(TraceRecord(
            request_id=i, prefix_group=f"g{int(rng.integers(8))}" if grouped else "",
            prefix_length=256 if grouped else 0, input_tokens=int(rng.integers(100, 700)),
            output_tokens=int(rng.integers(50, 350)), arrival_time_us=int(i * 1e6 / rate),
            send_time_us=int(i * 1e6 / rate)))
    write_trace(str(prefix), TraceHeader(trace_version=2, mode="generated", workload_seed=seed), rows)


def child(header: str, data: str, front_end: str = "") -> None:
    """Run one replay in this process and print timings as JSON; ``front_end``: "" (none),
    ``server`` or ``client``."""
    t0 = time.perf_counter()
    from blis_simpy import run
    from blis_simpy.metrics.report import render_json

    numbers = lambda text: [float(x) for x in text.split(",")]  # noqa: E731
    overrides = {"model": "meta-llama/llama-3.1-8b-instruct",
                 "latency": {"model": "blackbox", "alpha_coeffs": numbers(ALPHA),
                             "beta_coeffs": numbers(BETA)},
                 "engine.total_kv_blocks": KV_BLOCKS,
                 "workload": {"kind": "trace", "header": header, "data": data},
                 "horizon_us": 2**62}
    scenario: str | dict = {}
    if front_end:
        scenario = str(Path(header).with_name("front_end.yaml"))
        Path(scenario).write_text(FRONT_END)
        overrides["metrics.measured_at"] = front_end
    desc = run.prepare(scenario, overrides, mode="replay")
    t1 = time.perf_counter()
    out = run.execute(desc)
    t2 = time.perf_counter()
    render_json(out.report)
    t3 = time.perf_counter()
    m = out.result.instances[0]
    print(json.dumps({
        "requests": len(out.requests), "completed": m.completed_requests,
        "prepare_s": t1 - t0, "execute_s": t2 - t1, "render_s": t3 - t2, "total_s": t3 - t0,
        "sim_s": out.result.wall_s, "events": out.result.events_processed,
        "steps": m.step_samples, "mean_running": m.running_len_sum / max(m.step_samples, 1),
    }))


def measure(header: Path, data: Path, front_end: str = "") -> dict:
    cmd = [sys.executable, __file__, "--child", str(header), str(data)]
    if front_end:
        cmd += ["--front-end", front_end]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read()
    if status != 0:
        raise SystemExit(f"child failed with status {status}")
    res = json.loads(out)
    res["wall_s"] = wall
    res["peak_rss_mb"] = usage.ru_maxrss / 1024
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rate", type=float, default=36.0, help="arrivals per second")
    ap.add_argument("--front-end", choices=("server", "client"), default="",
                    help="an API server in front of the instance, latencies measured there")
    ap.add_argument("--child", nargs=2, metavar=("HEADER", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child, args.front_end)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(f"{'requests':>9} {'wall s':>8} {'req/s':>8} {'sim s':>7} {'sim req/s':>10} "
          f"{'peak MB':>8} {'KB/req':>7} {'running':>8} {'steps':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            prefix = Path(tmp) / f"bench{n}"
            write_workload(prefix, n, args.rate)
            r = measure(prefix.with_suffix(".yaml"), prefix.with_suffix(".csv"), args.front_end)
            assert r["completed"] == n, r
            print(f"{n:>9} {r['wall_s']:>8.2f} {n / r['wall_s']:>8.0f} {r['sim_s']:>7.2f} "
                  f"{n / r['sim_s']:>10.0f} {r['peak_rss_mb']:>8.0f} "
                  f"{r['peak_rss_mb'] * 1024 / n:>7.1f} {r['mean_running']:>8.1f} {r['steps']:>8}",
                  flush=True)


if __name__ == "__main__":
    main()
