"""The request record shared by workload, cluster and engine (docs/engine.md,
"The request record").

A :class:`Request` carries what the client sent (token IDs, budget, deadline, metadata), the
oracle output tokens (pre-sampled: only step execution and completion may read them, INV-9),
and the engine state of its single life on one instance. All times are integer µs.

Token IDs are kept as one ``numpy.int32`` array: the prompt followed by the pre-sampled
output. The KV cache hashes blocks of that sequence (docs/kv-cache.md, "GPU tier"); the chained hashes of the
prompt's full blocks are computed once per block size and cached on the request.
"""

from __future__ import annotations

import hashlib

import numpy as np

QUEUED = 0
RUNNING = 1
COMPLETED = 2
TIMED_OUT = 3
DROPPED = 4   # refused by an enqueue guard, or can never fit in the KV cache
STATE_NAMES = ("queued", "running", "completed", "timed_out", "dropped")

try:
    # CPython's own SHA-256 (``_sha256`` up to 3.11, ``_sha2`` since 3.12): the same digests
    # as ``hashlib.sha256``, which goes through OpenSSL and sets up a context on every call;
    # on a block's 64-96 bytes that set-up is much of the cost (docs/performance.md,
    # "Block hashing and bulk KV slots")
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - depends on the Python version and build
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        _sha256 = hashlib.sha256


def hash_block(prev_hash: bytes, tokens: np.ndarray) -> bytes:
    """Chained block hash: ``sha256(prev_hash || token IDs)``, 32 raw bytes.

    BLIS hashes the decimal text ``"t1|t2|..."``; we hash the int32 bytes of the same token
    IDs. Both are SHA-256 over an injective encoding of (previous hash, tokens), so two
    blocks share a hash exactly when they would in BLIS; hashes are never printed, only
    compared, so every result is the same — at a fraction of the cost.
    """
    return _sha256(prev_hash + tokens.tobytes()).digest()


