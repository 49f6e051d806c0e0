"""Scale benchmark (issue 11, "Scale"): replays of very long traces on 8 instances, with peak
memory.

For each size this script streams a TraceV2 workload to a temporary directory (the same
request mix as ``bench/bench_replay.py``: prompts 100–700 tokens, 1 in 4 with a 256-token
prefix shared by one of 8 groups, outputs 50–350 tokens; arrivals at a constant rate that
keeps about 64 requests running per instance), then runs ::

    blis-simpy replay --trace-header H --trace-data D --num-instances 8 --format json \\
        [--streaming-metrics --requests-out FILE]

in a fresh child process and prints the wall time, requests per wall-second and the child's
peak resident memory (``ru_maxrss`` from ``os.wait4``), in MB and KB per request.

``--generated`` runs a generated workload instead, with nothing written first::

    blis-simpy run --num-requests N --rate R --num-instances 8 --format json \\
        --prompt-tokens 400 ... (100-700) --output-tokens 200 ... (50-350) [--streaming-metrics]

(the requests are drawn as the run reaches them, docs/performance.md "Very long runs").

Usage::

    python bench/scale.py --sizes 100000,1000000            # exact metrics
    python bench/scale.py --sizes 1000000 --streaming        # sketches + per-request file
    python bench/scale.py --sizes 10000000 --streaming --generated

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

ROOT = Path(__file__).resolve().parents[1]
ALPHA = "232.46191091038054,1.752360364195244,3357.4400353290152"
BETA = "5752.705191348184,17.25086436834028,5.999143920128404"
KV_BLOCKS = 200_000
INSTANCES = 8
CHUNK = 50_000     # rows generated and written at a time


def write_stream(prefix: Path, n: int, rate: float, seed: int = 7) -> tuple[Path, Path]:
    """Write an ``n``-row trace chunk by chunk (the writer never holds more than
    :data:`CHUNK` rows); returns (header path, data path)."""
    import numpy as np

    from blis_simpy.workload import TraceHeader, TraceRecord
    from blis_simpy.workload.tracev2 import TRACE_COLUMNS
    from blis_simpy.workload.tracev2_write import header_to_yaml, record_to_csv_line

    header = prefix.with_suffix(".yaml")
    data = prefix.with_suffix(".csv")
    header.write_text(header_to_yaml(TraceHeader(trace_version=2, mode="generated",
                                                 workload_seed=seed)))
    rng = np.random.default_rng(seed)
    with open(data, "w", encoding="utf-8", newline="") as fh:
        fh.write(",".join(TRACE_COLUMNS) + "\n")
        for lo in range(0, n, CHUNK):
            m = min(CHUNK, n - lo)
            grouped = rng.random(m) < 0.25
            groups = rng.integers(0, 8, m)
            inp = rng.integers(100, 700, m)
            out = rng.integers(50, 350, m)
            lines = []
            for j in range(m):
                i = lo + j
                t = int(i * 1e6 / rate)
                g = bool(grouped[j])
                lines.append(record_to_csv_line(TraceRecord(
                    request_id=i, prefix_group=f"g{int(groups[j])}" if g else "",
                    prefix_length=256 if g else 0, input_tokens=int(inp[j]),
                    output_tokens=int(out[j]), arrival_time_us=t, send_time_us=t)))
            fh.write("".join(lines))
    return header, data


#: ``--generated``: the request shape of bench/compare.py's ``run`` workloads
SHAPE = ["--prompt-tokens", "400", "--prompt-tokens-stdev", "150", "--prompt-tokens-min", "100",
         "--prompt-tokens-max", "700", "--output-tokens", "200", "--output-tokens-stdev", "90",
         "--output-tokens-min", "50", "--output-tokens-max", "350"]


def command(header: Path | None, data: Path | None, streaming: bool, requests_out: Path | None,
            generated: tuple[int, float] | None = None) -> list[str]:
    """The child's command: a replay of (header, data), or with ``generated`` = (requests,
    rate in req/s) a ``run`` of a generated workload."""
    common = ["--model", "meta-llama/llama-3.1-8b-instruct", "--latency-model", "blackbox",
              "--alpha-coeffs", ALPHA, "--beta-coeffs", BETA,
              "--total-kv-blocks", str(KV_BLOCKS), "--num-instances", str(INSTANCES)]
    if generated is not None:
        n, rate = generated
        cmd = [sys.executable, "-m", "blis_simpy", "run", *common, *SHAPE,
               "--num-requests", str(n), "--rate", str(rate), "--format", "json"]
    else:
        cmd = [sys.executable, "-m", "blis_simpy", "replay", *common,
               "--trace-header", str(header), "--trace-data", str(data),
               "--horizon", str(2**62), "--format", "json"]
    if streaming:
        cmd.append("--streaming-metrics")
    if requests_out is not None:
        cmd += ["--requests-out", str(requests_out)]
    return cmd


def measure(cmd: list[str]) -> dict:
    """Run ``cmd`` in a child; wall seconds, peak RSS (MB) and its JSON output."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode()
    if status != 0:
        raise SystemExit(f"child failed with status {status}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "report": json.loads(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--rate", type=float, default=36.0 * INSTANCES, help="arrivals per second")
    ap.add_argument("--streaming", action="store_true",
                    help="--streaming-metrics (sketch percentiles, requests released)")
    ap.add_argument("--requests-out", choices=("none", "jsonl", "parquet"), default="none",
                    help="also write per-request rows (default none)")
    ap.add_argument("--tmp", default=None, help="directory for the traces (default: system temp)")
    ap.add_argument("--generated", action="store_true",
                    help="run a generated workload of each size instead of replaying a trace")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    mode = "streaming" if args.streaming else "exact"
    print(f"{'requests':>10} {'mode':>9} {'wall s':>9} {'req/s':>7} {'peak MB':>8} {'KB/req':>7} "
          f"{'completed':>10}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            header = data = None
            if not args.generated:
                header, data = write_stream(Path(tmp) / f"scale{n}", n, args.rate)
            rows = None if args.requests_out == "none" else Path(tmp) / f"rows{n}.{args.requests_out}"
            r = measure(command(header, data, args.streaming, rows,
                                (n, args.rate) if args.generated else None))
            done = r["report"]["cluster"]["completed_requests"]
            print(f"{n:>10} {mode:>9} {r['wall_s']:>9.1f} {n / r['wall_s']:>7.0f} "
                  f"{r['peak_rss_mb']:>8.0f} {r['peak_rss_mb'] * 1024 / n:>7.2f} {done:>10}",
                  flush=True)
            if data is not None:
                data.unlink()


if __name__ == "__main__":
    main()
