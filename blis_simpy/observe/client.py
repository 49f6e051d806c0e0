"""The async sender of ``observe``: a workload's requests to an OpenAI-compatible server.

:func:`observe` sends each request at its arrival time (``arrival_us`` after the start of
the run, measured with :func:`time.perf_counter_ns`), with at most ``max_concurrency`` in
flight: a request that arrives while the cap is reached waits, in arrival order, and its
``send_us`` is when it actually went out. Each request has ``timeout_s`` in total (connect,
queue at the server, every token); past it the request is cut and recorded as ``timeout``.

Responses are read as they stream (SSE ``data:`` lines, one JSON chunk each, ``[DONE]`` at
the end); the receive time of each chunk that carries text is recorded. A refused
connection, a non-2xx status, an ``error`` object, malformed SSE or a stream cut before
``[DONE]`` make that request an ``error`` with its message; the run goes on. Before the
first request one plain ``GET`` of the server URL checks that something answers (any HTTP
status will do); if nothing does, or if in the end no request reached the server, the run
fails with a :class:`~blis_simpy.errors.ConfigError` naming ``--server-url``.

Closed-loop sessions: ``on_done(observation)`` may return follow-up requests (their own
``arrival_us``), which join the schedule.

``record(observation)``: each observation is handed over in dispatch order once it and every
earlier one have ended, and then dropped (``ObserveRun.observations`` stays empty), so a run
of millions of requests holds only those in flight and those finished behind an earlier one
still in flight (at most what is sent during one request's ``timeout_s``);
:class:`~blis_simpy.observe.outputs.ObserveOutputs` writes the files from them. An exception
from ``record`` (an output that cannot be written) stops the sending and ends the run.

Caps on what a workload or server can make us hold: at most :data:`MAX_REQUESTS` requests,
SSE lines up to :data:`MAX_LINE_BYTES`, error and non-streaming bodies up to
:data:`MAX_BODY_BYTES`, :data:`~blis_simpy.observe.records.MAX_CHUNK_TIMES` chunk times per
request. What a hostile server sends is that request's error, never the run's end: a
response with more content chunks than ``max_tokens`` + :data:`CHUNK_SLACK` (an endless
stream; without ``max_tokens``: more than 2^24) is cut; a ``usage`` token count over 2^24
(the cap a trace's token counts are read with) is refused; a JSON line nested too deeply is
malformed SSE; control characters of an error body are escaped (``\\x1b``).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timezone

import httpx

from blis_simpy.bounds import MAX_REQUESTS, MAX_TOKENS
from blis_simpy.errors import ConfigError
from blis_simpy.observe.body import API_FORMATS, CHAT, COMPLETIONS, endpoint_url, request_body
from blis_simpy.observe.records import ERROR, OK, TIMEOUT, Observation
from blis_simpy.workload.tracev2 import MAX_TOKEN_IDS_PER_FILE

MAX_CONCURRENCY = 10_000
MAX_LINE_BYTES = 1 << 20
MAX_BODY_BYTES = 64 << 20
PREFLIGHT_TIMEOUT_S = 10.0
#: content chunks past a request's ``max_tokens`` taken before its stream is cut
CHUNK_SLACK = 16


@dataclass(frozen=True)
class ObserveConfig:
    """Where and how to send. ``timeout_s`` is per request, in seconds."""

    server_url: str
    model: str
    api_format: str = "completions"
    streaming: bool = True
    max_concurrency: int = 256
    timeout_s: float = 300.0
    api_key: str = ""
    server_type: str = "vllm"
    unconstrained_output: bool = False

    def check(self) -> None:
        """Raise a ConfigError naming the flag of the first bad value."""
        if not self.server_url.startswith(("http://", "https://")):
            raise ConfigError(f"must start with http:// or https://, got {self.server_url!r}",
                              field="--server-url")
        if not self.model:
            raise ConfigError("is required: the model name the server serves", field="--model")
        if self.api_format not in API_FORMATS:
            raise ConfigError(f"must be one of {', '.join(API_FORMATS)}, got {self.api_format!r}",
                              field="--api-format")
        if not 1 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"must be in [1, {MAX_CONCURRENCY}], got {self.max_concurrency}",
                              field="--max-concurrency")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"must be > 0, got {self.timeout_s}", field="--timeout-s")


@dataclass
class ObserveRun:
    """The result of :func:`observe`: observations in dispatch (= arrival) order (none
    when they went to ``record``)."""

    observations: list[Observation]
    started_at: str                  # wall-clock start, ISO 8601 UTC
    duration_us: int                 # from the start to the last response
    t0_ns: int = 0                   # the start on the time.perf_counter_ns clock


class _BadStream(Exception):
    """The response is not what an OpenAI-compatible server sends."""


def observe(requests: Collection, config: ObserveConfig, *,
            progress: Callable[[int, int], None] | None = None,
            on_done: Callable[[Observation], list] | None = None,
            record: Callable[[Observation], None] | None = None) -> ObserveRun:
    """Send ``requests`` (sorted by ``arrival_us``; each with ``input_tokens``,
    ``max_output_len`` and ``id``; a list or a lazy stream with ``len()``, iterated once, each
    request taken when its turn comes) and record what happened; see the module docstring.
    ``progress(done, total)`` is called once at the start and after each response;
    ``record``: see the module docstring."""
    config.check()
    if len(requests) > MAX_REQUESTS:
        raise ConfigError(f"{len(requests)} requests is more than observe sends "
                          f"({MAX_REQUESTS:,})", field="--num-requests")
    return asyncio.run(_Runner(config, progress, on_done, record).run(requests))


def check_server(config: ObserveConfig) -> None:
    """The check that :func:`observe` makes before its first request, on its own: one ``GET``
    of the server URL; a ConfigError naming ``--server-url`` if nothing answers (within
    :data:`PREFLIGHT_TIMEOUT_S`). ``observe`` runs it before building the workload."""
    async def go() -> None:
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        async with httpx.AsyncClient(headers=headers, timeout=None) as client:
            await _preflight(client, config.server_url)
    asyncio.run(go())


class _Runner:
    def __init__(self, cfg: ObserveConfig, progress, on_done, record=None):
        self.cfg = cfg
        self.url = endpoint_url(cfg.server_url, cfg.api_format)
        self.progress = progress
        self.on_done = on_done
        self.t0_ns = 0
        self.done = 0
        self.total = 0
        self.followups: list = []           # heap of (arrival_us, seq, request)
        self.seq = 0
        self.wake = asyncio.Event()
        self.observations: list[Observation] = []
        self.record = record
        #: with ``record``: dispatched and not yet recorded, in dispatch order
        self.unrecorded: deque[Observation] = deque()
        self.failure: BaseException | None = None     # what ``record`` raised
        self.dispatched = self.unreachable = 0
        self.last: Observation | None = None          # the last one dispatched
        #: prompt token IDs sent so far; past what a trace may carry, sent prompts are dropped
        self.ids_sent = 0
        self.keep_ids = cfg.api_format == COMPLETIONS and on_done is None

    def now_us(self) -> int:
        return (time.perf_counter_ns() - self.t0_ns) // 1000

    async def run(self, requests: Collection) -> ObserveRun:
        cfg = self.cfg
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        limits = httpx.Limits(max_connections=cfg.max_concurrency,
                              max_keepalive_connections=cfg.max_concurrency)
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=None) as client:
            await _preflight(client, cfg.server_url)
            self.client = client
            started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self.t0_ns = time.perf_counter_ns()
            observations = await self._dispatch(requests)
            duration = self.now_us()
        if self.failure is not None:
            raise self.failure
        if self.dispatched and self.unreachable == self.dispatched:
            raise ConfigError(f"no request reached {self.url}: {self.last.error_message}",
                              field="--server-url")
        return ObserveRun(observations, started_at, duration, self.t0_ns)

    async def _dispatch(self, requests: Collection) -> list[Observation]:
        """Send in arrival order (initial requests merged with session follow-ups); the
        initial requests are taken from ``requests`` one at a time, as their turn comes."""
        sem = asyncio.Semaphore(self.cfg.max_concurrency)
        tasks: set[asyncio.Task] = set()
        observations = self.observations
        self.total = len(requests)
        if self.progress is not None:
            self.progress(0, self.total)
        waits = self.on_done is not None     # a running request may add a follow-up
        pending = iter(requests)
        head = next(pending, None)           # the next initial request, not yet sent
        while True:
            heap = self.followups
            from_list = head is not None and (not heap or head.arrival_us <= heap[0][0])
            nxt = head if from_list else heap[0][2] if heap else None
            if self.failure is not None or nxt is None and not (waits and tasks):
                break
            delay_ns = (self.t0_ns + nxt.arrival_us * 1000 - time.perf_counter_ns()
                        if nxt is not None else None)
            if nxt is None or (delay_ns > 0 and waits and tasks):
                self.wake.clear()            # wake up for a follow-up, or at the arrival
                try:
                    await asyncio.wait_for(self.wake.wait(), None if nxt is None else delay_ns / 1e9)
                except asyncio.TimeoutError:
                    pass
                continue
            while delay_ns > 0:              # asyncio may wake a hair early
                await asyncio.sleep(delay_ns / 1e9)
                delay_ns = self.t0_ns + nxt.arrival_us * 1000 - time.perf_counter_ns()
            if from_list:
                head = next(pending, None)
            else:
                heapq.heappop(heap)
            await sem.acquire()
            if self.failure is not None:
                sem.release()
                break
            o = Observation(nxt, nxt.arrival_us)
            (observations if self.record is None else self.unrecorded).append(o)
            self.dispatched += 1
            self.last = o
            task = asyncio.create_task(self._one(o, sem))
            tasks.add(task)
            task.add_done_callback(lambda t: (tasks.discard(t), self.wake.set()))
        if self.failure is not None:
            for t in tasks:
                t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=self.failure is not None)
        return observations

    async def _one(self, o: Observation, sem: asyncio.Semaphore) -> None:
        try:
            cfg = self.cfg
            r = o.request
            body = request_body(r.input_tokens, r.max_output_len, model=cfg.model,
                                api_format=cfg.api_format, streaming=cfg.streaming,
                                server_type=cfg.server_type,
                                unconstrained_output=cfg.unconstrained_output)
            o.send_us = self.now_us()
            self._sent(r)
            try:
                await asyncio.wait_for(self._exchange(body, o), cfg.timeout_s)
            except asyncio.TimeoutError:
                o.fail(TIMEOUT, f"no complete response within {cfg.timeout_s:g} s", self.now_us())
        finally:
            sem.release()
        self.done += 1
        self.unreachable += o.unreachable
        o.ended = True
        if self.record is not None:
            self._record_in_order()
        if self.on_done is not None:
            for f in self.on_done(o) or ():
                heapq.heappush(self.followups, (f.arrival_us, self.seq, f))
                self.seq += 1
                self.total += 1
        self.wake.set()
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _record_in_order(self) -> None:
        """Hand the ended observations at the head of the dispatch order to ``record``."""
        head = self.unrecorded
        try:
            while head and head[0].ended and self.failure is None:
                self.record(head.popleft())
        except BaseException as exc:       # the sending stops; run() raises it
            self.failure = exc
            self.wake.set()

    def _sent(self, r) -> None:
        """After ``r``'s body is built: once the prompts sent pass what a trace may carry
        (:data:`~blis_simpy.workload.tracev2.MAX_TOKEN_IDS_PER_FILE`; at once for a chat
        API, whose trace never carries them), the token IDs of the sent requests are dropped
        (the records keep their counts), so memory does not grow with the prompts. Not with
        closed-loop sessions: a follow-up round is built from its predecessor."""
        if self.on_done is not None:
            return
        self.ids_sent += r.input_len
        if self.keep_ids and self.ids_sent > MAX_TOKEN_IDS_PER_FILE:
            self.keep_ids = False
            for o in (self.observations if self.record is None else self.unrecorded):
                o.request.tokens = None
        if not self.keep_ids:
            r.tokens = None

    async def _exchange(self, body: dict, o: Observation) -> None:
        """One request/response; every failure is recorded on ``o``, none escapes."""
        try:
            async with self.client.stream("POST", self.url, json=body) as resp:
                if not 200 <= resp.status_code < 300:
                    text = (await _read_capped(resp, 2000)).decode("utf-8", "replace")
                    o.fail(ERROR, f"HTTP {resp.status_code}: {' '.join(text.split())}", self.now_us())
                    return
                if self.cfg.streaming:
                    await self._read_stream(resp, o)
                else:
                    await self._read_whole(resp, o)
        except _BadStream as exc:
            o.fail(ERROR, str(exc), self.now_us())
        except httpx.ConnectError as exc:
            o.fail(ERROR, f"cannot connect: {exc or type(exc).__name__}", self.now_us())
            o.unreachable = True
        except httpx.HTTPError as exc:
            o.fail(ERROR, f"{type(exc).__name__}: {exc or 'connection lost'}", self.now_us())
        except OSError as exc:
            o.fail(ERROR, f"{type(exc).__name__}: {exc}", self.now_us())

    async def _read_stream(self, resp: httpx.Response, o: Observation) -> None:
        done = False
        async for line in _lines(resp):
            if not line.startswith("data:"):
                continue                      # blank separators, comments, event:/id: fields
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            self._take(_parse_json(data), o, self.now_us())
        if not done:
            raise _BadStream("the stream ended before data: [DONE]")
        o.status, o.end_us = OK, self.now_us()

    async def _read_whole(self, resp: httpx.Response, o: Observation) -> None:
        raw = await _read_capped(resp, MAX_BODY_BYTES, strict=True)
        self._take(_parse_json(raw.decode("utf-8", "replace")), o, self.now_us())
        o.status, o.end_us = OK, self.now_us()

    def _take(self, chunk: dict, o: Observation, t_us: int) -> None:
        """Record one response chunk (or a whole non-streaming response)."""
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise _BadStream(f"server error: {msg}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
            for key, v in (("prompt_tokens", p), ("completion_tokens", c)):
                if isinstance(v, int) and v > MAX_TOKENS:      # the trace's cap on token counts
                    raise _BadStream(f"usage.{key} is {v}, more than {MAX_TOKENS} tokens (2^24)")
            if isinstance(p, int) and p >= 0:
                o.usage_prompt_tokens = p
            if isinstance(c, int) and c >= 0:
                o.usage_completion_tokens = c
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise _BadStream(f"malformed chunk: choices is {type(choices).__name__}")
        text = False
        for ch in choices:
            if not isinstance(ch, dict):
                raise _BadStream("malformed chunk: a choice is not an object")
            msg = ch.get("delta") if self.cfg.streaming else ch.get("message")
            if self.cfg.api_format == CHAT and isinstance(msg, dict):
                text = text or bool(msg.get("content") or msg.get("reasoning_content"))
            else:
                text = text or bool(ch.get("text"))
            if ch.get("finish_reason"):
                o.finish_reason = str(ch["finish_reason"])
        if text:
            limit = self._chunk_limit(o)
            if o.num_chunks >= limit:
                raise _BadStream(f"more than {limit} content chunks (max_tokens "
                                 f"{self._max_tokens(o) or 'not sent'} + {CHUNK_SLACK}): the stream was cut")
            o.add_chunk(t_us)

    def _max_tokens(self, o: Observation) -> int | None:
        return None if self.cfg.unconstrained_output else max(int(o.request.max_output_len), 1)

    def _chunk_limit(self, o: Observation) -> int:
        """The most content chunks taken from one response: ``max_tokens`` (one token a chunk
        at least) + :data:`CHUNK_SLACK`, or the cap on token counts without ``max_tokens``."""
        n = self._max_tokens(o)
        return MAX_TOKENS if n is None else n + CHUNK_SLACK


def _parse_json(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise _BadStream(f"malformed SSE data (not JSON): {data[:80]!r}") from None
    except RecursionError:      # a deeply nested line: this request's error, not the run's end
        raise _BadStream(f"malformed SSE data (JSON nested too deeply): {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise _BadStream(f"malformed SSE data (not a JSON object): {data[:80]!r}")
    return chunk


async def _lines(resp: httpx.Response):
    """The response's lines as they arrive (``\\n`` or ``\\r\\n``), each at most
    :data:`MAX_LINE_BYTES` — httpx's ``aiter_lines`` has no such cap."""
    buf = b""
    async for piece in resp.aiter_bytes():
        buf += piece
        if b"\n" in buf:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(buf) > MAX_LINE_BYTES:
            raise _BadStream(f"an SSE line is longer than {MAX_LINE_BYTES} bytes")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


async def _read_capped(resp: httpx.Response, limit: int, *, strict: bool = False) -> bytes:
    """At most ``limit`` bytes of the body (more is an error when ``strict``)."""
    out = bytearray()
    async for piece in resp.aiter_bytes():
        out += piece
        if len(out) > limit:
            if strict:
                raise _BadStream(f"the response is longer than {limit} bytes")
            break
    return bytes(out[:limit])


async def _preflight(client: httpx.AsyncClient, server_url: str) -> None:
    """One ``GET server_url``: any HTTP answer (its status line and headers) within
    :data:`PREFLIGHT_TIMEOUT_S` in all means the server is there (httpx's own timeout is per
    read: a server trickling its header bytes held it for minutes)."""
    async def get() -> None:
        async with client.stream("GET", server_url, timeout=PREFLIGHT_TIMEOUT_S):
            pass
    try:
        await asyncio.wait_for(get(), PREFLIGHT_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ConfigError(f"cannot reach the server: no answer within {PREFLIGHT_TIMEOUT_S:g} s",
                          field="--server-url") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ConfigError(f"cannot reach the server: {type(exc).__name__}: {exc}".rstrip(": "),
                          field="--server-url") from None
