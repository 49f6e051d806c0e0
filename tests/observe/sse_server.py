"""A real streaming HTTP server on 127.0.0.1 for the observe tests (stdlib asyncio streams).

It speaks just enough HTTP/1.1 for an OpenAI-compatible client: ``GET`` answers 200, and
``POST /v1/completions`` / ``POST /v1/chat/completions`` stream SSE chunks with **known
delays**: :data:`FIRST_TOKEN_DELAY_S` after the request arrives the first token, then one
token every :data:`TOKEN_GAP_S`, then a usage chunk and ``data: [DONE]`` (chunked transfer
encoding, ``Connection: close``). The number of tokens is the body's ``max_tokens``.

The first prompt token (or the chat text's first word replaced by a marker) selects a
misbehaviour; markers are far above any vocabulary so random prompts never hit them:
:data:`HTTP_500`, :data:`DROP` (two tokens, then the socket is cut mid-body), :data:`HANG`
(nothing more until the server stops: only the client's timeout ends it), :data:`MALFORMED` (an SSE line that is not JSON) and
:data:`NO_USAGE` (no usage chunk), and the hostile :data:`NESTED`, :data:`HUGE_USAGE`,
:data:`ESC_ERROR` and :data:`ENDLESS`. ``stream: false`` gets one JSON body after all the
delays. Every request is recorded (path, headers, body, receive time ``t_recv`` in
perf_counter seconds, ``chunk_ns``: the perf_counter_ns of each token chunk written) and the
server counts the most requests it ever had in flight.

Synchronisation is by events, never by the clock: set :attr:`SSEServer.hold_until_in_flight`
to N and every response waits until N requests have been in flight at once (a latch: once
reached it stays open), so a concurrency test cannot pass or fail on how fast the client
happens to send. The wait is bounded by :data:`HOLD_BOUND_S`, which only ends a hang.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

FIRST_TOKEN_DELAY_S = 0.080
TOKEN_GAP_S = 0.020
HOLD_BOUND_S = 30.0       # only ends a hang (a client that never sends enough at once)
HTTP_500, DROP, HANG, MALFORMED, NO_USAGE = 9_000_500, 9_000_666, 9_000_999, 9_000_777, 9_000_555
#: hostile answers (issue 23): a data: line nested 100,000 deep, usage.completion_tokens of
#: 2^63, a 500 whose body holds a raw ESC, and a stream of tokens that never ends
NESTED, HUGE_USAGE, ESC_ERROR, ENDLESS = 9_001_001, 9_001_002, 9_001_003, 9_001_004
#: how long an endless stream goes on at most (it only ends a hang of a client that never cuts)
ENDLESS_BOUND = 2_000_000
PROMPT_TOKENS_REPORTED_EXTRA = 1   # usage.prompt_tokens = len(prompt) + 1 (as a BOS would)


class SSEServer:
    """Start with :meth:`start` (returns self), stop with :meth:`stop`."""

    def __init__(self):
        self.received: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None
        self.hold_until_in_flight = 0            # 0: answer at once; see the module docstring
        self._enough_in_flight = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> SSEServer:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", port), self._loop)
        self._server = fut.result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close_listener(self) -> None:
        """Stop accepting connections (a server that went away); running handlers go on."""
        async def close():
            self._server.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)

    def stop(self) -> None:
        async def shutdown():
            self._server.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()
        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            t_recv = time.perf_counter()       # s; chunk_ns below: perf_counter_ns of each token
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in
                       (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            if method != "POST":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                await writer.drain()
                return
            body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
            rec = {"path": path, "headers": headers, "body": body, "t_recv": t_recv, "chunk_ns": []}
            self.received.append(rec)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.in_flight >= self.hold_until_in_flight:
                self._enough_in_flight.set()
            left = []

            def finish() -> None:     # leave the in-flight count once, before the last bytes
                if not left:
                    left.append(True)
                    self.in_flight -= 1
            try:
                if self.hold_until_in_flight:
                    try:
                        await asyncio.wait_for(self._enough_in_flight.wait(), HOLD_BOUND_S)
                    except asyncio.TimeoutError:
                        pass                 # answer anyway: the test sees max_in_flight
                await self._respond(path, body, writer, finish, rec)
            finally:
                finish()
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _respond(self, path: str, body: dict, writer: asyncio.StreamWriter, finish, rec: dict) -> None:
        chat = path == "/v1/chat/completions"
        if chat:
            marker = 0
            n_prompt = len(body["messages"][0]["content"].split(" "))
        else:
            marker = body["prompt"][0] if body["prompt"] else 0
            n_prompt = len(body["prompt"])
        if marker in (HTTP_500, ESC_ERROR):
            msg = b'{"error": {"message": "boom"}}' if marker == HTTP_500 else b'\x1b[31mboom\x1b[0m'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(msg), msg))
            await writer.drain()
            return
        n = int(body.get("max_tokens", 5))
        usage = {"prompt_tokens": n_prompt + PROMPT_TOKENS_REPORTED_EXTRA, "completion_tokens": n,
                 "total_tokens": n_prompt + PROMPT_TOKENS_REPORTED_EXTRA + n}
        if not body.get("stream"):
            await asyncio.sleep(FIRST_TOKEN_DELAY_S + TOKEN_GAP_S * (n - 1))
            choice = ({"index": 0, "message": {"role": "assistant", "content": "tok " * n},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": "tok " * n, "finish_reason": "length"})
            data = json.dumps({"id": "x", "choices": [choice], "usage": usage}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(data), data))
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        if chat:   # vLLM's first chat chunk carries the role and no text
            self._event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await writer.drain()
        if marker == HANG:
            await asyncio.get_running_loop().create_future()     # never done; stop() cancels it
        if marker == NESTED:
            self._chunk(writer, b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n")
            self._chunk(writer, b"data: [DONE]\n\n")
            self._chunk(writer, b"")
            await writer.drain()
            return
        if marker == ENDLESS:
            for k in range(ENDLESS_BOUND):
                self._event(writer, {"id": "x", "choices": [{"index": 0, "text": f"t{k} "}]})
                if k % 64 == 0:
                    await writer.drain()
            return
        if marker == HUGE_USAGE:
            usage = {**usage, "completion_tokens": 2 ** 63}
        if marker == MALFORMED:
            self._chunk(writer, b"data: {not json\n\n")
            self._chunk(writer, b"")
            await writer.drain()
            return
        await asyncio.sleep(FIRST_TOKEN_DELAY_S)
        for k in range(n):
            if k:
                await asyncio.sleep(TOKEN_GAP_S)
            last = k == n - 1
            choice = ({"index": 0, "delta": {"content": f"t{k} "}} if chat else
                      {"index": 0, "text": f"t{k} "})
            choice["finish_reason"] = "length" if last else None
            rec["chunk_ns"].append(time.perf_counter_ns())      # just before the bytes go out
            self._event(writer, {"id": "x", "choices": [choice]})
            await writer.drain()
            if marker == DROP and k == 1:
                writer.transport.abort()          # cut mid-body: no terminating chunk
                return
        if marker != NO_USAGE:
            self._event(writer, {"id": "x", "choices": [], "usage": usage})
        finish()
        self._chunk(writer, b"data: [DONE]\n\n")
        self._chunk(writer, b"")                   # end of the chunked body
        await writer.drain()

    def _event(self, writer, obj: dict) -> None:
        self._chunk(writer, b"data: " + json.dumps(obj).encode() + b"\n\n")

    @staticmethod
    def _chunk(writer, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
