"""The workload-spec v2 generator for standard clients (spec/07 §5, §6).

Normative order (it fixes reproducibility):

1. upgrade v1 and validate the spec (cohorts, multi-turn sessions, ServeGen and
   inference-perf sources are not supported yet and raise a ConfigError);
2. ``G`` = the ``"workload-gen"`` stream of the workload seed (:mod:`blis_simpy.rng`);
3. client rate ``λ_i = aggregate_rate · f_i / Σf / 1e6`` requests per µs;
4. prefixes: walk the clients in order; every new non-empty ``prefix_group`` draws its
   token IDs from ``G`` (length: the first positive ``prefix_length`` in the group, else 50);
5. per-client cap (when ``max_requests > 0``): BLIS uses ``2 × max_requests``; a standard
   client's arrivals are strictly increasing (IAT ≥ 1) and each client has its own RNG, so
   its requests beyond the first ``max_requests`` can never survive step 7 — we stop there,
   which yields the identical request list with half the work;
6. each client with ``λ > 0`` gets a child RNG ``R`` seeded by ``G.Int63()``; then
   ``t = 0``; repeat: ``t += IAT(R)``; stop at the horizon; skip (no draws) outside the
   lifecycle windows; draw input length, output length, input IDs, output IDs (multimodal:
   modality lengths, input IDs, output length, output IDs); prepend the group prefix;
7. stable-sort by arrival (ties keep client order), truncate to ``max_requests``, name the
   requests ``request_<index>``.

Token IDs are uniform in ``[0, 128000)``, drawn vectorised (``R.integers(..., size=n)``).
Bit-parity with Go's ``math/rand`` is impossible; determinism and structure are kept.
"""

from __future__ import annotations

import numpy as np

from blis_simpy.errors import ConfigError
from blis_simpy.request import Request
from blis_simpy.rng import child_seed, derive_seed, numpy_rng
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.samplers import LengthSampler, make_arrival_sampler, make_length_sampler
from blis_simpy.workload.spec import (
    ClientSpec,
    DistSpec,
    MultimodalSpec,
    WorkloadSpecV2,
    upgrade_v1,
    validate_spec,
)

VOCAB_SIZE = 128_000
DEFAULT_PREFIX_LENGTH = 50
SESSION_DEFAULT_TIMEOUT_US = 300_000_000
RNG_STREAM = "workload-gen"
CLIENT_CAP_FACTOR = 1  # BLIS: 2; 1 gives the same requests (module docstring, step 5)


def prepare_spec(spec: WorkloadSpecV2) -> list[ClientSpec]:
    """Step 1: upgrade, validate, and return the working client list (standard clients)."""
    spec = upgrade_v1(spec)
    validate_spec(spec)
    if spec.inference_perf is not None:
        raise ConfigError("inference_perf workloads are not supported yet", field="inference_perf")
    if spec.servegen_data is not None:
        raise ConfigError("servegen_data workloads are not supported yet", field="servegen_data")
    if spec.cohorts:
        raise ConfigError("cohorts are not supported yet", field="cohorts")
    for i, c in enumerate(spec.clients):
        if c.reasoning is not None and c.reasoning.multi_turn is not None:
            raise ConfigError("multi-turn sessions are not supported yet",
                              field=f"client[{i}].reasoning.multi_turn")
    return list(spec.clients)


def is_closed_loop(c: ClientSpec) -> bool:
    """``closed_loop`` if given, else true iff the client has ``reasoning.multi_turn``."""
    if c.closed_loop is not None:
        return c.closed_loop
    return c.reasoning is not None and c.reasoning.multi_turn is not None


def compute_deadline(arrival_us: int, c: ClientSpec) -> int:
    """Absolute deadline in µs (0 = none): ``timeout`` if given (0 ⇒ none), else the 300 s
    session default for closed-loop clients, else none."""
    if c.timeout is not None:
        return arrival_us + c.timeout if c.timeout > 0 else 0
    return arrival_us + SESSION_DEFAULT_TIMEOUT_US if is_closed_loop(c) else 0


def client_rates(spec: WorkloadSpecV2, clients: list[ClientSpec]) -> list[float]:
    """Per-client rates in requests per µs (fractions normalised; all zero ⇒ all 0)."""
    total = sum(c.rate_fraction for c in clients)
    if total <= 0:
        return [0.0] * len(clients)
    return [spec.aggregate_rate * c.rate_fraction / total / 1e6 for c in clients]


def draw_prefixes(clients: list[ClientSpec], g: np.random.Generator) -> dict[str, np.ndarray]:
    """Step 4: one token-ID array per prefix group, drawn from ``g`` in client order."""
    prefixes: dict[str, np.ndarray] = {}
    for c in clients:
        grp = c.prefix_group
        if grp and grp not in prefixes:
            n = next((d.prefix_length for d in clients
                      if d.prefix_group == grp and d.prefix_length > 0), DEFAULT_PREFIX_LENGTH)
            prefixes[grp] = g.integers(0, VOCAB_SIZE, size=n, dtype=np.int32)
    return prefixes


