"""A generated workload as a stream (docs/performance.md, "Very long runs").

:func:`~blis_simpy.workload.generator.generate_workload` builds every request of a spec,
token IDs included, before the simulation starts (about 2.6 KB a request: 26 GB for ten
million), then sorts them by arrival. When every client is a standard one (no multi-turn
sessions, whose rounds do not come in arrival order) and ``num_requests`` bounds the
workload, :class:`GeneratedRequestStream` gives the same requests — same IDs, same token
IDs, same order — one at a time as the arrival process reaches them:

* each client draws from its own generator (seeded as in the list path, in client order),
  and its arrivals are strictly increasing, so a k-way merge of the clients' lazy streams
  (:func:`heapq.merge`: ties keep client order, as the list path's stable sort) cut after
  ``num_requests`` is the sorted, truncated list, drawn in the same order per client;
* at most one request per client exists ahead of the arrival process.

``len()`` (the offered count, needed when the run starts) is ``num_requests`` when no
horizon and no lifecycle window can stop a client earlier; otherwise a first pass generates
the workload once, keeping only the count (so a horizon-bound stream costs its generation
twice, never its memory).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import islice
from operator import attrgetter

from blis_simpy.errors import ConfigError
from blis_simpy.request import Request
from blis_simpy.rng import child_seed, derive_seed, numpy_rng
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.arrivals import make_arrival_sampler
from blis_simpy.workload.generator import (
    RNG_STREAM,
    _windows,
    client_arrival_times,
    client_arrivals,
    client_rates,
    draw_prefixes,
    is_multi_turn,
    prepare_generation,
)
from blis_simpy.workload.samplers import RequestSampler
from blis_simpy.workload.spec import WorkloadSpecV2

__all__ = ["GeneratedRequestStream", "stream_workload"]

_arrival_us = attrgetter("arrival_us")


def stream_workload(spec: WorkloadSpecV2, *, seed: int | None = None, horizon: int | None = None,
                    max_requests: int | None = None, base_dir: str | None = None
                    ) -> GeneratedRequestStream | None:
    """The requests of :func:`~blis_simpy.workload.generator.generate_requests` (same
    arguments, same checks and errors) as a :class:`GeneratedRequestStream`, or None when
    the spec must be generated as a list: a multi-turn client, or no request cap."""
    spec, clients, horizon, max_requests = prepare_generation(spec, horizon, max_requests, base_dir)
    if max_requests <= 0 or any(is_multi_turn(c) for c in clients):
        return None
    return GeneratedRequestStream(spec, clients, spec.seed if seed is None else seed, horizon,
                                  max_requests)


class GeneratedRequestStream:
    """The requests of the standard ``clients`` of ``spec`` (expanded, validated) generated
    with workload ``seed``, before ``horizon_us`` (µs), at most ``max_requests``; built
    lazily. Each iteration generates them again (the same requests)."""

    def __init__(self, spec: WorkloadSpecV2, clients: list, seed: int, horizon_us: int,
                 max_requests: int):
        self.seed = seed
        self.horizon_us = horizon_us
        self.max_requests = max_requests
        g = numpy_rng(derive_seed(seed, RNG_STREAM))
        prefixes = draw_prefixes(clients, g)
        #: (client, arrival sampler, request sampler, its generator's seed, group prefix),
        #: for the clients with a positive rate, in client order (samplers built, and their
        #: errors raised, here: in the list path's order)
        self._clients = []
        for i, (c, rate) in enumerate(zip(clients, client_rates(spec, clients), strict=True)):
            if rate <= 0:
                continue
            rng_seed = child_seed(g)
            f = f"client[{i}]"
            arrival = make_arrival_sampler(c.arrival.process, rate, c.arrival.cv, f"{f}.arrival")
            self._clients.append((c, arrival, RequestSampler(c, f), rng_seed,
                                  prefixes.get(c.prefix_group)))
        unbounded = horizon_us >= MAX_INT64 and not any(_windows(c[0]) for c in self._clients)
        self._len: int | None = (max_requests if self._clients else 0) if unbounded else None

    def __len__(self) -> int:
        if self._len is None:    # the same draws as an iteration, without building requests
            times = [client_arrival_times(c, arrival, sampler, numpy_rng(rng_seed), self.horizon_us)
                     for c, arrival, sampler, rng_seed, _ in self._clients]
            merged = heapq.merge(*times) if len(times) > 1 else iter(times[0] if times else ())
            self._len = sum(1 for _ in islice(merged, self.max_requests))
        return self._len

    def _merged(self) -> Iterator[Request]:
        streams = [client_arrivals(c, arrival, sampler, numpy_rng(rng_seed), prefix, self.horizon_us)
                   for c, arrival, sampler, rng_seed, prefix in self._clients]
        if not streams:
            return iter(())
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_arrival_us)
        return islice(merged, self.max_requests)

    def __iter__(self) -> Iterator[Request]:
        n = len(self)
        k = -1
        for k, r in enumerate(self._merged()):
            r.id = f"request_{k}"
            yield r
        if k + 1 != n:     # only arrivals past 2^63 µs stop an unbounded client early
            raise ConfigError(f"the workload's arrivals pass {MAX_INT64} us after {k + 1} of "
                              f"{n} requests; set a horizon", field="num_requests")

    def count_arriving_after(self, t_us: int) -> int:
        """Requests arriving strictly after ``t_us`` (µs): none past the horizon."""
        if t_us >= self.horizon_us - 1:
            return 0
        return sum(1 for r in self._merged() if r.arrival_us > t_us)
