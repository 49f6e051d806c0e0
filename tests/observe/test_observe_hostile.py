"""``observe`` against a hostile server (issue 23, finding 6), a real HTTP server on
127.0.0.1: what it sends is that request's error, never the end of the run, and what is
recorded is a trace ``replay`` reads and a results file of bounded size."""

from __future__ import annotations

import socket
import threading

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.observe import ObserveConfig, observe
from blis_simpy.observe import client as observe_client
from blis_simpy.observe.client import CHUNK_SLACK, check_server
from blis_simpy.observe.records import results_document, trace_records, write_json
from blis_simpy.request import Request
from blis_simpy.workload import TraceHeader, read_trace, write_trace

from .sse_server import ENDLESS, ESC_ERROR, HUGE_USAGE, NESTED, SSEServer

#: a per-request timeout that only ends a hang
NO_HANG_S = 60.0


def _observe(srv: SSEServer, marker: int, n_out: int = 3):
    """Three requests: a normal one, the hostile one, a normal one."""
    reqs = [Request(f"r{i}", 1000 * i, [p, 5, 6], [7] * n_out) for i, p in enumerate((100, marker, 101))]
    return observe(reqs, ObserveConfig(srv.url, "m", timeout_s=NO_HANG_S)).observations


def _trace_reads_back(tmp_path, observations):
    h, d = write_trace(tmp_path / "obs", TraceHeader(trace_version=2, mode="real"),
                       trace_records(observations, streaming=True))
    return read_trace(h, d).records, d


def test_a_deeply_nested_data_line_is_that_requests_error(server, tmp_path):
    """It ended the run: "Task exception was never retrieved", a RecursionError, no files."""
    obs = _observe(server, NESTED)
    assert [o.status for o in obs] == ["ok", "error", "ok"]
    assert obs[1].error_message.startswith("malformed SSE data (JSON nested too deeply): '[[[[")
    rows, _ = _trace_reads_back(tmp_path, obs)
    assert [r.status for r in rows] == ["ok", "error", "ok"]


def test_usage_beyond_the_token_cap_is_refused(server, tmp_path):
    """usage.completion_tokens of 2^63 was recorded: a trace that replay refused."""
    obs = _observe(server, HUGE_USAGE)
    assert [o.status for o in obs] == ["ok", "error", "ok"]
    assert obs[1].error_message == f"usage.completion_tokens is {2 ** 63}, more than 16777216 tokens (2^24)"
    assert obs[1].completion_tokens == 3         # the content chunks counted, not the usage
    rows, _ = _trace_reads_back(tmp_path, obs)
    assert [r.output_tokens for r in rows] == [3, 3, 3]


def test_control_characters_of_an_error_body_are_escaped(server, tmp_path):
    """A raw ESC byte of a 500's body landed in the trace CSV."""
    obs = _observe(server, ESC_ERROR)
    assert obs[1].error_message == "HTTP 500: \\x1b[31mboom\\x1b[0m"
    rows, data = _trace_reads_back(tmp_path, obs)
    assert b"\x1b" not in data.read_bytes()
    assert rows[1].error_message == "HTTP 500: \\x1b[31mboom\\x1b[0m"


def test_an_endless_stream_is_cut(server, tmp_path):
    """One request of an endless stream wrote an 11 MB results file."""
    obs = _observe(server, ENDLESS, n_out=4)
    assert [o.status for o in obs] == ["ok", "error", "ok"]
    o = obs[1]
    limit = 4 + CHUNK_SLACK
    assert o.error_message == f"more than {limit} content chunks (max_tokens 4 + {CHUNK_SLACK}): the stream was cut"
    assert (o.num_chunks, len(o.chunk_us)) == (limit, limit)
    path = write_json(tmp_path / "res.json", results_document(obs))
    assert path.stat().st_size < 20_000
    _trace_reads_back(tmp_path, obs)


class _Trickle:
    """A server that answers a GET with a valid response, one byte every 50 ms (each read
    returns well within httpx's per-read timeout; the whole takes ~10 s)."""

    RESPONSE = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 180 + b"\r\nContent-Length: 0\r\n\r\n"

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            for b in self.RESPONSE:
                if self.stop.wait(0.05):
                    return
                conn.sendall(bytes([b]))


def test_preflight_has_a_total_deadline(monkeypatch):
    """A server trickling its header bytes held the check for 60-90 s against its 10 s:
    httpx's timeout is per read. With a deadline of 0.5 s the check ends long before the
    ~10 s the answer takes (without the total deadline it succeeded after them)."""
    monkeypatch.setattr(observe_client, "PREFLIGHT_TIMEOUT_S", 0.5)
    srv = _Trickle()
    try:
        with pytest.raises(ConfigError) as ei:
            check_server(ObserveConfig(srv.url, "m"))
    finally:
        srv.stop.set()
    assert str(ei.value) == "--server-url: cannot reach the server: no answer within 0.5 s"