class _Multimodal:
    """Samplers of §6: text, then (count, per-item sizes) for image, audio, video."""

    def __init__(self, mm: MultimodalSpec, field: str):
        def mk(d: DistSpec | None, name: str) -> LengthSampler | None:
            return None if d is None else make_length_sampler(d.type, d.params, f"{field}.{name}")

        self.text = mk(mm.text_distribution, "text_distribution")
        self.media: list[tuple[LengthSampler, LengthSampler] | None] = []
        for m in ("image", "audio", "video"):
            size, count = getattr(mm, f"{m}_distribution"), getattr(mm, f"{m}_count_distribution")
            self.media.append((mk(count, f"{m}_count_distribution"), mk(size, f"{m}_distribution"))
                              if size is not None and count is not None else None)

    def sample(self, rng: np.random.Generator) -> tuple[int, int, int, int]:
        text = self.text.sample(rng) if self.text is not None else 0
        sums = []
        for pair in self.media:
            if pair is None:
                sums.append(0)
                continue
            count, size = pair
            sums.append(sum(size.sample(rng) for _ in range(count.sample(rng))))
        return text, sums[0], sums[1], sums[2]


def _client_requests(c: ClientSpec, idx: int, rate: float, rng: np.random.Generator,
                     prefix: np.ndarray | None, horizon: int, cap: int | None) -> list[Request]:
    """Step 6 for one standard client: its requests in arrival order (IDs unset)."""
    f = f"client[{idx}]"
    arrival = make_arrival_sampler(c.arrival.process, rate, c.arrival.cv, f"{f}.arrival")
    out_s = make_length_sampler(c.output_distribution.type, c.output_distribution.params,
                                f"{f}.output_distribution")
    mm = _Multimodal(c.multimodal, f"{f}.multimodal") if c.multimodal is not None else None
    in_s = None
    if mm is None:
        d = c.input_distribution
        in_s = make_length_sampler(d.type, d.params, f"{f}.input_distribution")
    windows = [(w.start_us, w.end_us) for w in c.lifecycle.windows] if c.lifecycle else []
    end = horizon
    if windows:  # nothing is generated after the last window: stop there (same result)
        end = min(end, max(e for _, e in windows))
    plen = 0 if prefix is None else len(prefix)
    out: list[Request] = []
    t = 0
    integers = rng.integers
    while t < end and (cap is None or len(out) < cap):
        t += arrival.iat(rng)
        if t >= end:
            break
        if windows and not any(s <= t < e for s, e in windows):
            continue
        mod = (0, 0, 0, 0)
        if mm is None:
            n_in = in_s.sample(rng)
            n_out = out_s.sample(rng)
            ids = integers(0, VOCAB_SIZE, size=n_in + n_out, dtype=np.int32)
            inp, outp = ids[:n_in], ids[n_in:]
        else:
            mod = mm.sample(rng)
            inp = integers(0, VOCAB_SIZE, size=sum(mod) or 1, dtype=np.int32)
            n_out = out_s.sample(rng)
            outp = integers(0, VOCAB_SIZE, size=n_out, dtype=np.int32)
        if plen:
            inp = np.concatenate((prefix, inp))
        out.append(Request(
            "", t, inp, outp, max_output_len=len(outp), deadline_us=compute_deadline(t, c),
            tenant_id=c.tenant_id, slo_class=c.slo_class, client_id=c.id,
            prefix_group=c.prefix_group, prefix_length=plen, streaming=c.streaming,
            model=c.model, text_tokens=mod[0], image_tokens=mod[1], audio_tokens=mod[2],
            video_tokens=mod[3]))
    return out


def generate_requests(spec: WorkloadSpecV2, *, seed: int | None = None,
                      horizon: int | None = None, max_requests: int | None = None) -> list[Request]:
    """Generate the requests of a v2 spec, sorted by arrival, named ``request_<i>``.

    ``seed`` (default ``spec.seed``) is the workload seed; ``horizon`` in µs (default
    ``spec.horizon`` if > 0, else unbounded); ``max_requests`` (default
    ``spec.num_requests``; ≤ 0 = unlimited). The CLI passes the explicitly given flags.
    """
    clients = prepare_spec(spec)
    seed = spec.seed if seed is None else seed
    if horizon is None:
        horizon = spec.horizon if spec.horizon > 0 else MAX_INT64
    elif horizon <= 0:
        raise ConfigError(f"must be > 0, got {horizon}", field="horizon")
    if max_requests is None:
        max_requests = spec.num_requests
    if max_requests <= 0 and horizon >= MAX_INT64:
        raise ConfigError("workload requires either num_requests or --horizon to bound generation",
                          field="num_requests")
    g = numpy_rng(derive_seed(seed, RNG_STREAM))
    rates = client_rates(spec, clients)
    prefixes = draw_prefixes(clients, g)
    cap = CLIENT_CAP_FACTOR * max_requests if max_requests > 0 else None
    reqs: list[Request] = []
    for i, (c, rate) in enumerate(zip(clients, rates, strict=True)):
        if rate <= 0:
            continue
        rng = numpy_rng(child_seed(g))
        reqs.extend(_client_requests(c, i, rate, rng, prefixes.get(c.prefix_group), horizon, cap))
    reqs.sort(key=lambda r: r.arrival_us)  # stable: ties keep client order
    if max_requests > 0:
        del reqs[max_requests:]
    for i, r in enumerate(reqs):
        r.id = f"request_{i}"
    return reqs
