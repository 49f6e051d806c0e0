"""Reading the result file of ``vllm bench serve --save-result --save-detailed``.

The file is one JSON object. Per-request arrays (index ``i`` = request ``i``, all of the same
length): ``input_lens`` and ``output_lens`` (tokens), ``ttfts`` (s), ``itls`` (per request the
list of gaps between streamed chunks, s), ``errors`` (empty string = success; optional) and
``start_times`` (per-request send times on the client's monotonic clock, s; optional, newer
vLLM). Run-level keys used: ``model_id``, ``date``, ``request_rate``, ``max_concurrency``,
``num_prompts``.

Send times: from ``start_times`` when present. Without them the file does not say when each
request was sent, and vLLM drew the gaps at random (Poisson/gamma with ``burstiness``), so we
assume evenly spaced sends at ``request_rate`` (request ``i`` at ``i / request_rate`` s) or all
at 0 when the rate is ``inf``; a note on the run says so. With ``max_concurrency`` set the
real sends also waited for a free slot, which no assumption recovers.

Every malformed value is a :class:`ConfigError` naming the file and the field
(``ttfts[12]``). Caps: :data:`MAX_REQUESTS` requests, :data:`MAX_ITLS` ITL entries in all,
:data:`MAX_FILE_BYTES` bytes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import read_json_object
from blis_simpy.measured.run import MeasuredRun, RealRequest, latencies
from blis_simpy.workload.tracev2 import TraceHeader, TraceRecord, TraceServer

MAX_REQUESTS = 1_000_000
MAX_ITLS = 50_000_000
MAX_FILE_BYTES = 2 << 30          # 2 GiB
MAX_ERROR_CHARS = 500             # error messages are cut to this length in the trace
MAX_TOKENS = (1 << 31) - 1        # input_lens / output_lens entries
MAX_SECONDS = 1e9                 # a send-time span, TTFT or summed ITLs (~31 years)


def _is_num(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _read(path: Path) -> dict:
    return read_json_object(path, MAX_FILE_BYTES)


def _rate(data: dict, file: str) -> float:
    """``request_rate``: a number > 0, or inf (``Infinity`` / ``"inf"``); absent = inf."""
    r = data.get("request_rate", math.inf)
    if isinstance(r, str) and r.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or r <= 0:
        raise ConfigError("not a number > 0 or inf", file=file, field="request_rate")
    return float(r)


def _array(data: dict, key: str, file: str, n: int | None, *, required: bool = True) -> list | None:
    v = data.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, list):
        raise ConfigError("missing or not a list (was the run saved with --save-detailed?)",
                          file=file, field=key)
    if n is not None and len(v) != n:
        raise ConfigError(f"{len(v)} entries, expected {n} (one per request, as input_lens)",
                          file=file, field=key)
    return v


def load_vllm_bench(path: str | os.PathLike) -> MeasuredRun:
    """Read a ``vllm bench serve`` result into a :class:`MeasuredRun` (``settings`` None,
    no prompts or outputs, no ticks; ``header``/``records`` the TraceV2 of the run).

    Per request ``i`` (``request_id`` ``i``; rows sorted by send time): ``arrival_time_us`` =
    ``send_time_us`` = its send time minus the earliest one (nearest µs; module docstring);
    a success (empty error) has ``first_chunk_time_us`` = send + TTFT, ``last_chunk_time_us``
    = first + Σ ITL, ``num_chunks`` = len(itls) + 1, status ``ok``; a failure has status
    ``error``, its message (cut to 500 characters), no chunk times. Streaming is true
    (``vllm bench`` streams); ``model`` is left empty (the header's ``server.model`` has it).
    ``requests`` holds the successes with at least one output token."""
    path = Path(path)
    f = str(path)
    data = _read(path)
    ins = _array(data, "input_lens", f, None)
    n = len(ins)
    if not 0 < n <= MAX_REQUESTS:
        raise ConfigError(f"{n} requests (need 1 to {MAX_REQUESTS})", file=f, field="input_lens")
    outs = _array(data, "output_lens", f, n)
    ttfts = _array(data, "ttfts", f, n)
    itls = _array(data, "itls", f, n)
    errors = _array(data, "errors", f, n, required=False) or [""] * n
    starts = _array(data, "start_times", f, n, required=False)
    rate = _rate(data, f)
    n_itl = 0
    for key, arr in (("input_lens", ins), ("output_lens", outs)):
        for i, v in enumerate(arr):
            if type(v) is not int or v < 0:
                raise ConfigError("not an integer >= 0", file=f, field=f"{key}[{i}]")
            if v > MAX_TOKENS:
                raise ConfigError(f"more than {MAX_TOKENS} tokens", file=f, field=f"{key}[{i}]")
    for i in range(n):
        e = errors[i]
        if e is not None and not isinstance(e, str):
            raise ConfigError("not a string", file=f, field=f"errors[{i}]")
        if not (_is_num(ttfts[i]) and ttfts[i] >= 0) and not (e and ttfts[i] is None):
            raise ConfigError("not a finite number >= 0 (s)", file=f, field=f"ttfts[{i}]")
        if ttfts[i] is not None and ttfts[i] > MAX_SECONDS:
            raise ConfigError(f"more than {MAX_SECONDS:g} s", file=f, field=f"ttfts[{i}]")
        if not isinstance(itls[i], list):
            raise ConfigError("not a list of seconds", file=f, field=f"itls[{i}]")
        n_itl += len(itls[i])
        if n_itl > MAX_ITLS:
            raise ConfigError(f"more than {MAX_ITLS} ITL entries in the file", file=f, field=f"itls[{i}]")
        for j, g in enumerate(itls[i]):
            if not (_is_num(g) and g >= 0):
                raise ConfigError("not a finite number >= 0 (s)", file=f, field=f"itls[{i}][{j}]")
        if math.fsum(itls[i]) > MAX_SECONDS:
            raise ConfigError(f"sums to more than {MAX_SECONDS:g} s", file=f, field=f"itls[{i}]")
        if starts is not None and not _is_num(starts[i]):
            raise ConfigError("not a finite number (s)", file=f, field=f"start_times[{i}]")
    if starts is not None and max(starts) - min(starts) > MAX_SECONDS:
        i = max(range(n), key=lambda k: abs(starts[k] - starts[0]))
        raise ConfigError(f"send times span more than {MAX_SECONDS:g} s", file=f, field=f"start_times[{i}]")
    notes = []
    if starts is not None:
        s0 = min(starts)
        send_us = [round((s - s0) * 1e6) for s in starts]
    elif math.isinf(rate):
        send_us = [0] * n
        notes.append("no start_times: request_rate is inf, so every request is taken as sent at 0")
    else:
        send_us = [round(i * 1e6 / rate) for i in range(n)]
        notes.append(f"no start_times: sends assumed evenly spaced at request_rate {rate:g}/s "
                     "(vLLM drew random gaps; the real send times are not in the file)")
    if starts is None and data.get("max_concurrency") not in (None, 0):
        notes.append(f"max_concurrency {data['max_concurrency']}: real sends also waited for a "
                     "free slot; the assumed send times do not")
    records, reqs = [], []
    for i in range(n):
        t = send_us[i]
        err = errors[i] or ""
        if err:
            records.append(TraceRecord(
                request_id=i, streaming=True, input_tokens=ins[i], output_tokens=outs[i],
                arrival_time_us=t, send_time_us=t, status="error",
                error_message=" ".join(err.split())[:MAX_ERROR_CHARS]))
            continue
        first = t + round(ttfts[i] * 1e6)
        last = first + round(math.fsum(itls[i]) * 1e6)
        records.append(TraceRecord(
            request_id=i, streaming=True, input_tokens=ins[i], output_tokens=outs[i],
            arrival_time_us=t, send_time_us=t, first_chunk_time_us=first, last_chunk_time_us=last,
            num_chunks=len(itls[i]) + 1, status="ok"))
        if outs[i] >= 1:
            ttft, e2e, tpot = latencies(first / 1e6, last / 1e6, t / 1e6, outs[i])
            reqs.append(RealRequest(id=f"request_{i}", arrival_us=t, input_toks=ins[i],
                                    output_toks=outs[i], first_token_s=first / 1e6,
                                    last_token_s=last / 1e6, ttft_ms=ttft, e2e_ms=e2e,
                                    tpot_ms=tpot, trace_id=i))
    records.sort(key=lambda r: r.arrival_time_us)
    model = data.get("model_id")
    date = data.get("date")
    for key, v in (("model_id", model), ("date", date)):
        if v is not None and not isinstance(v, str):
            raise ConfigError("not a string", file=f, field=key)
    header = TraceHeader(trace_version=2, mode="real", created_at=date if isinstance(date, str) else "",
                         server=TraceServer(type="vllm", model=model if isinstance(model, str) else ""))
    failed = sum(1 for e in errors if e)
    if failed:
        notes.append(f"{failed} of {n} requests failed (status error)")
    return MeasuredRun(path.stem, None, reqs, None, None, [], 0.0, notes, header, records, source=f)
