"""What ``observe`` recorded, per request, and the files made from it.

An :class:`Observation` holds the measured times of one request as integer µs since the
start of the run (the moment the first request could be sent): scheduled arrival, send,
and the receive time of every chunk that carried generated text. From them:

* TTFT = first content chunk − send; ITLs = gaps between successive content chunks;
  E2E = last content chunk − send (all in ms in the results file, µs in the trace);
* :func:`trace_records` — TraceV2 rows (mode ``real``), one per request in dispatch (=
  arrival) order with ``request_id`` 0, 1, …; with the prompt token IDs that were sent in
  the ``input_token_ids`` column when :func:`carries_token_ids` (token-ID prompts, at most
  the reader's 10,000,000 IDs per file), so a replay shares exactly the prefixes the
  server saw;
* :func:`results_document` — the ``--results`` JSON: per-request TTFT / ITL list / E2E and
  a summary (mean/p50/p90/p99 of TTFT, ITL and E2E over the successful requests after the
  warm-up ones, and throughput).

Token counts come from the response's ``usage`` field; when a response has none,
``completion_tokens`` is the number of content chunks and ``prompt_tokens`` the number of
prompt tokens sent, and ``tokens_from`` says ``chunks`` instead of ``usage``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.metrics.percentile import SortedHistogram
from blis_simpy.workload.tracev2 import MAX_TOKEN_IDS_PER_FILE, TraceRecord

OK, ERROR, TIMEOUT = "ok", "error", "timeout"
#: chunk timestamps kept per request (further chunks are still counted, and the last one
#: always replaces the last kept, so E2E stays exact; the ITLs past it merge into one gap):
#: with ``itl_ms`` listed per request, what one endless stream can add to the results file
#: stays near a megabyte
MAX_CHUNK_TIMES = 100_000
#: the longest error message kept (characters)
MAX_ERROR_CHARS = 500
PERCENTILES = (50, 90, 99)
#: control characters (C0, DEL, C1): a server's error body may hold any byte, and a raw ESC
#: in the trace CSV or on a terminal is not text
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character written as ``\\xNN`` (``\x1b`` -> ``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@dataclass(slots=True)
class Observation:
    """One sent request. Times are µs since the run start; ``chunk_us`` are the receive
    times of the chunks that carried text (at most :data:`MAX_CHUNK_TIMES` are kept)."""

    request: object                   # the workload Request (id, token IDs, metadata)
    arrival_us: int                   # scheduled arrival
    send_us: int = 0
    chunk_us: list[int] = field(default_factory=list)
    num_chunks: int = 0
    end_us: int = 0                   # when the response ended (success or failure)
    status: str = ""                  # ok | error | timeout
    error_message: str = ""
    finish_reason: str = ""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    unreachable: bool = False         # the connection itself failed (nothing answered)
    ended: bool = False               # the sender is done with it

    def add_chunk(self, t_us: int) -> None:
        self.num_chunks += 1
        if len(self.chunk_us) < MAX_CHUNK_TIMES:
            self.chunk_us.append(t_us)
        else:
            self.chunk_us[-1] = t_us

    def fail(self, status: str, message: str, t_us: int) -> None:
        """End the request as ``status`` with ``message`` (control characters escaped, at
        most :data:`MAX_ERROR_CHARS`)."""
        self.status = status
        self.error_message = printable(message)[:MAX_ERROR_CHARS]
        self.end_us = t_us

    # ------------------------------------------------------------------ derived values
    @property
    def first_chunk_us(self) -> int:
        return self.chunk_us[0] if self.chunk_us else 0

    @property
    def last_chunk_us(self) -> int:
        return self.chunk_us[-1] if self.chunk_us else 0

    @property
    def tokens_from(self) -> str:
        return "usage" if self.usage_completion_tokens is not None else "chunks"

    @property
    def prompt_tokens(self) -> int:
        if self.usage_prompt_tokens is not None:
            return self.usage_prompt_tokens
        return self.request.input_len

    @property
    def completion_tokens(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.num_chunks

    @property
    def ttft_us(self) -> int | None:
        return self.chunk_us[0] - self.send_us if self.chunk_us else None

    @property
    def e2e_us(self) -> int | None:
        return self.chunk_us[-1] - self.send_us if self.chunk_us else None

    @property
    def itl_us(self) -> list[int]:
        c = self.chunk_us
        return [b - a for a, b in zip(c, c[1:], strict=False)]


# ---------------------------------------------------------------------------- TraceV2 rows
def carries_token_ids(observations: list[Observation], api_format: str) -> bool:
    """Whether the trace should carry the prompts' token IDs (``input_token_ids``): only
    when the server got exactly those IDs (``completions``) and they fit the reader's cap."""
    return api_format == "completions" and \
        sum(o.request.input_len for o in observations) <= MAX_TOKEN_IDS_PER_FILE


