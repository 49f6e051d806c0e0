"""Speed and memory on six fixed workloads, optionally side by side with the Go BLIS.

Workloads (issue 11's table; sizes are multiplied by ``--scale``):

========== ==========================================================================
name       what runs
========== ==========================================================================
run-10k    ``run``, blackbox, 1 instance, 10,000 requests at 36 req/s
run-100k   the same with 100,000 requests
replay     ``replay`` of a 100,000-request TraceV2 trace written by this script
           (``bench_replay.write_workload``: 36 req/s, a quarter with a shared prefix)
cluster8   ``run``, 8 instances, weighted routing, 50,000 requests at 288 req/s
roofline   ``run``, roofline latency model, 1 instance, 10,000 requests at 36 req/s
pd-2p2d    ``run``, PD disaggregation with 2 prefill + 2 decode instances, every
           request disaggregated, 20,000 requests at 72 req/s
========== ==========================================================================

All use Llama-3.1-8B on one H100 (TP 1); the blackbox ones use the coefficients of
``bench_replay.py`` and 200,000 KV blocks. Generated prompts are 400 ± 150 tokens (100–700),
outputs 200 ± 90 tokens (50–350), seed 42, unbounded horizon.

Each workload is one child process, ``python -m blis_simpy run|replay ... --format json
--results-path F``, so start-up (imports, parsing, report) is included in the wall time; the
peak RSS is the child's ``ru_maxrss`` (``os.wait4``). Only BLIS's own flag names are used, so
the same argument list is given to a Go BLIS binary.

With ``BLIS_BIN=/path/to/blis`` set, every workload also runs through that binary, alternating
ours and Go (``--repeats N`` pairs, the order flipped each pair); the table shows medians and
the ratio of wall times ours / Go. Column ``identical`` compares the results files the two
wrote with ``--results-path``, parsed as JSON (so ``1`` and ``1.0`` are equal):

* ``run``: the metrics block, i.e. the cluster ``MetricsOutput`` object with every key except
  the per-request ``requests`` rows (completed/queued/running counts, token totals, duration,
  throughput, E2E/TTFT/ITL means and percentiles, scheduling delay, preemptions, drops);
* ``replay``: the whole file (the per-request ``request_id, ttft_us, e2e_us, input_tokens,
  output_tokens`` array).

``yes`` means equal; otherwise the differing keys are listed (for replay, the number of rows
that differ). "completed" is taken from the results file (``completed_requests``, or the row
count for replay) and must equal "requests".

Usage::

    python bench/compare.py [--only run-10k,replay] [--scale 0.1] [--repeats 3]

Wall times depend on the machine and its load; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_replay import ALPHA, BETA, KV_BLOCKS, write_workload  # noqa: E402

MODEL = ["--model", "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1",
         "--seed", "42"]
BLACKBOX = ["--latency-model", "blackbox", "--alpha-coeffs", ALPHA, "--beta-coeffs", BETA,
            "--total-kv-blocks", str(KV_BLOCKS)]
SHAPE = ["--prompt-tokens", "400", "--prompt-tokens-stdev", "150", "--prompt-tokens-min", "100",
         "--prompt-tokens-max", "700", "--output-tokens", "200", "--output-tokens-stdev", "90",
         "--output-tokens-min", "50", "--output-tokens-max", "350"]
REPLAY_RATE = 36.0
HORIZON = str(2**62)


@dataclass(frozen=True)
class Workload:
    """One row of the table: ``command`` (run or replay), full-size request count, and the
    workload-specific BLIS flags (for ``run`` the arrival rate, in requests/s, is among them)."""

    name: str
    label: str
    command: str
    requests: int
    flags: tuple[str, ...]


WORKLOADS = (
    Workload("run-10k", "run, blackbox, 1 instance", "run", 10_000,
             (*BLACKBOX, "--rate", "36")),
    Workload("run-100k", "run, blackbox, 1 instance", "run", 100_000,
             (*BLACKBOX, "--rate", "36")),
    Workload("replay", "replay of a trace (blackbox)", "replay", 100_000, tuple(BLACKBOX)),
    Workload("cluster8", "run, 8 instances, weighted", "run", 50_000,
             (*BLACKBOX, "--num-instances", "8", "--routing-policy", "weighted",
              "--rate", "288")),
    Workload("roofline", "run, roofline, 1 instance", "run", 10_000,
             ("--latency-model", "roofline", "--rate", "36")),
    Workload("pd-2p2d", "run, PD 2P2D, blackbox", "run", 20_000,
             (*BLACKBOX, "--num-instances", "4", "--prefill-instances", "2",
              "--decode-instances", "2", "--pd-decider", "always", "--rate", "72")),
)


#: against the Go binary ours runs BLIS's semantics where our defaults follow vLLM instead
#: (docs/engine.md: async scheduling; docs/kv-cache.md: recompute preemption), so both do the
#: same work and the results can be compared
OURS_PARITY = ["--async-scheduling=false", "--preemption-model", "blis", "--step-model", "blis"]


def scaled(n: int, scale: float) -> int:
    """``n`` requests times ``scale``, at least 1."""
    return max(1, round(n * scale))


def arguments(w: Workload, n: int, tmp: Path) -> list[str]:
    """BLIS flags for ``w`` with ``n`` requests (writing the replay trace on first use)."""
    args = [w.command, *MODEL, *w.flags, "--horizon", HORIZON]
    if w.command == "replay":
        prefix = tmp / f"trace{n}"
        if not prefix.with_suffix(".csv").exists():
            write_workload(prefix, n, REPLAY_RATE)
        args += ["--trace-header", str(prefix.with_suffix(".yaml")),
                 "--trace-data", str(prefix.with_suffix(".csv"))]
    else:
        args += [*SHAPE, "--num-requests", str(n)]
    return args


@dataclass
class Sample:
    """One child run: wall seconds (start-up included), CPU seconds (user + system, the
    figure to trust on a busy machine), peak RSS in MB, parsed results file."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    results: object


