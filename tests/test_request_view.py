"""The read-only view of a request that plugins get (blis_simpy/request_view.py)."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.engine.scheduling import PriorityPolicy, Scheduler, checked_priorities, checked_reorder
from blis_simpy.errors import ConfigError
from blis_simpy.request import Request
from blis_simpy.request_view import VIEW_FIELDS, RequestView, as_view


def _req(rid="r0", arrival_us=5_000, n_in=8, n_out=3) -> Request:
    return Request(rid, arrival_us, np.arange(n_in), np.arange(100, 100 + n_out), slo_class="gold")


def test_a_view_reads_every_field_and_changes_none():
    req = _req()
    view = RequestView(req)
    assert [getattr(view, f) for f in VIEW_FIELDS] == [getattr(req, f) for f in VIEW_FIELDS]
    for name, value in (("output_len", 1), ("arrival_us", 0), ("priority", 9.0), ("pi", 4),
                        ("brand_new", 1)):
        with pytest.raises(AttributeError, match=f"r0's {name} is read-only"):
            setattr(view, name, value)
    with pytest.raises(AttributeError, match="r0's slo_class is read-only"):
        del view.slo_class
    assert (req.output_len, req.arrival_us, req.priority, req.pi, req.slo_class) == (3, 5_000, 0.0, 0, "gold")


def test_a_views_arrays_and_lists_are_read_only_or_copies():
    req = _req()
    req.itl = [10, 20]
    view = RequestView(req)
    with pytest.raises(ValueError, match="read-only"):
        view.input_tokens[0] = 99
    assert view.input_tokens.tolist() == list(range(8)) == req.tokens[:8].tolist()
    view.itl.append(30)
    view.prompt_block_hashes(4).clear()
    assert req.itl == [10, 20]
    assert view.prompt_block_hashes(4) == req.prompt_block_hashes(4) and len(req.prompt_block_hashes(4)) == 2
    with pytest.raises(AttributeError, match="has no 'tokens'"):
        view.tokens          # the oracle outputs are the engine's alone (INV-9)   # noqa: B018
    with pytest.raises(AttributeError, match="has no 'output_tokens'"):
        view.output_tokens   # noqa: B018


def test_views_of_one_request_are_equal_and_hash_alike():
    a, b = _req("a"), _req("b")
    assert RequestView(a) == RequestView(a) and hash(RequestView(a)) == hash(RequestView(a))
    assert RequestView(a) != RequestView(b) and RequestView(a) != a
    v = RequestView(a)
    assert as_view(v) is v and as_view(a) == v


class _ByPromptDesc(Scheduler, name="test-view-prompt-desc"):
    def reorder(self, queue, now_us):
        assert all(type(r) is RequestView for r in queue)
        items = sorted(queue, key=lambda r: -r.input_len)
        queue.clear()
        queue.extend(items)


class _Age(PriorityPolicy, name="test-view-age"):
    def priority(self, req, now_us):
        assert type(req) is RequestView
        return float(now_us - req.arrival_us)


def test_a_plugin_scheduler_orders_the_queue_through_views():
    from collections import deque
    reqs = [_req("short", n_in=4), _req("long", n_in=12), _req("mid", n_in=8)]
    queue = deque(reqs)
    checked_reorder(_ByPromptDesc(), queue, 0)
    assert [r.id for r in queue] == ["long", "mid", "short"]
    assert all(type(r) is Request for r in queue)      # the engine keeps its requests
    checked_priorities(_Age(), queue, 7_000)
    assert [r.priority for r in queue] == [2_000.0] * 3


class _Drops(Scheduler, name="test-view-drops"):
    def reorder(self, queue, now_us):
        queue.pop()


def test_a_plugin_scheduler_that_loses_a_request_is_its_error():
    from collections import deque
    queue = deque([_req("a"), _req("b")])
    with pytest.raises(ConfigError, match=r"changed the wait queue in reorder\(\): 2 requests "
                       "before, 1 after, it lost a queued request"):
        checked_reorder(_Drops(), queue, 0)
    assert [r.id for r in queue] == ["a", "b"]
