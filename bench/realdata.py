"""Accuracy against real vLLM: replay measured runs and compare every request's latencies.

``DIR`` holds one folder per measured run (``meta.json`` engine settings, ``requests.jsonl``
per-request timestamps, ``timeseries.csv`` 1 s ticks) and the workload JSONL the runs were
sent (real prompt and output token IDs). For every run and every analytical latency backend
this script builds the scenario with the run's exact engine settings, replays the requests
(arrivals at the server's ``queued_ts`` offsets, real token IDs, so prefix sharing is the
real one) and compares TTFT, TPOT and E2E with the log: mean / p50 / p90 with signed error,
per-request E2E MAPE, and the low-load decode step time against the one the ticks show.

Usage::

    python bench/realdata.py --data DIR [--runs NAME ...] [--backends physics,roofline]
                             [--format table|json|markdown] [--no-timing]
    python bench/realdata.py --cross-validate [--data DIR] [--aggregate-data DIR --hardware GPU
                             --kv-cpu-gib G] [--format markdown|json]

``--cross-validate`` covers both kinds of data — the per-request logs of ``--data`` and the
inference-perf results folders of ``--aggregate-data`` (aggregate metrics only) — and prints,
per run, the ``physics`` backend uncalibrated, with step costs fitted on every run
(in-sample), and fitted without that run (leave-one-run-out); see ``bench/crossval.py``.

Output is deterministic except the wall-time figures (``--no-timing`` leaves them out).
A missing or malformed input file is one line on stderr and exit status 2.
docs/accuracy.md describes the method of every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blis_simpy.calibrate.compare import err_pct as signed_error_pct  # noqa: E402
from blis_simpy.errors import BlisError, ConfigError  # noqa: E402
from blis_simpy.measured.run import MeasuredRun, RealRequest, Settings, Tick  # noqa: E402, F401
from blis_simpy.measured.vllm_log import load_vllm_log  # noqa: E402
from blis_simpy.metrics.percentile import mean, percentile  # noqa: E402

#: backends tried first, in this order, when registered; then every other analytical one
#: physics@default: physics with the physical default set (the "before" of a fitted GPU set)
PREFERRED = ("physics", "physics@default", "trained-physics", "roofline", "trained-roofline", "crossmodel")
LOW_LOAD_MAX_RUNNING = 4
STATS = ("mean", "p50", "p90")
METRICS = ("ttft", "tpot", "e2e")


# ============================================================================ loading
# The reading of a run folder lives in the package (blis_simpy.measured.vllm_log); this
# script only adds the folder-of-runs layout and the comparison.
Run = MeasuredRun


def load_run(data: Path, name: str) -> Run:
    """Read and check one run folder of ``data`` and its workload (timeseries required)."""
    return load_vllm_log(data / name, require_ticks=True)


def run_names(data: Path) -> list[str]:
    if not data.is_dir():
        raise ConfigError("missing folder", file=str(data))
    names = sorted(p.name for p in data.iterdir() if (p / "meta.json").is_file())
    if not names:
        raise ConfigError("no run folder (a folder with a meta.json)", file=str(data))
    return names


# ============================================================================ comparison
@dataclass(frozen=True)
class Stats:
    mean: float
    p50: float
    p90: float


def stats(values: list[float]) -> Stats:
    v = sorted(values)
    return Stats(mean(v), percentile(v, 50), percentile(v, 90))


def mape_pct(sim: dict[str, float], real: dict[str, float]) -> float:
    """Mean over the requests in both of |sim − real| / real × 100."""
    ids = [k for k in real if k in sim and real[k] > 0]
    return mean([abs(sim[k] - real[k]) / real[k] * 100.0 for k in ids]) if ids else float("nan")


def real_metric(reqs: list[RealRequest], metric: str) -> dict[str, float]:
    vals = {r.id: getattr(r, f"{metric}_ms") for r in reqs}
    return {k: v for k, v in vals.items() if v is not None}


@dataclass
class RealStep:
    """The real decode step at low load: ``batch`` running, ``step_ms`` from ``ticks``."""

    batch: int
    step_ms: float
    ticks: list[float]
    low_load: bool               # False: no steady tick with running <= the limit
    context: int = 0             # mean context (tokens) of the requests decoding then
    context_from: str = ""
    log_running: float = 0.0     # mean number of requests the log shows decoding then


def steady_decode_ticks(ticks: list[Tick]) -> list[Tick]:
    """Ticks with no prefill (prompt throughput 0), nothing waiting, tokens generated, and
    the same running count at the start (previous tick) and end: the batch did not change
    during the second, so running / gen_throughput is its step time."""
    return [cur for prev, cur in zip(ticks, ticks[1:], strict=False)
            if cur.prompt_tps == 0 and cur.waiting == 0 and cur.gen_tps > 0
            and cur.running >= 1 and prev.running == cur.running]


def real_decode_step(ticks: list[Tick], max_running: int = LOW_LOAD_MAX_RUNNING) -> RealStep | None:
    """The smallest steady batch (running <= ``max_running``, else the smallest steady batch
    at all); step = batch × ticks / Σ gen_throughput (steps per second inverted)."""
    steady = steady_decode_ticks(ticks)
    low = [t for t in steady if t.running <= max_running]
    pool = low or steady
    if not pool:
        return None
    n = min(t.running for t in pool)
    chosen = [t for t in pool if t.running == n]
    step_ms = n * len(chosen) / sum(t.gen_tps for t in chosen) * 1000.0
    return RealStep(n, step_ms, [t.t_s for t in chosen], bool(low))


def decode_context(run: Run, step: RealStep) -> None:
    """Fill ``step.context``: the mean context of the requests the log shows decoding at the
    middle of the chosen ticks (tick t = the second ending t s after the earliest queued_ts;
    context = input + tokens generated so far at the request's own TPOT); if the log shows
    none, the token-weighted mean decode context of the whole run."""
    ctx, seen = [], 0
    for t in step.ticks:
        now_s = run.q0_s + t - 0.5
        for r in run.requests:
            if r.tpot_ms and r.first_token_s <= now_s < r.last_token_s:
                made = 1 + int((now_s - r.first_token_s) * 1000.0 / r.tpot_ms)
                ctx.append(r.input_toks + min(made, r.output_toks - 1))
                seen += 1
    if ctx:
        step.context = round(mean(ctx))
        step.context_from = "mean context of the requests decoding at those ticks in the log"
        step.log_running = seen / len(step.ticks)
        return
    num = sum(r.output_toks * r.input_toks + r.output_toks * (r.output_toks - 1) / 2 for r in run.requests)
    step.context = round(num / sum(r.output_toks for r in run.requests))
    step.context_from = "token-weighted mean decode context of the run (no request decoding in the log then)"


def model_decode_step_ms(latency, batch: int, context: int, dp: int = 1) -> float:
    """The model's time for one decode step of ``batch`` requests at ``context`` tokens each,
    plus its per-token output processing (what one simulated inter-token gap is), ms. With
    ``dp`` > 1 the requests are spread round-robin over the lockstep ranks."""
    from blis_simpy.latency.base import BatchView

    def view(k: int) -> BatchView:
        v = BatchView(decode_count=k, decode_tokens=k, decode_pi_sum=k * context, size=k)
        v.entries_fn = lambda: iter([(False, context, 1, context)] * k)
        return v
    if dp == 1:
        us = latency.step_time_us(view(batch))
    else:
        us = latency.lockstep_step_time_us([view(batch // dp + (r < batch % dp)) for r in range(dp)])
    return (us + latency.output_token_time_us()) / 1000.0


# ============================================================================ simulation
@dataclass
class BackendResult:
    backend: str
    sim: dict[str, dict[str, float]] = field(default_factory=dict)   # metric -> id -> ms
    kv_blocks: int = 0
    kv_from: str = ""
    max_model_len: int = 0
    step_ms: float = float("nan")        # at the real step's batch and context
    batch1_ms: float = float("nan")
    wall_s: float = 0.0
    completed: int = 0
    notes: list[str] = field(default_factory=list)


def build_scenario(st: Settings, backend: str):
    """``backend`` is a latency model name, optionally ``name@SET`` with a coefficient set
    (``physics@default`` = physics uncalibrated, whatever the GPU's shipped set)."""
    from blis_simpy.config.scenario import EngineConfig, LatencyConfig, Scenario
    backend, _, cset = backend.partition("@")
    eng = EngineConfig(block_size=st.block_size, max_num_running_reqs=st.max_num_seqs,
                       max_num_scheduled_tokens=st.max_num_batched_tokens,
                       max_model_len=st.max_model_len, total_kv_blocks=st.kv_blocks,
                       gpu_memory_utilization=st.gpu_memory_utilization)
    return Scenario(name="realdata", seed=st.seed, model=st.model, hardware=st.hardware, tp=st.tp,
                    dp=st.dp, enable_expert_parallel=st.expert_parallel,
                    latency=LatencyConfig(model=backend, coefficients=cset), engine=eng)


def build_requests(run: Run) -> list:
    """One simulator request per logged request: arrival at its queued_ts offset (µs), the
    real prompt token IDs and the real output token IDs; sorted stably by arrival."""
    from blis_simpy.request import Request
    reqs = [Request(r.id, r.arrival_us, p, o, max_output_len=r.output_toks)
            for r, p, o in zip(run.requests, run.prompts, run.outputs, strict=True)]
    reqs.sort(key=lambda q: q.arrival_us)
    return reqs


def simulate(run: Run, backend: str, step: RealStep | None) -> BackendResult:
    from blis_simpy.deploy.resolve import resolve
    from blis_simpy.run import simulate as run_requests
    st = run.settings
    out = BackendResult(backend)
    scenario = build_scenario(st, backend)
    dep = resolve(scenario, quiet=True)
    out.kv_blocks = dep.total_kv_blocks
    if st.kv_blocks is not None:
        out.kv_from = "meta.json kv_cache.num_gpu_blocks"
    else:
        said = [n for n in dep.notes if "kv_blocks" in n or "KV" in n]
        out.kv_from = "simulator: " + (said[0] if said else "its capacity model")
    out.max_model_len = dep.max_model_len
    out.notes += [w for w in dep.warnings]
    t0 = time.perf_counter()
    _, result = run_requests(scenario, build_requests(run), deployment=dep)
    out.wall_s = time.perf_counter() - t0
    for m in ("ttft", "tpot", "e2e"):
        out.sim[m] = {}
    for im in result.instances:
        done = [k for k in im.e2e]
        out.completed += len(done)
        for k in done:
            out.sim["ttft"][k] = im.ttft[k] / 1000.0
            out.sim["e2e"][k] = im.e2e[k] / 1000.0
            if im.registry[k].output_len > 1:
                out.sim["tpot"][k] = im.itl[k] / 1000.0
    lat = dep.new_latency_model()
    if step is not None:
        out.step_ms = model_decode_step_ms(lat, step.batch, step.context, st.dp)
        out.batch1_ms = model_decode_step_ms(lat, 1, step.context, st.dp)
    return out


def compare(run: Run, res: BackendResult) -> dict:
    """Per metric: real and sim mean/p50/p90 (over the requests both completed) and the signed
    errors; and the per-request E2E MAPE."""
    table = {}
    for m in METRICS:
        real = real_metric(run.requests, m)
        ids = [k for k in real if k in res.sim[m]]
        rs = stats([real[k] for k in ids])
        ss = stats([res.sim[m][k] for k in ids])
        table[m] = {"n": len(ids), "real": rs.__dict__, "sim": ss.__dict__,
                    "err_pct": {s: signed_error_pct(getattr(ss, s), getattr(rs, s)) for s in STATS}}
    table["e2e_mape_pct"] = mape_pct(res.sim["e2e"], real_metric(run.requests, "e2e"))
    return table


# ============================================================================ backends
def backend_list(asked: str | None) -> tuple[list[str], list[str]]:
    """The backends to run and notes on the ones skipped (not registered)."""
    import blis_simpy.latency  # noqa: F401  (registers the built-in backends)
    from blis_simpy.latency.base import LatencyModel
    registered = set(LatencyModel.names())
    if asked:
        want = [b.strip() for b in asked.split(",") if b.strip()]
    else:
        analytical = sorted(n for n in registered
                            if getattr(LatencyModel.lookup(n), "needs_model_config", False))
        want = list(PREFERRED) + [n for n in analytical if n not in PREFERRED]
    run = [b for b in want if b.partition("@")[0] in registered]
    notes = [f"backend {b}: not registered in this build, skipped" for b in want
             if b.partition("@")[0] not in registered]
    return run, notes


# ============================================================================ output
def _f(v: float, nd: int = 1) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def _e(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:+.1f}%"


def settings_line(run: Run) -> str:
    st = run.settings
    mml = f"{st.max_model_len} (meta.json)" if st.max_model_len else "the model's (meta.json: null)"
    return (f"{len(run.requests)} requests; GPU {st.hardware} ({st.hardware_from}); model {st.model} "
            f"({st.model_from}); TP {st.tp}, DP {st.dp}, EP {'on' if st.expert_parallel else 'off'}; "
            f"max_num_running_reqs {st.max_num_seqs}; max_num_scheduled_tokens "
            f"{st.max_num_batched_tokens}; block size {st.block_size}; prefix caching "
            f"{'on' if st.prefix_caching else 'OFF in the run (the simulator always caches)'}; "
            f"max_model_len {mml}")


def step_line(step: RealStep | None, limit: int) -> str:
    if step is None:
        return "real decode step: n/a (no steady decode-only tick)"
    kind = "low-load" if step.low_load else f"no steady tick with running <= {limit}; smallest steady"
    ticks = ", ".join(f"{t:g}" for t in step.ticks)
    return (f"real decode step ({kind}): {step.step_ms:.2f} ms at batch {step.batch} (ticks {ticks}); "
            f"context {step.context} tokens ({step.context_from}"
            + (f", {step.log_running:.1f} decoding per tick in the log" if step.log_running else "") + ")")


def render_table(report: dict, timing: bool) -> str:
    lines = []
    for run in report["runs"]:
        lines += [f"== {run['name']}", run["settings"], run["real_step_text"], *run["notes"]]
        hdr = (f"{'backend':<17}{'metric':<7}" + "".join(
            f"{'real ' + s:>11}{'sim ' + s:>11}{'err':>9}" for s in STATS))
        lines.append(hdr)
        for b in run["backends"]:
            for m in METRICS:
                c = b["compare"][m]
                cells = "".join(f"{_f(c['real'][s]):>11}{_f(c['sim'][s]):>11}{_e(c['err_pct'][s]):>9}"
                                for s in STATS)
                lines.append(f"{b['backend']:<17}{m.upper() + ' ms':<7}{cells}")
            lines.append(f"{'':<17}{b['summary_text']}" + (f"; wall {b['wall_s']:.2f} s" if timing else ""))
            lines += [f"{'':<17}note: {n}" for n in b["notes"]]
        if timing:
            lines.append(f"wall time of the run (all backends): {run['wall_s']:.2f} s")
        lines.append("")
    lines += report["notes"]
    return "\n".join(lines).rstrip() + "\n"


def render_markdown(report: dict, timing: bool) -> str:
    lines = ["| run | backend | TTFT mean | TPOT mean | E2E mean | E2E p90 | E2E MAPE | "
             "decode step (batch n) | batch-1 step |" + (" wall s |" if timing else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if timing else "")]
    for run in report["runs"]:
        for b in run["backends"]:
            c = b["compare"]
            step = run["real_step"]
            st = (f"{_f(b['step_ms'], 2)} vs {_f(step['step_ms'], 2)} ms (n={step['batch']}, "
                  f"{_e(b['step_err_pct'])})" if step else "n/a")
            lines.append(
                f"| {run['name']} | {b['backend']} | {_e(c['ttft']['err_pct']['mean'])} | "
                f"{_e(c['tpot']['err_pct']['mean'])} | {_e(c['e2e']['err_pct']['mean'])} | "
                f"{_e(c['e2e']['err_pct']['p90'])} | {_f(c['e2e_mape_pct'])}% | {st} | "
                f"{_f(b['batch1_ms'], 2)} ms |" + (f" {b['wall_s']:.2f} |" if timing else ""))
    for run in report["runs"]:
        lines += ["", f"**{run['name']}**: {run['settings']}", "", run["real_step_text"], ""]
        lines += ["| backend | metric | " + " | ".join(f"real {s} | sim {s} | err" for s in STATS) + " |",
                  "|---|---|" + "---|---|---|" * len(STATS)]
        for b in run["backends"]:
            for m in METRICS:
                c = b["compare"][m]
                cells = " | ".join(f"{_f(c['real'][s])} | {_f(c['sim'][s])} | {_e(c['err_pct'][s])}"
                                   for s in STATS)
                lines.append(f"| {b['backend']} | {m.upper()} ms | {cells} |")
        lines += [f"- {b['backend']}: {b['summary_text']}" for b in run["backends"]]
        lines += [f"- {n}" for n in run["notes"]]
    lines += ["", *[f"- {n}" for n in report["notes"]]]
    return "\n".join(lines).rstrip() + "\n"


def _clean(o):
    """JSON-safe copy: NaN -> None, floats rounded to 4 decimals."""
    if isinstance(o, float):
        return None if math.isnan(o) else round(o, 4)
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_clean(v) for v in o]
    return o


def bench(data: Path, runs: list[str] | None, backends: str | None,
          max_running: int = LOW_LOAD_MAX_RUNNING) -> dict:
    """Load, replay and compare; returns the report (see the render functions)."""
    names = runs or run_names(data)
    chosen, notes = backend_list(backends)
    loaded = [load_run(data, n) for n in names]       # every file checked before any replay
    report = {"runs": [], "notes": notes}
    for run in loaded:
        step = real_decode_step(run.ticks, max_running)
        if step is not None:
            decode_context(run, step)
        t0 = time.perf_counter()
        entry = {"name": run.name, "settings": settings_line(run), "notes": list(run.notes),
                 "real_step": None if step is None else {
                     "batch": step.batch, "step_ms": step.step_ms, "ticks": step.ticks,
                     "low_load": step.low_load, "context": step.context,
                     "context_from": step.context_from, "log_running": step.log_running},
                 "real_step_text": step_line(step, max_running), "backends": []}
        for b in chosen:
            try:
                res = simulate(run, b, step)
            except BlisError as exc:
                entry["notes"].append(f"backend {b}: failed: {exc}")
                continue
            cmp = compare(run, res)
            step_err = signed_error_pct(res.step_ms, step.step_ms) if step else float("nan")
            text = (f"E2E MAPE {_f(cmp['e2e_mape_pct'])}%; completed {res.completed}/{len(run.requests)}; "
                    f"decode step batch {step.batch if step else '-'} at context "
                    f"{step.context if step else '-'}: model {_f(res.step_ms, 2)} ms vs real "
                    f"{_f(step.step_ms if step else float('nan'), 2)} ms ({_e(step_err)}); model batch-1 "
                    f"{_f(res.batch1_ms, 2)} ms; KV {res.kv_blocks} blocks ({res.kv_from}); "
                    f"max_model_len {res.max_model_len}")
            entry["backends"].append({
                "backend": b, "compare": cmp, "completed": res.completed, "kv_blocks": res.kv_blocks,
                "kv_from": res.kv_from, "max_model_len": res.max_model_len, "step_ms": res.step_ms,
                "step_err_pct": step_err, "batch1_ms": res.batch1_ms, "wall_s": res.wall_s,
                "notes": res.notes, "summary_text": text})
        entry["wall_s"] = time.perf_counter() - t0
        report["runs"].append(entry)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="folder of run folders and the workload JSONL")
    ap.add_argument("--aggregate-data", type=Path,
                    help="folder of inference-perf results folders (--cross-validate only)")
    ap.add_argument("--hardware", default="", help="GPU of the aggregate runs that record none")
    ap.add_argument("--kv-cpu-gib", type=float, default=0.0,
                    help="CPU KV offload the aggregate runs ran with, GiB (default 0)")
    ap.add_argument("--cross-validate", action="store_true",
                    help="in-sample and leave-one-run-out tables of the physics step costs")
    ap.add_argument("--runs", nargs="+", help="run folder names (default: every folder with a meta.json)")
    ap.add_argument("--backends", help="comma-separated latency backends (default: every analytical one)")
    ap.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    ap.add_argument("--max-running", type=int, default=LOW_LOAD_MAX_RUNNING,
                    help="largest running batch counted as low load (default 4)")
    ap.add_argument("--no-timing", action="store_true", help="leave out wall times (fully deterministic)")
    args = ap.parse_args(argv)
    if args.cross_validate:
        return _cross_validate(args)
    if args.data is None:
        ap.error("--data is required (or --cross-validate)")
    try:
        report = bench(args.data, args.runs, args.backends, args.max_running)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    timing = not args.no_timing
    if args.format == "json":
        if not timing:
            for run in report["runs"]:
                run.pop("wall_s", None)
                for b in run["backends"]:
                    b.pop("wall_s", None)
        for run in report["runs"]:
            for b in run["backends"]:
                b.pop("summary_text", None)
        print(json.dumps(_clean(report), indent=2, sort_keys=True))
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(report, timing))
    else:
        sys.stdout.write(render_table(report, timing))
    return 0


def _cross_validate(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import crossval
    if args.data is None and args.aggregate_data is None:
        print("error: --cross-validate needs --data and/or --aggregate-data", file=sys.stderr)
        return 2
    try:
        cases = crossval.per_request_cases(args.data) if args.data else []
        if args.aggregate_data:
            cases += crossval.aggregate_cases(args.aggregate_data, args.hardware, args.kv_cpu_gib)
        report = crossval.cross_validate(
            cases, progress=lambda n, m, s: print(f"{n} {m}: {s:.0f} s", file=sys.stderr, flush=True))
    except (ConfigError, BlisError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(_clean(report), indent=2, sort_keys=True))
    else:
        sys.stdout.write(crossval.render_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
