"""``blis-simpy observe``: send a workload to a real OpenAI-compatible server, record timings.

::

    blis-simpy observe --server-url http://127.0.0.1:8000 --model M
                       [--trace-header OUT.yaml --trace-data OUT.csv] [--results OUT.json]
                       [--scenario FILE.yaml | --workload-spec S | --workload NAME | --rate R ...
                        | --input-trace-header H --input-trace-data D]
                       [--api-format completions|chat] [--max-concurrency 256] [--timeout-s 300]
                       [--warmup-requests 0] [--no-streaming] [--api-key K] [--server-type vllm]
                       [--unconstrained-output] [--rtt-ms MS] [--seed 42] [--num-requests N]

The workload is built exactly as ``run`` builds it (same flags, defaults and seed, so the
same flags give the same requests), or replayed from a TraceV2 as ``replay`` does; the
sending is :mod:`blis_simpy.observe`. Output: a TraceV2 pair (mode ``real``), an optional
results JSON, and a summary table on stdout. See docs/cli.md "observe".
"""

from __future__ import annotations

import enum
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

from blis_simpy.atomic import Batch
from blis_simpy.cli import flags as F
from blis_simpy.cli import startup_gc
from blis_simpy.cli.logs import setup_logging
from blis_simpy.errors import ConfigError

#: ``run``'s workload flags that ``observe`` takes (parsed and checked by the flag table)
WORKLOAD_FLAGS = ("--workload-spec", "--workload", "--num-requests", "--prefix-tokens", "--rate",
                  "--prompt-tokens", "--prompt-tokens-stdev", "--prompt-tokens-min",
                  "--prompt-tokens-max", "--output-tokens", "--output-tokens-stdev",
                  "--output-tokens-min", "--output-tokens-max", "--seed", "--horizon")
log = logging.getLogger("blis_simpy.cli")
_SOURCE_FLAGS = tuple(n for n in WORKLOAD_FLAGS if n not in ("--num-requests", "--seed", "--horizon"))


class ApiFormat(str, enum.Enum):
    completions = "completions"
    chat = "chat"


@dataclass
class MeasuredWorkload:
    """The requests to send (sorted by arrival) and where they came from."""

    requests: list
    sessions: object | None          # SessionManager of closed-loop sessions, or None
    seed: int
    spec_path: str                   # the workload-spec file, if any
    model: str                       # the scenario's model as written (not lower-cased)


# ---------------------------------------------------------------------------- workload
def observe_workload(given: dict[str, str], scenario_path: str | None = None,
                     input_trace: tuple[str, str] | None = None, *,
                     before_build: Callable[[str], None] | None = None) -> MeasuredWorkload:
    """Build the requests as ``run`` (or, for a trace, ``replay``) would.

    ``given`` maps the :data:`WORKLOAD_FLAGS` the user passed to their text. A trace (the
    ``input_trace`` pair, or a scenario whose workload is a trace) takes ``--seed`` (token
    IDs), ``--num-requests`` (the first N by arrival) and ``--horizon`` (arrivals before it).
    ``before_build(model)`` (the scenario's model, or "") runs once the flags, the scenario
    and the expected count are checked, before any request is built: up to 10,000,000
    requests take minutes and gigabytes, which a dead server should not cost.
    """
    from blis_simpy.cli import flag_rules, runner
    from blis_simpy.config.loader import Source, load_raw
    from blis_simpy.config.scenario import DistributionWorkload, SpecWorkload, TraceWorkload
    from blis_simpy.observe import MAX_REQUESTS

    data, src = load_raw(scenario_path) if scenario_path is not None else ({}, Source())
    given = dict(given)
    if input_trace is not None:
        for name in _SOURCE_FLAGS:
            if name in given:
                raise ConfigError("cannot be combined with --input-trace-header/--input-trace-data "
                                  "(the trace is the workload)", field=name)
        data["workload"] = {"kind": "trace", "header": input_trace[0], "data": input_trace[1]}
    w = data.get("workload")
    is_trace = isinstance(w, dict) and w.get("kind") == "trace" and not any(n in given for n in _SOURCE_FLAGS)
    trace_limit = flag_rules.parse_flag(F.BY_NAME["--num-requests"], given.pop("--num-requests")) \
        if is_trace and "--num-requests" in given else None
    inv = runner.prepare_data(F.RUN, given, data, src, components=False)
    s = inv.scenario
    w = s.workload
    if w.closed_loop:       # the simulator's closed-loop clients; observe has --max-concurrency
        key = "concurrency" if w.concurrency is not None else "concurrency_stages"
        raise inv.attribute(ConfigError(
            "observe sends the workload at its own arrival times: for a closed loop against a "
            "server use --max-concurrency", field=f"workload.{key}"))
    expected = None
    if isinstance(w, DistributionWorkload):
        expected = w.num_requests or w.rate * s.horizon / 1e6
    elif isinstance(w, SpecWorkload):
        expected = w.num_requests
    if expected is not None and expected > MAX_REQUESTS:
        raise inv.attribute(ConfigError(f"{expected:,.0f} requests is more than observe sends "
                                         f"({MAX_REQUESTS:,})", field="workload.num_requests"))
    model = data.get("model") if isinstance(data.get("model"), str) else ""
    if before_build is not None:
        before_build(model)
    # a generated workload streams: each request is drawn when the sender reaches it
    requests, _, sessions, seed = runner.build_workload(inv, lazy=not isinstance(w, TraceWorkload))
    if isinstance(w, TraceWorkload):
        if s.horizon_us is not None:
            requests = [r for r in requests if r.arrival_us < s.horizon_us]
        if trace_limit:
            requests = requests[:trace_limit]
    if len(requests) > MAX_REQUESTS:
        raise ConfigError(f"{len(requests):,} requests is more than observe sends ({MAX_REQUESTS:,})",
                          field="--num-requests")
    spec_path = w.path if isinstance(w, SpecWorkload) else ""
    return MeasuredWorkload(requests, sessions, seed, spec_path, model)