def trace_record(i: int, o: Observation, *, streaming: bool, token_ids: bool = False) -> TraceRecord:
    """The TraceV2 row of the ``i``-th observation (``request_id`` = ``i``). ``input_tokens``
    is the prompt without its shared prefix (TraceV2's convention), ``output_tokens`` the
    completion tokens the server reported and ``server_input_tokens`` its prompt tokens.
    ``token_ids``: fill ``input_token_ids`` with the prompt IDs that were sent."""
    r = o.request
    return TraceRecord(
        request_id=i, client_id=r.client_id, tenant_id=r.tenant_id, slo_class=r.slo_class,
        session_id=r.session_id, round_index=r.round_index, prefix_group=r.prefix_group,
        prefix_length=r.prefix_length, streaming=streaming,
        input_tokens=max(r.input_len - r.prefix_length, 0), output_tokens=o.completion_tokens,
        text_tokens=r.text_tokens, image_tokens=r.image_tokens, audio_tokens=r.audio_tokens,
        video_tokens=r.video_tokens, reason_ratio=r.reason_ratio, model=r.model,
        deadline_us=r.deadline_us, server_input_tokens=o.prompt_tokens,
        arrival_time_us=o.arrival_us, send_time_us=o.send_us,
        first_chunk_time_us=o.first_chunk_us, last_chunk_time_us=o.last_chunk_us,
        num_chunks=o.num_chunks, status=o.status, error_message=o.error_message,
        finish_reason=o.finish_reason,
        input_token_ids=np.array(r.input_tokens, dtype=np.int32) if token_ids else None)


def trace_records(observations: list[Observation], *, streaming: bool,
                  token_ids: bool = False) -> list[TraceRecord]:
    """One TraceV2 row per observation (:func:`trace_record`, ``request_id`` = position)."""
    return [trace_record(i, o, streaming=streaming, token_ids=token_ids)
            for i, o in enumerate(observations)]


# ---------------------------------------------------------------------------- results
def _ms(us: int | None) -> float | None:
    return None if us is None else us / 1000


def _stats(hist: dict[int, int]) -> dict:
    """mean/p50/p90/p99 in ms of a ``{µs value: count}`` histogram (BLIS's percentile rule,
    exactly what the sorted list of the values gives); ``count`` values."""
    h = SortedHistogram(hist)
    out = {"count": len(h), "mean": h.mean_ms()}
    for p in PERCENTILES:
        out[f"p{p}"] = h.percentile_ms(p)
    return out


def _count(hist: dict[int, int], value: int) -> None:
    hist[value] = hist.get(value, 0) + 1


