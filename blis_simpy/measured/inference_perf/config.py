"""``results/config.yaml`` of an inference-perf run: the configuration as it ran, read into an
:class:`IPConfig` (docs/workloads.md, "inference-perf results").

Read: ``data`` (``type`` and its section: ``shared_prefix``, or ``input_distribution`` /
``output_distribution`` for ``random`` and ``synthetic``), ``load`` (``type`` constant or
poisson, ``stages`` of rate × duration, ``interval``, ``num_workers``, ``request_timeout``,
``sweep``), ``api.streaming``, ``server.ignore_eos`` and ``server.model_name``; every other
key is ignored. A missing key takes inference-perf's own default (its ``config.py``). A
setting the rebuild cannot follow (another data or load type, multi-turn chat, length
distributions of a shared prefix, a sweep) is one located error naming it, as is every
malformed value (file, line, dotted key).

Units: rates in requests/s, durations and timeouts in s, lengths in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blis_simpy.bounds import MAX_TOKENS
from blis_simpy.config.loader import Source, read_mapping
from blis_simpy.workload.spec import MAX_STAGE_DURATION_S, MAX_STAGE_RATE, MIN_STAGE_RATE

DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = ("constant", "poisson")
#: the most requests all stages of one run may send, and the most stages
MAX_RUN_REQUESTS = 1_000_000
MAX_STAGES = 10_000
#: the most prompts (groups x prompts per group) of a shared-prefix definition
MAX_PROMPTS = 100_000
#: aiohttp's ClientTimeout(total=300): what inference-perf's client uses when
#: load.request_timeout is null (aiohttp client.py DEFAULT_TIMEOUT)
AIOHTTP_DEFAULT_TIMEOUT_S = 300.0
_MISSING = object()


@dataclass(frozen=True)
class IPStage:
    """A load stage: ``rate_rps`` × ``duration_s``; ``requests`` = int(rate × duration),
    as inference-perf's load generator counts them."""

    rate_rps: float
    duration_s: float
    requests: int


@dataclass(frozen=True)
class IPLengths:
    """inference-perf's ``Distribution``: a normal(mean, std_dev) clipped to [min, max] and
    rounded, ``total_count`` values (tokens)."""

    min: int
    max: int
    mean: float
    std_dev: float
    total_count: int


@dataclass(frozen=True)
class IPConfig:
    """The parts of an inference-perf configuration the rebuild follows (module docstring).
    ``shared_prefix``: ``(num_groups, num_prompts_per_group, system_prompt_len, question_len,
    output_len)``; ``input``/``output``: the length distributions of random/synthetic data;
    ``timeout_s`` the client's total request timeout (``timeout_default``: it was null, so
    aiohttp's 300 s applied)."""

    path: str
    data_type: str
    shared_prefix: tuple[int, int, int, int, int] | None
    input: IPLengths | None
    output: IPLengths | None
    load_type: str
    stages: tuple[IPStage, ...]
    interval_s: float
    num_workers: int
    timeout_s: float
    timeout_default: bool
    ignore_eos: bool
    streaming: bool
    model_name: str


class _Reader:
    """Typed, located access to the parsed YAML."""

    def __init__(self, data: dict, src: Source):
        self.data = data
        self.src = src

    def get(self, *loc, default=_MISSING):
        cur = self.data
        for i, k in enumerate(loc):
            if isinstance(k, int):          # an item of a list checked by the caller
                cur = cur[k]
            elif not isinstance(cur, dict):
                raise self.src.error("not a mapping", loc[:i])
            elif cur.get(k) is None:
                if default is _MISSING:
                    raise self.src.error("missing", loc)
                return default
            else:
                cur = cur[k]
        return cur

    def mapping(self, *loc, required: bool = False) -> dict | None:
        v = self.get(*loc, default=_MISSING if required else None)
        if v is not None and not isinstance(v, dict):
            raise self.src.error("not a mapping", loc)
        return v

    def number(self, *loc, default=_MISSING, lo: float = 0.0, hi: float = math.inf,
               integer: bool = False, lo_open: bool = False) -> float:
        v = self.get(*loc, default=default)
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if ok and integer:
            ok = float(v).is_integer()
        if not ok or v < lo or v > hi or (lo_open and v <= lo):
            kind = "an integer" if integer else "a number"
            rng = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
            raise self.src.error(f"not {kind} {rng}: {v!r}", loc)
        return int(v) if integer else float(v)

    def flag(self, *loc, default: bool) -> bool:
        v = self.get(*loc, default=default)
        if not isinstance(v, bool):
            raise self.src.error(f"not true or false: {v!r}", loc)
        return v

    def choice(self, *loc, choices: tuple[str, ...], default=_MISSING) -> str:
        v = self.get(*loc, default=default)
        if not isinstance(v, str):
            raise self.src.error(f"not a string: {v!r}", loc)
        if v not in choices:
            raise self.src.error(f"{v!r} is not supported by the rebuild (supported: {', '.join(choices)})", loc)
        return v


