"""Start-up benchmark: ``blis-simpy --help``, ``--version``, a 1-request replay (the start-up
alone: imports, configuration, reading the trace) and a 300-request replay, each in a fresh
child process, N times in alternation; prints the median wall time, the median
CPU time (user + system, from ``wait4``) and the minimum wall time per case.

The replays are the single-instance blackbox replay of bench/bench_replay.py (Llama-3.1-8B
blackbox coefficients, 200,000 KV blocks) on TraceV2 files of 1 and 300 requests written by
its ``write_workload``, printed with ``--format json``: at 300 requests most of the time is
start-up (imports and configuration), not simulation; the 1-request replay shows how much.
The interpreter alone (``python -c pass``) is shown as the floor. Target (issue 11):
``--help`` and the 300-request replay under 0.3 s wall each. The children run with bytecode
caching on (one warm-up run per case writes the ``.pyc`` files an installed package would have).

Usage: ``python bench/startup.py [--runs 11] [--requests 300] [--source DIR]``;
``make bench-startup``.
Wall times depend on the machine and its load: on a shared machine compare CPU times too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import ALPHA, BETA, KV_BLOCKS, write_workload  # noqa: E402

TARGET_S = 0.3


def blis_command(source: str | None) -> list[str]:
    """``python -m blis_simpy`` for a ``source`` checkout (see :data:`CHILD_ENV`), else the
    installed ``blis-simpy`` script beside this interpreter (or ``python -m blis_simpy``)."""
    script = Path(sys.executable).with_name("blis-simpy")
    if source is None and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "blis_simpy"]


def replay_command(blis: list[str], prefix: Path) -> list[str]:
    """The benchmark replay of the trace at ``prefix`` (``.yaml`` header, ``.csv`` data)."""
    return blis + [
        "replay", "--trace-header", str(prefix.with_suffix(".yaml")),
        "--trace-data", str(prefix.with_suffix(".csv")),
        "--model", "meta-llama/llama-3.1-8b-instruct", "--latency-model", "blackbox",
        "--alpha-coeffs", ALPHA, "--beta-coeffs", BETA, "--total-kv-blocks", str(KV_BLOCKS),
        "--format", "json"]


def cases(prefixes: list[Path], source: str | None) -> dict[str, list[str]]:
    """The timed command lines: the interpreter, ``--help``, ``--version`` and one replay per
    trace in ``prefixes`` (named after the trace: ``replay w300``)."""
    blis = blis_command(source)
    out = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "blis-simpy --help": blis + ["--help"],
        "blis-simpy --version": blis + ["--version"],
    }
    for prefix in prefixes:
        out[f"replay {prefix.name}"] = replay_command(blis, prefix)
    return out


#: the children may write .pyc files (an installed package has them; with
#: PYTHONDONTWRITEBYTECODE set, every edited module would be compiled again on each run).
#: With ``--source DIR``, PYTHONPATH=DIR is added so that DIR's blis_simpy is the one imported.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float] | str:
    """(wall s, CPU s) of one child (its output discarded), or why it failed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            cwd=env.get("PYTHONPATH"))   # -m puts the cwd first on sys.path
    err = proc.stderr.read().decode(errors="replace")   # small: error lines only
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.stderr.close()
    if status != 0:
        lines = [t for t in (ln.strip("│╭╮╰╯─ ") for ln in err.splitlines()) if t and t != "Error"]
        return f"failed (status {status >> 8}): {lines[-1] if lines else ''}"
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="runs per case (median reported)")
    ap.add_argument("--requests", type=int, default=300, help="requests in the replayed trace")
    ap.add_argument("--source", metavar="DIR", help="time the blis_simpy package of this checkout "
                    "(python -m blis_simpy with PYTHONPATH=DIR), e.g. a git worktree of an older commit")
    args = ap.parse_args()
    if not 1 <= args.runs <= 1000 or not 1 <= args.requests <= 1_000_000:
        raise SystemExit("--runs must be in [1, 1000] and --requests in [1, 1000000]")
    with tempfile.TemporaryDirectory() as tmp:
        prefixes = []
        for n in sorted({1, args.requests}):     # 1 request: the start-up alone
            prefixes.append(Path(tmp) / f"w{n}")
            write_workload(prefixes[-1], n, 36.0)
        env = dict(CHILD_ENV)
        if args.source and not (Path(args.source) / "blis_simpy" / "__init__.py").is_file():
            raise SystemExit(f"--source {args.source}: no blis_simpy package there")
        if args.source:
            env["PYTHONPATH"] = str(Path(args.source).resolve())
        todo = cases(prefixes, args.source)
        failed: dict[str, str] = {}
        for name, cmd in todo.items():      # one warm-up each (page cache, .pyc files)
            got = run_once(cmd, env)
            if isinstance(got, str):
                failed[name] = got
        walls: dict[str, list[float]] = {k: [] for k in todo if k not in failed}
        cpus: dict[str, list[float]] = {k: [] for k in walls}
        for _ in range(args.runs):          # alternate the cases so load drifts hit each alike
            for name in walls:
                got = run_once(todo[name], env)
                if isinstance(got, str):
                    raise SystemExit(f"{name}: {got}")
                walls[name].append(got[0])
                cpus[name].append(got[1])
    print(f"{'case':<24} {'median wall ms':>15} {'median CPU ms':>14} {'min wall ms':>12}  "
          f"(runs: {args.runs}, target < {TARGET_S * 1000:.0f} ms wall)")
    for name in todo:
        if name in failed:
            print(f"{name:<24} {failed[name]}")
            continue
        print(f"{name:<24} {statistics.median(walls[name]) * 1000:>15.0f} "
              f"{statistics.median(cpus[name]) * 1000:>14.0f} {min(walls[name]) * 1000:>12.0f}")


if __name__ == "__main__":
    main()
