"""Per-request sampling: lengths, modality token counts and token IDs of one client's
requests, built from the length samplers (:mod:`blis_simpy.workload.lengths`); arrival
samplers are in :mod:`blis_simpy.workload.arrivals`."""

from __future__ import annotations

import logging

import numpy as np

from blis_simpy.workload.lengths import MAX_TOKENS, LengthSampler, make_length_sampler

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ requests

VOCAB_SIZE = 128_000   # token IDs are uniform in [0, VOCAB_SIZE)


def _dist_sampler(d, field: str) -> LengthSampler | None:
    """The length sampler of a DistSpec-like object (``.type``, ``.params``), or None."""
    return None if d is None else make_length_sampler(d.type, d.params, field)


class MultimodalSampler:
    """Per-modality token counts (docs/workloads.md): text, then (count, per-item sizes) for image,
    audio and video; a modality needs both its size and its count distribution."""

    def __init__(self, mm, field: str):
        self.text = _dist_sampler(mm.text_distribution, f"{field}.text_distribution")
        self.media: list[tuple[LengthSampler, LengthSampler] | None] = []
        for m in ("image", "audio", "video"):
            size, count = getattr(mm, f"{m}_distribution"), getattr(mm, f"{m}_count_distribution")
            self.media.append((_dist_sampler(count, f"{field}.{m}_count_distribution"),
                               _dist_sampler(size, f"{field}.{m}_distribution"))
                              if size is not None and count is not None else None)

    def sample(self, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """``(text, image, audio, video)`` token counts, together at most ``MAX_TOKENS``: a
        modality stops drawing item sizes once the request's total reaches the cap, and its
        sum is cut there (no draw changes below the cap)."""
        text = self.text.sample(rng) if self.text is not None else 0
        room = MAX_TOKENS - text
        sums = []
        for pair in self.media:
            if pair is None:
                sums.append(0)
                continue
            count, size = pair
            total = 0
            for _ in range(count.sample(rng)):
                total += size.sample(rng)
                if total >= room:
                    total = room
                    break
            room -= total
            sums.append(total)
        return text, sums[0], sums[1], sums[2]


class RequestSampler:
    """The lengths and token IDs of one request (or session round) of a client.

    Draw order (docs/workloads.md, "The workload-spec v2"): input length, output length,
    input IDs, output IDs; multimodal clients: the modality counts, input IDs, output length,
    output IDs. The reason ratio is a separate draw, :meth:`reason_ratio`. The client is any object
    with ``input_distribution``, ``output_distribution``, ``multimodal`` and ``reasoning``.
    """

    __slots__ = ("inp", "out", "mm", "ratio")

    def __init__(self, client, field: str = "client"):
        self.out = _dist_sampler(client.output_distribution, f"{field}.output_distribution")
        mm = client.multimodal
        self.mm = MultimodalSampler(mm, f"{field}.multimodal") if mm is not None else None
        self.inp = (None if self.mm is not None else
                    _dist_sampler(client.input_distribution, f"{field}.input_distribution"))
        r = client.reasoning
        self.ratio = (_dist_sampler(r.reason_ratio_distribution,
                                    f"{field}.reasoning.reason_ratio_distribution")
                      if r is not None else None)

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]:
        """``(input IDs, output IDs, (text, image, audio, video) counts)``; int32 arrays."""
        if self.mm is None:
            n_in = self.inp.sample(rng)
            n_out = self.out.sample(rng)
            ids = rng.integers(0, VOCAB_SIZE, size=n_in + n_out, dtype=np.int32)
            return ids[:n_in], ids[n_in:], (0, 0, 0, 0)
        mod = self.mm.sample(rng)
        inp = rng.integers(0, VOCAB_SIZE, size=sum(mod) or 1, dtype=np.int32)
        n_out = self.out.sample(rng)
        return inp, rng.integers(0, VOCAB_SIZE, size=n_out, dtype=np.int32), mod

    def reason_ratio(self, rng: np.random.Generator) -> float:
        """``clamp(sample / 100, 0, 1)`` (the sample is a percentage); 0 without a distribution."""
        if self.ratio is None:
            return 0.0
        return min(max(self.ratio.sample(rng) / 100.0, 0.0), 1.0)
