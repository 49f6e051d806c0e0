"""``blis_simpy.observe`` against a real streaming HTTP server on 127.0.0.1.

The server (tests/observe/sse_server.py) sends the first token 80 ms after a request arrives
and one more every 20 ms. No test here passes or fails on how fast this machine is: every
timing assertion is causal (the server cannot answer sooner than it sleeps, so TTFT and E2E
have exact lower bounds; against the server's own clock, the same perf_counter in this
process, every token is recorded after the server wrote it and every request went out
before the server got it), orderings come from events (the server holds answers until
enough requests are in flight; a hung answer never ends by itself, only the client's
timeout ends it), and the only upper bounds are :data:`HANG_BOUND_US`, which catch a unit
error or a hang and nothing a loaded machine does.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.observe import ObserveConfig, chat_text, endpoint_url, observe, request_body, summarize
from blis_simpy.observe.records import trace_records
from blis_simpy.request import Request

from .sse_server import DROP, HANG, HTTP_500, MALFORMED, NO_USAGE, PROMPT_TOKENS_REPORTED_EXTRA, SSEServer

# The server's delays are lower bounds every measurement must respect (that is what shows
# the timings are read at the right moments). HANG_BOUND_US is the only upper bound: it
# catches a unit error (ms or ns for µs) or a hang, never a slow machine.
FIRST_US, GAP_US, HANG_BOUND_US = 80_000, 20_000, 30_000_000
#: a per-request timeout that only ends a hang (the default is 300 s)
NO_HANG_S = 30.0


def req(i: int, arrival_us: int, prompt: list[int], n_out: int) -> Request:
    return Request(f"r{i}", arrival_us, prompt, [7] * n_out)


def cfg(srv: SSEServer, **kw) -> ObserveConfig:
    return ObserveConfig(srv.url, "test-model", **{"timeout_s": NO_HANG_S, **kw})


def test_ttft_and_itl_follow_the_server_delays_and_usage_gives_token_counts(server):
    reqs = [req(i, 0, [100 + i, 5, 6, 7, 8], 6) for i in range(3)]
    run = observe(reqs, cfg(server))
    itls = []
    sent = {r["body"]["prompt"][0]: r for r in server.received}
    for o in run.observations:
        assert o.status == "ok", o.error_message
        assert FIRST_US <= o.ttft_us < HANG_BOUND_US
        assert o.num_chunks == 6 and len(o.chunk_us) == 6
        assert o.chunk_us == sorted(o.chunk_us)
        span = o.last_chunk_us - o.first_chunk_us
        assert o.e2e_us == o.ttft_us + span
        assert o.itl_us == [b - a for a, b in zip(o.chunk_us[:-1], o.chunk_us[1:], strict=True)]
        assert FIRST_US + 5 * GAP_US <= o.e2e_us < HANG_BOUND_US     # the server slept 80 + 5 x 20 ms
        assert (o.prompt_tokens, o.completion_tokens, o.tokens_from) == (5 + PROMPT_TOKENS_REPORTED_EXTRA, 6,
                                                                         "usage")
        assert o.finish_reason == "length"
        itls += o.itl_us
        # against the server's own clock (same perf_counter): sent before the server got it,
        # each token recorded after the server wrote it (to the µs the client truncates to)
        got = sent[o.request.input_tokens[0]]
        assert run.t0_ns + o.send_us * 1000 <= got["t_recv"] * 1e9
        assert len(got["chunk_ns"]) == 6
        for c_us, w_ns in zip(o.chunk_us, got["chunk_ns"], strict=True):
            assert run.t0_ns + (c_us + 1) * 1000 >= w_ns
        assert o.end_us >= o.last_chunk_us
    assert len(itls) == 15 and sum(itls) == sum(o.last_chunk_us - o.first_chunk_us for o in run.observations)
    s = summarize(run.observations)
    assert (s["ok"], s["errors"], s["timeouts"], s["output_tokens"]) == (3, 0, 0, 18)
    assert FIRST_US / 1000 <= s["ttft_ms"]["p50"] < HANG_BOUND_US / 1000
    ttfts = sorted(o.ttft_us for o in run.observations)
    assert s["ttft_ms"]["p50"] == ttfts[1] / 1000


def test_arrival_times_are_honoured(server):
    # the first is answered only once the second is in flight too: a client that sent them
    # one after the other would leave the first unanswered (until the hold's hang bound)
    server.hold_until_in_flight = 2
    run = observe([req(0, 0, [1, 2], 2), req(1, 1_000_000, [3, 4], 2)], cfg(server))
    first, second = run.observations
    assert first.status == second.status == "ok" and server.max_in_flight == 2
    assert first.send_us < second.arrival_us          # sent at its own arrival, not the next one's
    assert second.arrival_us == 1_000_000 and second.send_us >= 1_000_000
    assert first.end_us > second.send_us              # held until the second was in flight
    t0, t1 = (r["t_recv"] for r in server.received)
    assert t0 * 1e9 >= run.t0_ns and t1 * 1e9 >= run.t0_ns + 1_000_000_000    # by the server's clock


def test_concurrency_cap_holds_requests_back(server):
    reqs = [req(i, 0, [10 + i], 3) for i in range(6)]
    server.hold_until_in_flight = 2       # no answer before two are in flight: 2 is reached
    run = observe(reqs, cfg(server, max_concurrency=2))
    assert server.max_in_flight == 2      # ... and never passed
    assert all(o.status == "ok" for o in run.observations)
    # requests 3..6 waited for a free slot: each went out after an earlier one finished
    ends = sorted(o.end_us for o in run.observations)
    late = sorted(o.send_us for o in run.observations)[2:]
    assert all(s >= e for s, e in zip(late, ends, strict=False))
    assert late[0] >= FIRST_US + 2 * GAP_US


def test_failures_are_recorded_per_request_and_the_run_goes_on(server):
    reqs = [req(0, 0, [HTTP_500, 1], 3), req(1, 0, [DROP, 1], 4), req(2, 0, [MALFORMED, 1], 3),
            req(4, 0, [NO_USAGE, 1, 2], 3), req(5, 0, [42, 1], 3)]
    run = observe(reqs, cfg(server))
    # the hung request never gets an answer (the server holds it until it stops), so the
    # 0.4 s timeout is what ends it, however slow the machine; it runs alone so the timeout
    # cannot cut the others
    hung = observe([req(3, 0, [HANG, 1], 3)], cfg(server, timeout_s=0.4)).observations
    observations = run.observations[:3] + hung + run.observations[3:]
    by = {o.request.id: o for o in observations}
    assert by["r0"].status == "error" and by["r0"].error_message.startswith("HTTP 500: ")
    assert "boom" in by["r0"].error_message
    assert by["r1"].status == "error" and by["r1"].num_chunks == 2       # cut after two tokens
    assert "incomplete chunked read" in by["r1"].error_message
    assert by["r2"].status == "error" and "malformed SSE data" in by["r2"].error_message
    hang = by["r3"]
    assert hang.status == "timeout" and "0.4 s" in hang.error_message
    assert 400_000 <= hang.end_us - hang.send_us < HANG_BOUND_US       # cut at the timeout
    assert hang.num_chunks == 0 and hang.finish_reason == ""
    nu = by["r4"]
    assert nu.status == "ok" and nu.tokens_from == "chunks"
    assert (nu.completion_tokens, nu.prompt_tokens) == (3, 3)           # counted chunks, prompt sent
    assert by["r5"].status == "ok" and by["r5"].tokens_from == "usage"
    s = summarize(observations)
    assert (s["ok"], s["errors"], s["timeouts"], s["tokens_from_chunks"]) == (2, 3, 1, 1)
    rows = trace_records(observations, streaming=True)
    assert [r.status for r in rows] == ["error", "error", "error", "timeout", "ok", "ok"]
    assert rows[1].num_chunks == 2 and rows[1].first_chunk_time_us > 0


def test_a_server_that_goes_away_gives_per_request_connection_errors(server):
    def went_away(o):
        if o.request.id != "r0":
            return []
        server.close_listener()      # after the first answer nothing listens any more; the
        return [req(1, 0, [2], 2), req(2, 0, [3], 2)]    # next two are sent only after that
    run = observe([req(0, 0, [1], 2)], cfg(server), on_done=went_away)
    first, *rest = run.observations
    assert first.status == "ok"
    for o in rest:
        assert o.status == "error" and o.error_message.startswith("cannot connect: ")
        assert o.unreachable and o.num_chunks == 0
    assert summarize(run.observations)["errors"] == 2


def test_completions_body_and_path(server):
    r = req(0, 0, [11, 22, 33], 4)
    observe([r], cfg(server, api_key="sk-test"))
    got = server.received[0]
    assert got["path"] == "/v1/completions"
    assert got["headers"]["authorization"] == "Bearer sk-test"
    assert got["body"] == {"model": "test-model", "prompt": [11, 22, 33], "max_tokens": 4,
                           "min_tokens": 4, "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}}


def test_chat_body_and_path_and_the_role_chunk_is_not_a_token(server):
    r = req(0, 0, [11, 22, 33, 11], 3)
    run = observe([r], cfg(server, api_format="chat", server_type="sglang"))
    got = server.received[0]
    assert got["path"] == "/v1/chat/completions"
    text = chat_text([11, 22, 33, 11])
    assert len(text.split(" ")) == 4 and text.split(" ")[0] == text.split(" ")[3]
    assert got["body"] == {"model": "test-model", "messages": [{"role": "user", "content": text}],
                           "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    o = run.observations[0]
    assert o.status == "ok" and o.num_chunks == 3       # the role-only first chunk is not counted
    assert o.ttft_us >= FIRST_US


def test_unconstrained_output_and_no_streaming(server):
    run = observe([req(0, 0, [5, 6], 4)], cfg(server, streaming=False, unconstrained_output=True))
    body = server.received[0]["body"]
    assert body == {"model": "test-model", "prompt": [5, 6], "stream": False}
    o = run.observations[0]
    n = 5                                    # the server's default without max_tokens
    assert o.status == "ok" and o.num_chunks == 1 and o.completion_tokens == n
    assert o.ttft_us == o.e2e_us
    assert FIRST_US + (n - 1) * GAP_US <= o.ttft_us < HANG_BOUND_US


def test_unreachable_server_is_one_config_error():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                # nothing listens there now
    with pytest.raises(ConfigError, match="--server-url: cannot reach the server"):
        observe([req(0, 0, [1], 1)], ObserveConfig(f"http://127.0.0.1:{port}", "m"))


@pytest.mark.parametrize("kw, flag", [({"api_format": "xml"}, "--api-format"),
                                      ({"max_concurrency": 0}, "--max-concurrency"),
                                      ({"timeout_s": 0.0}, "--timeout-s")])
def test_bad_settings_name_their_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        observe([], ObserveConfig("http://127.0.0.1:9", "m", **kw))


def test_bodies_and_urls():
    assert endpoint_url("http://h:8000/v1/", "chat") == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h:8000", "completions") == "http://h:8000/v1/completions"
    b = request_body([1, 2], 0, model="m", api_format="completions", streaming=False)
    assert b == {"model": "m", "prompt": [1, 2], "max_tokens": 1, "min_tokens": 1, "ignore_eos": True,
                 "stream": False}
    assert chat_text([0, 1, 2]) == "the of and"


def test_observe_does_not_import_simpy():
    code = "import sys, blis_simpy.observe; sys.exit('simpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