def session_followups(sessions):
    """``on_done`` for closed-loop sessions: a finished observation's follow-up rounds
    (a timeout cancels the session, an error counts as dropped; docs/workloads.md, "Multi-turn sessions")."""
    from blis_simpy.observe.records import OK, TIMEOUT
    from blis_simpy.request import COMPLETED, DROPPED, TIMED_OUT

    def on_done(o) -> list:
        r = o.request
        r.state = COMPLETED if o.status == OK else TIMED_OUT if o.status == TIMEOUT else DROPPED
        r.pi = r.input_len + o.completion_tokens
        return sessions.on_request_done(r, o.end_us)
    return on_done


# ---------------------------------------------------------------------------- output
def make_trace_header(cfg, *, started_at: str, warmup: int, seed: int, spec_path: str,
                 rtt_ms: float | None):
    """The TraceV2 header of a real trace (``server:`` from the flags)."""
    from blis_simpy.workload.tracev2 import TraceHeader, TraceNetwork, TraceServer
    return TraceHeader(trace_version=2, created_at=started_at, mode="real", warm_up_requests=warmup,
                       workload_seed=seed, workload_spec=spec_path,
                       server=TraceServer(type=cfg.server_type, model=cfg.model),
                       network=TraceNetwork(measured_rtt_ms=rtt_ms) if rtt_ms is not None else None)


