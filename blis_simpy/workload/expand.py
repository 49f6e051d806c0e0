"""Workload sources that become plain clients before generation (docs/workloads.md: cohorts,
inference-perf, ServeGen).

* :func:`expand_cohorts` — a cohort of ``population`` identical clients, with the lifecycle
  windows of its diurnal / spike / drain patterns;
* :func:`expand_inference_perf` — inference-perf stages and shared prefixes;
* :func:`load_servegen` — a ServeGen chunk directory.

Each returns clients (:class:`~blis_simpy.workload.spec.ClientSpec`) that the generator
treats like written ones. Nothing here draws random numbers. Times are integer µs unless a
name says ``_s`` (seconds); rates are requests per second.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re

from blis_simpy.bounds import MAX_TOKENS
from blis_simpy.errors import ConfigError
from blis_simpy.infile import json_loads, open_input
from blis_simpy.workload.spec import (
    ArrivalSpec,
    ClientSpec,
    CohortSpec,
    DistSpec,
    DiurnalSpec,
    DrainSpec,
    LifecycleSpec,
    MultiTurnSpec,
    ReasoningSpec,
    SpikeSpec,
    WindowSpec,
    WorkloadSpecV2,
)

log = logging.getLogger(__name__)

HOUR_US = 3_600_000_000
DRAIN_SEGMENTS = 10

# ----------------------------------------------------------------------------- cohorts


def diurnal_factor(hour: int, peak_hour: int, ratio: float) -> float:
    """``m(h) = (1 + cos(2π(h − peak)/24))/2 · (1 − 1/R) + 1/R``: 1 at the peak hour,
    ``1/R`` twelve hours away."""
    return (1.0 + math.cos(2.0 * math.pi * (hour - peak_hour) / 24.0)) / 2.0 * (1.0 - 1.0 / ratio) \
        + 1.0 / ratio


def diurnal_windows(d: DiurnalSpec) -> list[tuple[int, int]]:
    """24 windows: hour ``h`` is active for ``int(3600 s × m(h))`` µs (at least 1) from its
    start. [QUIRK, docs/workloads.md "Cohorts"] only the first 24 h are covered: no arrivals afterwards."""
    out = []
    for h in range(24):
        start = h * HOUR_US
        active = max(1, int(HOUR_US * diurnal_factor(h, d.peak_hour, d.peak_to_trough_ratio)))
        out.append((start, start + active))
    return out


def spike_windows(s: SpikeSpec) -> list[tuple[int, int]]:
    """One window ``[start, start + duration)``."""
    return [(s.start_time_us, s.start_time_us + s.duration_us)]


def drain_windows(d: DrainSpec) -> list[tuple[int, int]]:
    """``[0, start)`` if start > 0, then 10 segments of ``ramp // 10`` µs whose active part
    shrinks 10/10, 9/10, …, 1/10 (``segment · (10 − i) // 10`` µs). Nothing after the ramp."""
    out = [(0, d.start_time_us)] if d.start_time_us > 0 else []
    seg = d.ramp_duration_us // DRAIN_SEGMENTS
    for i in range(DRAIN_SEGMENTS):
        start = d.start_time_us + i * seg
        out.append((start, start + seg * (DRAIN_SEGMENTS - i) // DRAIN_SEGMENTS))
    return out


def cohort_windows(c: CohortSpec) -> list[tuple[int, int]] | None:
    """The concatenated windows of a cohort's patterns (diurnal, spike, drain), or None
    when it has none (always active). A client is active inside any of the windows."""
    if c.diurnal is None and c.spike is None and c.drain is None:
        return None
    out: list[tuple[int, int]] = []
    if c.diurnal is not None:
        out += diurnal_windows(c.diurnal)
    if c.spike is not None:
        out += spike_windows(c.spike)
    if c.drain is not None:
        out += drain_windows(c.drain)
    return out


def expand_cohort(c: CohortSpec) -> list[ClientSpec]:
    """``population`` clients ``<id>-<j>`` (j = 0 …), each with ``rate_fraction /
    population``; the prefix length is the default (50 tokens when a group is set); no
    timeout, multimodal or reasoning."""
    windows = cohort_windows(c)
    life = (LifecycleSpec(windows=[WindowSpec(start_us=s, end_us=e) for s, e in windows])
            if windows is not None else None)
    frac = c.rate_fraction / c.population
    return [ClientSpec(id=f"{c.id}-{j}", tenant_id=c.tenant_id, slo_class=c.slo_class,
                       model=c.model, rate_fraction=frac, arrival=c.arrival,
                       input_distribution=c.input_distribution,
                       output_distribution=c.output_distribution, prefix_group=c.prefix_group,
                       streaming=c.streaming, lifecycle=life)
            for j in range(c.population)]


def expand_cohorts(cohorts: list[CohortSpec]) -> list[ClientSpec]:
    """Every cohort's clients, in cohort order."""
    out: list[ClientSpec] = []
    for c in cohorts:
        out += expand_cohort(c)
    return out


# ----------------------------------------------------------------------------- inference-perf


def stage_durations_us(ip) -> list[int]:
    """Each inference-perf stage's duration in integer µs (``int(duration · 1e6)``); the stages
    run one after another."""
    return [int(st.duration * 1e6) for st in ip.stages]


def expand_inference_perf(spec: WorkloadSpecV2) -> WorkloadSpecV2:
    """Replace the ``inference_perf`` section by its clients (docs/workloads.md, "inference-perf").

    ``N × M`` clients per stage (N system prompts, M users each), all SLO ``batch``, poisson,
    constant input ``question_len`` and output ``output_len``, tenant and prefix group
    ``prompt-<p>`` with prefix length ``system_prompt_len``. One stage: IDs
    ``prompt-<p>-user-<u>``, fraction ``1/(N·M)``, aggregate rate = the stage rate. Several:
    IDs ``stage-<s>-prompt-<p>-user-<u>``, fraction ``rate/(N·M)``, each stage active only in
    its window (consecutive windows of ``int(duration · 1e6)`` µs), aggregate = Σ rates. A
    given ``aggregate_rate`` that differs is overridden with a warning. Multi-turn chat adds
    single-session reasoning clients (category ``reasoning``) with ``max_rounds =
    ceil(rate · duration / (N·M))`` and ``think_time_us = int(N·M / rate · 1e6)``.
    """
    ip = spec.inference_perf
    sp = ip.shared_prefix
    n, m = sp.num_unique_system_prompts, sp.num_users_per_system_prompt
    nm = n * m
    several = len(ip.stages) > 1
    total = sum(st.rate for st in ip.stages)
    clients: list[ClientSpec] = []
    offset = 0
    for s, (st, dur) in enumerate(zip(ip.stages, stage_durations_us(ip), strict=True)):
        life = LifecycleSpec(windows=[WindowSpec(start_us=offset, end_us=offset + dur)]) if several else None
        offset += dur
        reasoning = None
        if sp.enable_multi_turn_chat:
            reasoning = ReasoningSpec(
                reason_ratio_distribution=DistSpec(type="constant", params={"value": 0.0}),
                multi_turn=MultiTurnSpec(max_rounds=max(1, math.ceil(st.rate * st.duration / nm)),
                                         think_time_us=int(nm / st.rate * 1e6),
                                         context_growth="", single_session=True))
        frac = st.rate / nm if several else 1.0 / nm
        for p in range(n):
            for u in range(m):
                cid = f"prompt-{p}-user-{u}" if not several else f"stage-{s}-prompt-{p}-user-{u}"
                clients.append(ClientSpec(
                    id=cid, tenant_id=f"prompt-{p}", slo_class="batch", rate_fraction=frac,
                    arrival=ArrivalSpec(process="poisson"),
                    input_distribution=DistSpec(type="constant", params={"value": float(sp.question_len)}),
                    output_distribution=DistSpec(type="constant", params={"value": float(sp.output_len)}),
                    prefix_group=f"prompt-{p}", prefix_length=sp.system_prompt_len,
                    lifecycle=life, reasoning=reasoning))
    if spec.aggregate_rate > 0 and spec.aggregate_rate != total:
        log.warning("inference_perf: aggregate_rate %g is overridden by the stage rates (%g req/s)",
                    spec.aggregate_rate, total)
    upd = {"clients": clients, "inference_perf": None, "aggregate_rate": total}
    if sp.enable_multi_turn_chat:
        upd["category"] = "reasoning"
    return spec.model_copy(update=upd)


# ----------------------------------------------------------------------------- ServeGen

_TRACE_FILE = re.compile(r"^chunk-(.+)-trace\.csv$")
_PY_DICT_ITEM = re.compile(r"([-+]?[0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*:\s*"
                           r"(?:np\.float64\()?\s*([-+]?(?:[0-9]*\.)?[0-9]+(?:[eE][-+]?[0-9]+)?)")


def _servegen_dir(path: str, base_dir: str | None) -> str:
    """The chunk directory: as given (relative to the working directory, like BLIS), else
    relative to ``base_dir`` (the workload-spec file's folder)."""
    if os.path.isdir(path) or os.path.isabs(path) or not base_dir:
        cand = path
    else:
        cand = os.path.join(base_dir, path)
    if not os.path.isdir(cand):
        raise ConfigError(f"no such directory: {path}", field="servegen_data.path")
    return cand


def _trace_rows(path: str) -> tuple[list[tuple[float, float, float, str, int]], tuple[int, str] | None]:
    """``(start_s, rate, cv, pattern, line)`` rows, and the line and problem of the first bad
    row; bad rows are skipped with a warning (a first row that is not numeric is taken as a
    header, silently)."""
    rows = []
    first_bad = None
    try:
        with open_input(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            for i, rec in enumerate(reader):
                if not rec or all(not x.strip() for x in rec):
                    continue
                try:
                    if len(rec) < 4:
                        raise ValueError(f"{len(rec)} columns, need 4")
                    start, rate, cv = (float(x) for x in rec[:3])
                    if not (math.isfinite(start) and math.isfinite(rate)):
                        raise ValueError("start and rate must be finite")
                except ValueError as exc:
                    if i > 0 or _is_number(rec[0] if rec else ""):
                        log.warning("%s:%d: skipping bad ServeGen row (%s)", path, reader.line_num, exc)
                        first_bad = first_bad or (reader.line_num, str(exc))
                    continue
                rows.append((start, rate, cv, rec[3].strip(), reader.line_num))
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError as exc:   # raised by the reader's iteration, outside the row's try
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=path) from None
    except csv.Error as exc:            # e.g. a field over the csv module's size limit
        raise ConfigError(f"not CSV: {exc}", file=path) from None
    return rows, first_bad


def _is_number(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def parse_py_dict(text: str) -> dict[str, float]:
    """A ServeGen PDF string (a Python dict literal, ``"{128: 0.5, 256: 0.5}"``) as
    ``{"token_count": probability}``."""
    return {k: float(v) for k, v in _PY_DICT_ITEM.findall(text)}


def _in_span(t: float, start: float, end: float) -> bool:
    return t >= start and (end <= 0 or t < end)


def _first_window(path: str, span_start: float, span_end: float):
    """The input and output PDFs of the first dataset window (by start time) inside the
    span that has both strings, or None."""
    try:
        with open_input(path, encoding="utf-8-sig") as f:
            data = json_loads(f.read())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cannot read ServeGen dataset: not JSON: {exc.msg}", file=path,
                          line=exc.lineno) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read ServeGen dataset: {exc}", file=path) from None
    except RecursionError:
        raise ConfigError("cannot read ServeGen dataset: JSON nested too deeply", file=path) from None
    if not isinstance(data, dict):
        raise ConfigError("a ServeGen dataset must be a JSON object of windows", file=path)
    keyed = []
    for k, v in data.items():
        try:
            keyed.append((float(k), k, v))
        except ValueError:
            log.warning("%s: skipping window %r (not a start time in seconds)", path, k)
    for t, key, v in sorted(keyed, key=lambda x: x[0]):
        if not _in_span(t, span_start, span_end) or not isinstance(v, dict):
            continue
        a, b = v.get("input_tokens"), v.get("output_tokens")
        if isinstance(a, str) and isinstance(b, str) and a and b:
            pin, pout = parse_py_dict(a), parse_py_dict(b)
            if pin and pout:
                for which, pdf in (("input_tokens", pin), ("output_tokens", pout)):
                    _check_token_cap(pdf, path, f"{key}.{which}")
                return pin, pout
    return None


def _check_token_cap(pdf: dict[str, float], path: str, field: str) -> None:
    """Every token count of a PDF at most :data:`~blis_simpy.bounds.MAX_TOKENS`, the cap a
    workload spec's empirical keys are held to when it is run (converting one past it wrote
    a spec that ``run`` then refused)."""
    over = next((k for k in pdf if float(k) > MAX_TOKENS), None)
    if over is not None:
        raise ConfigError(f"token count {over} is more than {MAX_TOKENS} tokens (2^24), the cap of "
                          "every token count", file=path, field=field)


def _arrival(pattern: str, cv: float) -> ArrivalSpec:
    """gamma / weibull with the row's cv if the pattern names them, else poisson. A cv the
    process cannot use (not finite > 0; weibull outside [0.01, 10.4]) falls back to poisson."""
    p = pattern.lower()
    proc = "gamma" if "gamma" in p else "weibull" if "weibull" in p else "poisson"
    if proc == "poisson":
        return ArrivalSpec(process="poisson")
    ok = math.isfinite(cv) and cv > 0 and (proc == "gamma" or 0.01 <= cv <= 10.4)
    if not ok:
        log.warning("ServeGen pattern %r with cv %g: using poisson", pattern, cv)
        return ArrivalSpec(process="poisson")
    return ArrivalSpec(process=proc, cv=cv)


def load_servegen(spec: WorkloadSpecV2, base_dir: str | None = None) -> WorkloadSpecV2:
    """Replace the ``servegen_data`` section by one client per usable chunk (docs/workloads.md, "ServeGen").

    Per ``chunk-<id>-trace.csv`` (sorted file names): the row with the highest rate whose
    ``start_s`` lies in ``[span_start, span_end)`` (0 = open); the chunk is skipped if that
    rate is ≤ 0 or ``chunk-<id>-dataset.json`` has no window in the span with both PDFs.
    Client ``servegen-chunk-<id>``, tenant ``chunk-<id>``, ``rate_fraction = rate``,
    empirical input/output lengths.
    """
    sg = spec.servegen_data
    folder = _servegen_dir(sg.path, base_dir)
    names = sorted(n for n in os.listdir(folder) if _TRACE_FILE.match(n))
    if not names:
        raise ConfigError(f"no chunk-<id>-trace.csv files in {sg.path}", field="servegen_data.path")
    clients: list[ClientSpec] = []
    unusable: list[ConfigError] = []     # why each skipped chunk was skipped, naming its file
    span = f"[{sg.span_start:g}, {sg.span_end:g})" if sg.span_start or sg.span_end else ""
    for name in names:
        cid = _TRACE_FILE.match(name).group(1)
        trace = os.path.join(folder, name)
        rows, first_bad = _trace_rows(trace)
        best = None
        for row in rows:
            if _in_span(row[0], sg.span_start, sg.span_end) and (best is None or row[1] > best[1]):
                best = row
        if best is None or best[1] <= 0:
            if best is not None:
                why = ConfigError(f"the highest rate{' in the span ' + span if span else ''} is "
                                  f"{best[1]:g} req/s, not > 0", file=trace, line=best[4])
            elif rows:
                why = ConfigError(f"no row starts in the span {span}", file=trace)
            elif first_bad:
                why = ConfigError(f"no valid row (the first bad one: {first_bad[1]})", file=trace,
                                  line=first_bad[0])
            else:
                why = ConfigError("no rows", file=trace)
            log.info("ServeGen chunk %s: %s, skipped", cid, why)
            unusable.append(why)
            continue
        dataset = os.path.join(folder, f"chunk-{cid}-dataset.json")
        pdfs = _first_window(dataset, sg.span_start, sg.span_end)
        if pdfs is None:
            why = ConfigError("missing file" if not os.path.lexists(dataset) else
                              f"no window{' in the span ' + span if span else ''} with both "
                              "input_tokens and output_tokens PDFs", file=dataset)
            log.warning("ServeGen chunk %s: %s, skipped", cid, why)
            unusable.append(why)
            continue
        clients.append(ClientSpec(
            id=f"servegen-chunk-{cid}", tenant_id=f"chunk-{cid}", rate_fraction=best[1],
            arrival=_arrival(best[3], best[2]),
            input_distribution=DistSpec(type="empirical", params=pdfs[0]),
            output_distribution=DistSpec(type="empirical", params=pdfs[1])))
    if not clients:     # name the file (and line) that made the first chunk unusable
        first = unusable[0]
        more = f"; none of its {len(unusable)} chunks is usable" if len(unusable) > 1 else ""
        raise ConfigError(f"no usable ServeGen chunk in {sg.path}: {first.problem}{more}",
                          file=first.file, line=first.line)
    return spec.model_copy(update={"clients": clients, "servegen_data": None})