class Summary:
    """The running form of :func:`summarize`: :meth:`add` each observation in trace order
    (once it has ended), :meth:`result` at any time. It keeps counts, sums and one
    ``{µs value: count}`` histogram per latency (TTFT, ITL, E2E), so the percentiles are
    exact while the memory grows with the distinct µs values, never with the requests."""

    def __init__(self, warmup_requests: int = 0):
        self.warmup_requests = warmup_requests
        self.requests = 0
        self.counts = {OK: 0, ERROR: 0, TIMEOUT: 0}
        self.tokens_from_chunks = 0
        self.ok = 0                  # successful with at least one content chunk
        self.output_tokens = 0
        self.first_send_us: int | None = None
        self.last_chunk_us: int | None = None
        self.ttft: dict[int, int] = {}
        self.itl: dict[int, int] = {}
        self.e2e: dict[int, int] = {}

    def add(self, o: Observation) -> None:
        self.requests += 1
        if self.requests <= self.warmup_requests:
            return
        if o.status in self.counts:
            self.counts[o.status] += 1
        if o.status != OK:
            return
        self.tokens_from_chunks += o.tokens_from == "chunks"
        if not o.chunk_us:
            return
        self.ok += 1
        self.output_tokens += o.completion_tokens
        _count(self.ttft, o.ttft_us)
        _count(self.e2e, o.e2e_us)
        for g in o.itl_us:
            _count(self.itl, g)
        if self.first_send_us is None or o.send_us < self.first_send_us:
            self.first_send_us = o.send_us
        if self.last_chunk_us is None or o.last_chunk_us > self.last_chunk_us:
            self.last_chunk_us = o.last_chunk_us

    def result(self) -> dict:
        """Counts over every request, latency statistics and throughput over the successful
        requests after the first ``warmup_requests``. Throughput divides by the span from the
        first send to the last content chunk of those requests."""
        span_us = self.last_chunk_us - self.first_send_us if self.ok else 0
        span_s = span_us / 1e6
        return {
            "requests": self.requests,
            "warmup_requests": min(self.warmup_requests, self.requests),
            "ok": self.counts[OK], "errors": self.counts[ERROR], "timeouts": self.counts[TIMEOUT],
            "tokens_from_chunks": self.tokens_from_chunks,
            "ttft_ms": _stats(self.ttft), "itl_ms": _stats(self.itl), "e2e_ms": _stats(self.e2e),
            "duration_s": span_s,
            "output_tokens": self.output_tokens,
            "requests_per_s": self.ok / span_s if span_s > 0 else 0.0,
            "output_tokens_per_s": self.output_tokens / span_s if span_s > 0 else 0.0,
        }


def summarize(observations: list[Observation], warmup_requests: int = 0) -> dict:
    """:class:`Summary` of a list of observations (in trace order)."""
    acc = Summary(warmup_requests)
    for o in observations:
        acc.add(o)
    return acc.result()


def request_result(i: int, o: Observation, warmup: bool) -> dict:
    """The per-request entry of the results file (times in ms since the run start)."""
    return {
        "request_id": i, "name": o.request.id, "warmup": warmup, "status": o.status,
        "error_message": o.error_message, "finish_reason": o.finish_reason,
        "arrival_ms": o.arrival_us / 1000, "send_ms": o.send_us / 1000,
        "ttft_ms": _ms(o.ttft_us), "e2e_ms": _ms(o.e2e_us),
        "itl_ms": [g / 1000 for g in o.itl_us],
        "num_chunks": o.num_chunks, "prompt_tokens_sent": o.request.input_len,
        "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
        "max_tokens": o.request.max_output_len, "tokens_from": o.tokens_from,
    }


def results_document(observations: list[Observation], *, warmup_requests: int = 0,
                     run: dict | None = None) -> dict:
    """The ``--results`` JSON document: ``run`` (what was sent where), ``summary`` and
    ``requests`` (one entry per request, in trace order)."""
    return {
        "run": run or {},
        "summary": summarize(observations, warmup_requests),
        "requests": [request_result(i, o, i < warmup_requests) for i, o in enumerate(observations)],
    }


def write_json(path: str | os.PathLike, doc: dict, *, flag: str = "--results",
               batch: Batch | None = None) -> Path:
    """Write ``doc`` as indented JSON all-or-nothing (:mod:`blis_simpy.atomic`); with
    ``batch``, staged to commit with the batch's other outputs. Errors name ``path`` and
    ``flag``."""
    final = Path(path)
    with atomic_write(final, batch=batch, field=flag, what="cannot write results",
                      binary=False) as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return final
