"""The read-only view of a request that plugins get (docs/extending.md, "What a policy sees").

Plugin routers, admission policies, routing scorers, disaggregation deciders, schedulers,
priority policies and latency models are handed a :class:`RequestView` of each
:class:`~blis_simpy.request.Request`, never the request itself: they read what it says —
the client's fields, the cluster's and the engine's state, the prompt's tokens and block
hashes — and cannot change it. Setting an attribute raises :class:`AttributeError` in the
plugin's own code, which the simulation reports as that plugin's one-line error; lists and
arrays come as copies or read-only arrays. The oracle output tokens (INV-9: only step
execution and completion read them) and the engine's lazy bookkeeping are not in the view.

Built-in policies get the request itself (no view is made on the hot paths). Two views of
the same request are equal and hash alike, so a plugin may key its state by them.
"""

from __future__ import annotations

from operator import attrgetter

#: the fields a view shows, read straight from the request (scalars: nothing to copy)
VIEW_FIELDS = (
    # what the client sent
    "id", "arrival_us", "input_len", "output_len", "max_output_len", "deadline_us", "tenant_id",
    "slo_class", "session_id", "round_index", "client_id", "prefix_group", "prefix_length",
    "streaming", "model", "reason_ratio", "text_tokens", "image_tokens", "audio_tokens",
    "video_tokens", "is_decode_sub", "seq_no",
    # cluster
    "assigned_instance", "priority",
    # engine state (a decoding request's pi and kv_len as of its latest materialisation)
    "state", "pi", "num_new_tokens", "computed_tokens", "ttft_set", "ttft_us", "scheduled_step",
    "finished_step", "length_capped", "batch_pos", "enqueue_us", "first_itl_us", "prefill_to",
    "last_emit_us", "origin_us", "kv_len",
)


class RequestView:
    """A read-only view of one request (module docstring)."""

    __slots__ = ("_req",)

    def __init__(self, req):
        object.__setattr__(self, "_req", req)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"{self._req.id}'s {name} is read-only: a plugin may read the "
                             "requests it is handed, never change them")

    def __getattr__(self, name: str):
        raise AttributeError(f"a plugin's view of {self._req.id} has no {name!r} (it shows "
                             "blis_simpy.request_view.VIEW_FIELDS, input_tokens, itl and "
                             "prompt_block_hashes(); output tokens are the engine's alone)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __eq__(self, other) -> bool:
        return isinstance(other, RequestView) and other._req is self._req

    def __hash__(self) -> int:
        return id(self._req)

    def __repr__(self) -> str:
        return f"RequestView({self._req!r})"

    @property
    def input_tokens(self):
        """The prompt's token IDs (a read-only ``numpy.int32`` array)."""
        req = self._req
        arr = req.tokens[: req.input_len].view()
        arr.flags.writeable = False
        return arr

    @property
    def itl(self) -> list[int]:
        """The request's ITL samples listed so far, µs (a copy)."""
        return list(self._req.itl)

    def prompt_block_hashes(self, block_size: int) -> list[bytes]:
        """Chained hashes of the prompt's full blocks of ``block_size`` tokens (a copy)."""
        return list(self._req.prompt_block_hashes(block_size))

    def state_name(self) -> str:
        return self._req.state_name()


for _name in VIEW_FIELDS:
    setattr(RequestView, _name, property(attrgetter(f"_req.{_name}")))
del _name


def as_view(req):
    """``req``'s read-only view (a view as it is)."""
    return req if type(req) is RequestView else RequestView(req)


def hand_views(plugin, methods: tuple[str, ...]):
    """``plugin`` with each of ``methods`` (whose first argument is a request) replaced, on
    this object only, by one that hands it the request's view instead; done once when a
    plugin object is built (built-in policies get the request itself)."""
    for name in methods:
        setattr(plugin, name, _viewing(getattr(plugin, name)))
    return plugin


def _viewing(method):
    def viewing(req, *args, **kw):
        return method(as_view(req), *args, **kw)
    return viewing