def hash_chain(tokens: np.ndarray, block_size: int, prev: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens`` (an int32 array); ``prev`` is the
    hash of the block before the first one (``b""``: none)."""
    buf = tokens.tobytes()
    step = 4 * block_size
    out = []
    for a in range(0, len(buf) - step + 1, step):
        prev = _sha256(prev + buf[a:a + step]).digest()
        out.append(prev)
    return out


class SharedPrefix:
    """Token IDs that start several prompts (a prefix group), with the chained hashes of
    their full blocks computed once per block size, so that requests built with
    ``Request(..., shared_prefix=p)`` do not hash the shared blocks again (the hashes are
    the same as hashing each prompt on its own)."""

    __slots__ = ("tokens", "_chains")

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self._chains: dict[int, list[bytes]] = {}

    def chain(self, block_size: int) -> list[bytes]:
        """Chained hashes of the prefix's full blocks of ``block_size`` tokens."""
        c = self._chains.get(block_size)
        if c is None:
            n = len(self.tokens) // block_size
            c = self._chains[block_size] = hash_chain(self.tokens[: n * block_size], block_size)
        return c


class Request:
    """One inference request. docs/engine.md, "The request record", says what each field means."""

    __slots__ = (
        # --- what the client sent -------------------------------------------------------
        "id", "arrival_us", "tokens", "input_len", "output_len", "max_output_len",
        "deadline_us", "tenant_id", "slo_class", "session_id", "round_index", "client_id",
        "prefix_group", "prefix_length", "streaming", "model", "reason_ratio",
        "text_tokens", "image_tokens", "audio_tokens", "video_tokens",
        "is_decode_sub", "seq_no",
        # --- cluster ----------------------------------------------------------------------
        "assigned_instance", "priority",
        # --- engine state -----------------------------------------------------------------
        "state", "pi", "num_new_tokens", "computed_tokens", "ttft_set", "ttft_us",
        "itl", "scheduled_step", "finished_step", "length_capped", "batch_pos", "enqueue_us",
        "first_itl_us", "prefill_to", "last_emit_us", "origin_us",
        # --- KV cache (owned by the kv package) -------------------------------------------
        "kv_blocks", "kv_len", "kv_base", "kv_view", "_hash_bs", "_prompt_hashes",
        "_shared_prefix",
        # --- lazy decode bookkeeping (owned by the engine) --------------------------------
        "g0", "seg_start", "itl_segments", "comp_tick", "res_class", "last_emit_tick",
        "itl_extra",
    )

    def __init__(self, id: str, arrival_us: int, input_tokens, output_tokens, *,
                 max_output_len: int | None = None, deadline_us: int = 0,
                 tenant_id: str = "", slo_class: str = "", session_id: str = "",
                 round_index: int = 0, client_id: str = "", prefix_group: str = "",
                 prefix_length: int = 0, streaming: bool = False, model: str = "",
                 reason_ratio: float = 0.0, text_tokens: int = 0, image_tokens: int = 0,
                 audio_tokens: int = 0, video_tokens: int = 0, is_decode_sub: bool = False,
                 seq_no: int = 0, shared_prefix: SharedPrefix | None = None):
        inp = np.asarray(input_tokens, dtype=np.int32)
        out = np.asarray(output_tokens, dtype=np.int32)
        tokens = np.concatenate((inp, out)) if len(out) else inp
        if len(tokens) and tokens.min() < 0:
            raise ValueError(f"request {id}: token IDs must be non-negative")
        self.id = id
        self.arrival_us = int(arrival_us)
        self.tokens = tokens
        self.input_len = int(len(inp))
        self.output_len = int(len(out))
        self.max_output_len = self.output_len if max_output_len is None else int(max_output_len)
        self.deadline_us = int(deadline_us)
        self.tenant_id = tenant_id
        self.slo_class = slo_class
        self.session_id = session_id
        self.round_index = round_index
        self.client_id = client_id
        self.prefix_group = prefix_group
        self.prefix_length = prefix_length
        self.streaming = streaming
        self.model = model
        self.reason_ratio = reason_ratio
        self.text_tokens = text_tokens
        self.image_tokens = image_tokens
        self.audio_tokens = audio_tokens
        self.video_tokens = video_tokens
        self.is_decode_sub = is_decode_sub
        self.seq_no = seq_no
        self.assigned_instance = ""
        self.priority = 0.0
        self.state = QUEUED
        self.pi = 0
        self.num_new_tokens = 0
        self.computed_tokens = 0
        self.ttft_set = False
        self.ttft_us = 0          # TTFT (µs from origin_us), set with ttft_set
        self.itl = []
        self.scheduled_step = 0
        self.finished_step = 0
        self.length_capped = False
        self.batch_pos = 0
        self.enqueue_us = -1
        self.first_itl_us = 0
        # pi at which the current prefill ends: the prompt, or (vLLM recompute preemption)
        # prompt + outputs so far, whose last position samples the next token
        self.prefill_to = self.input_len
        self.last_emit_us = 0      # end (µs) of the step that emitted the latest token
        # where the engine's latencies of this request are measured from (µs): its arrival,
        # or — with a front end and metrics measured at the server — the moment the front
        # end handed it to the engine (docs/frontend.md)
        self.origin_us = self.arrival_us
        self.kv_blocks = []
        self.kv_len = 0
        self.kv_base = 0
        self.kv_view = None       # memoryview of tokens while the request holds KV blocks
        self._hash_bs = 0
        self._prompt_hashes = None
        # kept only when the prompt really starts with those tokens (a hashing shortcut)
        if shared_prefix is not None:
            n = len(shared_prefix.tokens)
            if not (n <= len(inp) and np.array_equal(inp[:n], shared_prefix.tokens)):
                shared_prefix = None
        self._shared_prefix = shared_prefix
        self.g0 = 0
        self.seg_start = 0
        self.itl_segments = None
        self.comp_tick = -1
        self.res_class = -1
        self.last_emit_tick = 0    # fast engine: tick of the latest non-lazy token
        self.itl_extra = None      # fast engine: [(tick, µs)] ITL samples off the tick grid

    # ------------------------------------------------------------------ token views
    @property
    def input_tokens(self) -> np.ndarray:
        return self.tokens[: self.input_len]

    @property
    def output_tokens(self) -> np.ndarray:
        return self.tokens[self.input_len:]

    def prompt_block_hashes(self, block_size: int) -> list[bytes]:
        """Chained hashes of the prompt's full blocks, cached per block size."""
        if self._hash_bs == block_size and self._prompt_hashes is not None:
            return self._prompt_hashes
        n_full = self.input_len // block_size
        p = self._shared_prefix
        if p is None:
            hashes = hash_chain(self.tokens[: n_full * block_size], block_size)
        else:                                       # the shared blocks' hashes are memoised
            hashes = p.chain(block_size)[:n_full]
            k = len(hashes)
            hashes = hashes + hash_chain(self.tokens[k * block_size: n_full * block_size], block_size,
                                         hashes[-1] if k else b"")
        self._hash_bs = block_size
        self._prompt_hashes = hashes
        return hashes

    def share_prompt_hashes(self, other: Request) -> None:
        """Take ``other``'s cached prompt block hashes, if it has any (``other`` has the
        same prompt: a PD sub-request and its parent)."""
        if other._prompt_hashes is not None:
            self._hash_bs = other._hash_bs
            self._prompt_hashes = other._prompt_hashes

    def drop_prompt_hashes(self) -> None:
        """Let go of the cached prompt block hashes (they are made again if asked for)."""
        self._prompt_hashes = None

    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request({self.id!r}, arrival={self.arrival_us}, in={self.input_len}, "
                f"out={self.output_len}, state={self.state_name()}, pi={self.pi})")