def print_summary(failed, cfg, url: str, summary: dict, outputs: list[str]) -> None:
    """The rich summary on stdout (``failed``: the first observation that failed, or None)."""
    from rich.table import Table

    from blis_simpy.cli.tables import stdout_console
    console = stdout_console()
    s = summary
    mode = "streaming" if cfg.streaming else "not streaming"
    console.print(f"[bold]observe[/bold]: {s['requests']} requests to {url} (model {cfg.model}, "
                  f"{cfg.api_format}, {mode}, max {cfg.max_concurrency} in flight): "
                  + (f"{s['warmup_requests']} warm-up, then " if s["warmup_requests"] else "")
                  + f"{s['ok']} ok, {s['errors']} errors, {s['timeouts']} timeouts",
                  highlight=False, soft_wrap=True)
    t = Table(title="latency (ms, successful requests after warm-up)")
    t.add_column("metric")
    for col in ("count", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        m = s[key]
        t.add_row(label, str(m["count"]), *(f"{m[c]:.2f}" for c in ("mean", "p50", "p90", "p99")))
    console.print(t)
    console.print(f"throughput: {s['requests_per_s']:.3f} requests/s, {s['output_tokens_per_s']:.1f} "
                  f"output tokens/s over {s['duration_s']:.3f} s", highlight=False)
    if s["tokens_from_chunks"]:
        console.print(f"note: {s['tokens_from_chunks']} responses had no usage field; their token "
                      "counts are counted chunks", highlight=False)
    if failed is not None:
        console.print(f"first failure: {failed.request.id}: {failed.status}: {failed.error_message}",
                      highlight=False, soft_wrap=True)
    for line in outputs:
        console.print(line, highlight=False, soft_wrap=True)
    sys.stdout.flush()


def _progress_bar():
    """(callback, stop) of a rich progress bar on stderr, or (None, no-op) off a TTY."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    bar = Progress(TextColumn("observing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task("observe", total=None)
    bar.start()
    return (lambda done, total: bar.update(task, completed=done, total=total)), bar.stop


# ---------------------------------------------------------------------------- command
def _wf(name: str):
    f = F.BY_NAME[name]
    return typer.Option(None, name, help=f.help, metavar=f.metavar, show_default=False,
                        rich_help_panel="Workload (as run)")


def register(app: typer.Typer) -> None:
    @app.command("observe")
    def observe_cmd(
        server_url: str = typer.Option(..., "--server-url", help="the server, e.g. http://127.0.0.1:8000"),
        model: str = typer.Option(None, "--model", help="model name the server serves (default: the "
                                                        "scenario's model)"),
        trace_header: Path = typer.Option(None, "--trace-header", metavar="OUT.yaml",
                                          help="write the observed TraceV2 header here"),
        trace_data: Path = typer.Option(None, "--trace-data", metavar="OUT.csv",
                                        help="write the observed TraceV2 rows here"),
        results: Path = typer.Option(None, "--results", metavar="OUT.json",
                                     help="write per-request TTFT/ITL/E2E and a summary here"),
        api_format: ApiFormat = typer.Option(ApiFormat.completions, "--api-format",
                                             help="completions: token-ID prompts to /v1/completions; "
                                                  "chat: synthesised text to /v1/chat/completions"),
        max_concurrency: int = typer.Option(256, "--max-concurrency", help="requests in flight at most"),
        timeout_s: float = typer.Option(300.0, "--timeout-s", help="per-request time limit, seconds"),
        warmup_requests: int = typer.Option(0, "--warmup-requests",
                                            help="the first N requests are warm-up (sent and traced, "
                                                 "left out of the summary)"),
        streaming: bool = typer.Option(True, "--streaming/--no-streaming", help="stream the responses"),
        api_key: str = typer.Option("", "--api-key", help="sent as Authorization: Bearer KEY"),
        server_type: str = typer.Option("vllm", "--server-type",
                                        help="vllm: also send min_tokens and ignore_eos; other: "
                                             "max_tokens only"),
        unconstrained_output: bool = typer.Option(False, "--unconstrained-output",
                                                  help="send no output-length limit"),
        rtt_ms: float = typer.Option(None, "--rtt-ms", help="measured client-server round trip, ms "
                                                            "(recorded in the trace header)"),
        scenario: Path = typer.Option(None, "--scenario", metavar="FILE.yaml",
                                      help="take the workload (and model) of this scenario"),
        input_trace_header: Path = typer.Option(None, "--input-trace-header", metavar="H.yaml",
                                                help="replay this TraceV2's requests (header)"),
        input_trace_data: Path = typer.Option(None, "--input-trace-data", metavar="D.csv",
                                              help="replay this TraceV2's requests (rows)"),
        log_level: str = typer.Option(None, "--log", help="log level (default warn)"),
        workload_spec: str = _wf("--workload-spec"), workload: str = _wf("--workload"),
        num_requests: str = _wf("--num-requests"), prefix_tokens: str = _wf("--prefix-tokens"),
        rate: str = _wf("--rate"), prompt_tokens: str = _wf("--prompt-tokens"),
        prompt_tokens_stdev: str = _wf("--prompt-tokens-stdev"),
        prompt_tokens_min: str = _wf("--prompt-tokens-min"),
        prompt_tokens_max: str = _wf("--prompt-tokens-max"), output_tokens: str = _wf("--output-tokens"),
        output_tokens_stdev: str = _wf("--output-tokens-stdev"),
        output_tokens_min: str = _wf("--output-tokens-min"),
        output_tokens_max: str = _wf("--output-tokens-max"), seed: str = _wf("--seed"),
        horizon: str = _wf("--horizon"),
    ) -> None:
        """Send a workload to a real OpenAI-compatible server (e.g. `vllm serve`) and record
        real timings as a TraceV2 (mode real) plus a results JSON."""
        setup_logging(log_level)
        raw = locals()
        given = {n: raw[F.BY_NAME[n].dest] for n in WORKLOAD_FLAGS if raw.get(F.BY_NAME[n].dest) is not None}
        run_observe(server_url=server_url, model=model, trace_header=trace_header, trace_data=trace_data,
                    results=results, api_format=api_format.value, max_concurrency=max_concurrency,
                    timeout_s=timeout_s, warmup_requests=warmup_requests, streaming=streaming,
                    api_key=api_key, server_type=server_type, unconstrained_output=unconstrained_output,
                    rtt_ms=rtt_ms, scenario=scenario, input_trace_header=input_trace_header,
                    input_trace_data=input_trace_data, given=given)


def run_observe(*, server_url: str, model: str | None, trace_header: Path | None, trace_data: Path | None,
                results: Path | None, api_format: str, max_concurrency: int, timeout_s: float,
                warmup_requests: int, streaming: bool, api_key: str, server_type: str,
                unconstrained_output: bool, rtt_ms: float | None, scenario: Path | None,
                input_trace_header: Path | None, input_trace_data: Path | None, given: dict) -> None:
    """The ``observe`` command: check the flags, build the workload, send it, write outputs."""
    from blis_simpy.observe import ObserveConfig, check_server, endpoint_url, observe
    from blis_simpy.observe.outputs import ObserveOutputs

    pairs = (("--trace-header", trace_header, "--trace-data", trace_data),
             ("--input-trace-header", input_trace_header, "--input-trace-data", input_trace_data))
    for a, pa, b, pb in pairs:
        if (pa is None) != (pb is None):
            have, other = (a, b) if pa is not None else (b, a)
            raise ConfigError(f"must be given together with {other}", field=have)
    for flag, p in (("--trace-header", trace_header), ("--trace-data", trace_data), ("--results", results)):
        if p is not None and not p.resolve().parent.is_dir():   # fail before a long run, not after
            raise ConfigError("the folder does not exist", file=str(p), field=flag)
    if warmup_requests < 0:
        raise ConfigError(f"must be >= 0, got {warmup_requests}", field="--warmup-requests")
    if rtt_ms is not None and not (math.isfinite(rtt_ms) and rtt_ms >= 0):
        raise ConfigError(f"must be finite and >= 0, got {rtt_ms}", field="--rtt-ms")
    inputs = None
    if input_trace_header is not None:
        for flag, p in (("--input-trace-header", input_trace_header), ("--input-trace-data", input_trace_data)):
            if not p.is_file():
                raise ConfigError("no such file", file=str(p), field=flag)
        inputs = (str(input_trace_header), str(input_trace_data))
    cfg_model = model or ""

    def config(model: str) -> ObserveConfig:
        return ObserveConfig(server_url, model, api_format, streaming, max_concurrency, timeout_s,
                             api_key, server_type, unconstrained_output)

    def before_build(scenario_model: str) -> None:
        # the flags, the files and the sizes are checked; the server is next, and only then
        # are the requests built (a dead server answered only after them)
        pre = config(cfg_model or scenario_model)
        pre.check()
        check_server(pre)

    config(cfg_model or "-").check()   # flags first, then files
    wl = observe_workload(given, str(scenario) if scenario is not None else None, inputs,
                          before_build=before_build)
    cfg = config(cfg_model or wl.model)     # the config before_build checked (same model)
    # start-up ends here, before anything is sent: observe never reaches runner.prepare(), and
    # the start-up pause (cli/startup_gc.py) would otherwise last through the sending, with
    # generation-0 passes over ~100,000 objects stalling the event loop while it times chunks
    startup_gc.resume()
    # every output is staged before the first request and filled as the requests finish;
    # the trace pair and --results land together at the end, or none does (docs/cli.md)
    files = ObserveOutputs(Batch(), trace_paths=(trace_header, trace_data) if trace_header else None,
                           results=results, streaming=streaming, api_format=api_format,
                           warmup_requests=warmup_requests)
    progress, stop = _progress_bar()
    try:
        try:
            run = observe(wl.requests, cfg, progress=progress, record=files.add,
                          on_done=session_followups(wl.sessions) if wl.sessions is not None else None)
        finally:
            stop()
        if api_format == "completions" and trace_header is not None and files.held is None:
            log.warning("the trace leaves out input_token_ids: more prompt tokens than a "
                        "TraceV2 file may carry")
        header = make_trace_header(cfg, started_at=run.started_at, warmup=warmup_requests,
                                   seed=wl.seed, spec_path=wl.spec_path, rtt_ms=rtt_ms)
        url = endpoint_url(server_url, api_format)
        info = {"server_url": server_url, "endpoint": url, "model": cfg.model, "api_format": api_format,
                "streaming": streaming, "server_type": server_type, "max_concurrency": max_concurrency,
                "timeout_s": timeout_s, "unconstrained_output": unconstrained_output,
                "started_at": run.started_at, "duration_us": run.duration_us, "workload_seed": wl.seed}
        summary = files.finish(header=header, run=info)
        files.batch.commit()
    except BaseException:
        files.abort()        # nothing staged is left behind
        raise
    outputs = [f"trace: {trace_header} + {trace_data}"] if trace_header is not None else []
    if results is not None:
        outputs.append(f"results: {results}")
    print_summary(files.first_failure, cfg, url, summary, outputs)