def measure(cmd: list[str], results: Path, tmp: Path) -> Sample:
    """Run ``cmd`` (its stdout to a file, so a large report never blocks a pipe) and return
    its wall time, peak RSS and the results JSON it wrote."""
    results.unlink(missing_ok=True)
    with open(tmp / "stdout", "wb") as out, open(tmp / "stderr", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*cmd, "--results-path", str(results)], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    if status != 0:
        tail = (tmp / "stderr").read_text(errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (wait status {status}):\n{tail}")
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
                  json.loads(results.read_text()))


def seconds(x: float) -> str:
    """A duration in seconds with at least three significant digits and two decimals:
    0.00412 -> ``0.00412``, 0.5 -> ``0.500``, 12.3456 -> ``12.35``. A fixed two decimals would
    print a child's 0.004 s as ``0.00`` and, below ~0.5 s, disagree by more than 1 % with the
    rate printed beside it (which is computed from the unrounded time)."""
    if not x > 0:
        return f"{x:.2f}"
    return f"{x:.{max(2, 2 - math.floor(math.log10(x)))}f}"


def completed(command: str, results: object) -> int:
    """Requests completed according to a results file."""
    if command == "replay":
        return len(results)
    return int(results["completed_requests"])


def metrics_block(command: str, results: object) -> object:
    """What "identical" compares: run → MetricsOutput without ``requests``; replay → all."""
    if command == "replay":
        return results
    return {k: v for k, v in results.items() if k != "requests"}


def identical(command: str, ours: object, go: object) -> str:
    """``yes``, or which keys (run) / how many rows (replay) differ."""
    a, b = metrics_block(command, ours), metrics_block(command, go)
    if a == b:
        return "yes"
    if command == "replay":
        rows = sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))
        return f"no ({rows} rows differ)"
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return "no (" + ",".join(keys) + ")"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workload names "
                    f"({','.join(w.name for w in WORKLOADS)}); default all")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every request count (e.g. 0.1 for a quick run)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per binary; medians shown")
    args = ap.parse_args(argv)
    names = [s for s in args.only.split(",") if s]
    unknown = set(names) - {w.name for w in WORKLOADS}
    if unknown:
        ap.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    if not args.scale > 0 or args.repeats < 1:
        ap.error("--scale must be > 0 and --repeats >= 1")
    chosen = [w for w in WORKLOADS if not names or w.name in names]
    go_bin = os.environ.get("BLIS_BIN", "")
    if go_bin:
        print(f"A/B against BLIS_BIN={go_bin}, {args.repeats} pair(s) per workload, medians")
    else:
        print("BLIS_BIN not set: ours only (set BLIS_BIN to a Go BLIS binary for ratios)")
    ours_cmd = [sys.executable, "-m", "blis_simpy"]
    head = (f"{'workload':<10} {'requests':>9} {'completed':>9} {'wall s':>8} {'req/s':>8} "
            f"{'CPU s':>7} {'req/CPU s':>9} {'peak MB':>8}")
    if go_bin:
        head += f" {'Go wall s':>9} {'Go CPU s':>8} {'Go MB':>7} {'ours/Go':>7} {'CPU o/G':>7}  identical"
    print(head, flush=True)
    with tempfile.TemporaryDirectory(prefix="blis-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for w in chosen:
            n = scaled(w.requests, args.scale)
            flags = arguments(w, n, tmp)
            ours: list[Sample] = []
            go: list[Sample] = []
            for r in range(args.repeats):
                jobs = [(ours_cmd, ours, "ours", OURS_PARITY if go_bin else [])]
                if go_bin:
                    jobs.append(([go_bin], go, "go", []))
                    if r % 2:
                        jobs.reverse()
                for binary, into, tag, extra in jobs:
                    into.append(measure([*binary, *flags, *extra], tmp / f"{tag}.json", tmp))
            done = completed(w.command, ours[-1].results)
            wall = statistics.median(s.wall_s for s in ours)
            cpu = statistics.median(s.cpu_s for s in ours)
            rss = statistics.median(s.peak_rss_mb for s in ours)
            line = (f"{w.name:<10} {n:>9} {done:>9} {seconds(wall):>8} {n / wall:>8.0f} {seconds(cpu):>7} "
                    f"{n / cpu:>9.0f} {rss:>8.0f}")
            if go_bin:
                go_wall = statistics.median(s.wall_s for s in go)
                go_cpu = statistics.median(s.cpu_s for s in go)
                go_rss = statistics.median(s.peak_rss_mb for s in go)
                same = identical(w.command, ours[-1].results, go[-1].results)
                line += (f" {seconds(go_wall):>9} {seconds(go_cpu):>8} {go_rss:>7.0f} {wall / go_wall:>7.2f} "
                         f"{cpu / go_cpu:>7.2f}  {same}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