def _shared_prefix(r: _Reader) -> tuple[int, int, int, int, int]:
    sp = ("data", "shared_prefix")
    r.mapping(*sp, required=True)
    if r.get(*sp, "enable_multi_turn_chat", default=False) is not False:
        raise r.src.error("multi-turn chat is not supported by the rebuild", sp + ("enable_multi_turn_chat",))
    for key in ("question_distribution", "output_distribution", "system_prompt_len_std", "question_len_std",
                "output_len_std"):
        if r.get(*sp, key, default=0) not in (0, 0.0):
            raise r.src.error("length distributions of a shared prefix are not supported by the rebuild "
                              "(fixed lengths only)", sp + (key,))

    def count(*names: str) -> int:
        given = [n for n in names if r.get(*sp, n, default=None) is not None]
        if len(given) > 1:
            raise r.src.error(f"given twice (as {' and '.join(given)})", sp + (given[1],))
        return r.number(*sp, given[0] if given else names[0], default=10, lo=1, hi=MAX_PROMPTS, integer=True)

    groups = count("num_groups", "num_unique_system_prompts")
    per = count("num_prompts_per_group", "num_users_per_system_prompt")
    if groups * per > MAX_PROMPTS:
        raise r.src.error(f"{groups} x {per} prompts, at most {MAX_PROMPTS}", sp)
    lengths = []
    for key, default, lo in (("system_prompt_len", 100, 0), ("question_len", 50, 0), ("output_len", 50, 1)):
        if isinstance(r.get(*sp, key, default=None), dict):
            raise r.src.error("a length distribution is not supported by the rebuild (fixed lengths only)",
                              sp + (key,))
        lengths.append(r.number(*sp, key, default=default, lo=lo, hi=MAX_TOKENS, integer=True))
    if lengths[0] + lengths[1] < 1:
        raise r.src.error("the prompt has no token (system_prompt_len + question_len is 0)", sp)
    return groups, per, lengths[0], lengths[1], lengths[2]


def _lengths(r: _Reader, key: str, lo: int) -> IPLengths:
    loc = ("data", key)
    r.mapping(*loc, required=True)
    kind = r.get(*loc, "type", default="normal")
    if kind != "normal":
        raise r.src.error(f"{kind!r} distributions are not supported by the rebuild (normal only)", loc + ("type",))
    d = IPLengths(
        min=r.number(*loc, "min", default=10, lo=lo, hi=MAX_TOKENS, integer=True),
        max=r.number(*loc, "max", default=1024, lo=lo, hi=MAX_TOKENS, integer=True),
        mean=r.number(*loc, "mean", default=512.0, hi=MAX_TOKENS),
        std_dev=r.number(*loc, "std_dev", default=200.0, hi=MAX_TOKENS),
        total_count=r.number(*loc, "total_count", lo=1, hi=MAX_RUN_REQUESTS, integer=True))
    if not d.min <= d.mean <= d.max:
        raise r.src.error(f"needs min <= mean <= max, got {d.min}, {d.mean:g}, {d.max}", loc)
    return d


def _stages(r: _Reader) -> tuple[IPStage, ...]:
    raw = r.get("load", "stages")
    if not isinstance(raw, list) or not raw:
        raise r.src.error("not a non-empty list of stages", ("load", "stages"))
    if len(raw) > MAX_STAGES:
        raise r.src.error(f"{len(raw)} stages, at most {MAX_STAGES}", ("load", "stages"))
    out, total = [], 0
    for i in range(len(raw)):
        loc = ("load", "stages", i)
        r.mapping(*loc, required=True)
        if r.get(*loc, "concurrency_level", default=None) is not None:
            raise r.src.error("concurrency stages are not supported by the rebuild", loc + ("concurrency_level",))
        # a poisson second holds Poisson(rate) requests, all drawn: no more than a run may send
        hi = MAX_RUN_REQUESTS if r.get("load", "type", default="constant") == "poisson" else MAX_STAGE_RATE
        rate = r.number(*loc, "rate", lo=MIN_STAGE_RATE, hi=hi)
        duration = r.number(*loc, "duration", lo=0, hi=MAX_STAGE_DURATION_S, lo_open=True)
        n = int(rate * duration)
        total += n
        if total > MAX_RUN_REQUESTS:
            raise r.src.error(f"the stages send more than {MAX_RUN_REQUESTS} requests", loc)
        out.append(IPStage(rate, duration, n))
    if total == 0:
        raise r.src.error("no stage sends a request (int(rate x duration) is 0 for every stage)", ("load", "stages"))
    return tuple(out)


def read_config(path: str) -> IPConfig:
    """Read and check ``results/config.yaml`` (module docstring)."""
    data, src = read_mapping(path, "an inference-perf configuration")
    r = _Reader(data, src)
    for key in ("data", "load"):
        r.mapping(key, required=True)
    data_type = r.choice("data", "type", choices=DATA_TYPES)
    sp = _shared_prefix(r) if data_type == "shared_prefix" else None
    dist_in = dist_out = None
    if data_type != "shared_prefix":
        dist_in = _lengths(r, "input_distribution", 1)
        dist_out = _lengths(r, "output_distribution", 1)
    load_type = r.choice("load", "type", choices=LOAD_TYPES, default="constant")
    if r.get("load", "sweep", default=None) is not None:
        raise r.src.error("a sweep's stages are chosen at run time and not written here: not supported "
                          "by the rebuild", ("load", "sweep"))
    timeout = r.get("load", "request_timeout", default=None)
    if timeout is not None:
        timeout = r.number("load", "request_timeout", lo=0, hi=MAX_STAGE_DURATION_S, lo_open=True)
    model = r.get("server", "model_name", default="")
    if not isinstance(model, str):
        raise r.src.error(f"not a string: {model!r}", ("server", "model_name"))
    return IPConfig(
        path=str(path), data_type=data_type, shared_prefix=sp, input=dist_in, output=dist_out,
        load_type=load_type, stages=_stages(r),
        interval_s=r.number("load", "interval", default=1.0, hi=MAX_STAGE_DURATION_S),
        num_workers=r.number("load", "num_workers", default=1, hi=1 << 20, integer=True),
        timeout_s=AIOHTTP_DEFAULT_TIMEOUT_S if timeout is None else timeout,
        timeout_default=timeout is None,
        ignore_eos=r.flag("server", "ignore_eos", default=True),
        streaming=r.flag("api", "streaming", default=False),
        model_name=model)
