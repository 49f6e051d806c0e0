"""BLIS's CLI distribution mode and workload presets (docs/workloads.md, "Distribution mode
and presets").

Both synthesise a one-client v2 spec: client ``distribution`` (rate fraction 1.0), constant
arrivals at ``rate`` requests per second (``--arrival poisson|gamma`` for the others),
Gaussian prompt and output lengths (tokens), and — when ``prefix_tokens > 0`` — the shared
prefix group ``shared`` of that many tokens.

Validation (distribution mode only, errors name the flag): min and max ≥ 1, stdev ≥ 0,
min ≤ max, and — BLIS quirk kept for parity — both the mean *and the stdev* must lie in
``[min, max]`` (so a stdev of 0 is always rejected).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

from blis_simpy.errors import ConfigError
from blis_simpy.workload.spec import ArrivalSpec, ClientSpec, DistSpec, WorkloadSpecV2

DISTRIBUTION_CLIENT_ID = "distribution"
#: ``--arrival`` choices; ``constant`` is BLIS's distribution mode
DISTRIBUTION_ARRIVALS = ("constant", "poisson", "gamma")
log = logging.getLogger(__name__)
SHARED_PREFIX_GROUP = "shared"


class LengthParams(NamedTuple):
    """A clamped Gaussian token-length distribution (tokens)."""

    mean: int
    stdev: int
    min: int
    max: int

    def to_dist(self) -> DistSpec:
        return DistSpec(type="gaussian", params={
            "mean": float(self.mean), "std_dev": float(self.stdev),
            "min": float(self.min), "max": float(self.max)})


class Preset(NamedTuple):
    """A ``defaults.yaml`` workload preset."""

    prefix_tokens: int
    prompt: LengthParams
    output: LengthParams


#: ``defaults.yaml`` ``workloads:`` (BLIS's presets).
PRESETS: dict[str, Preset] = {
    "chatbot": Preset(0, LengthParams(256, 100, 2, 800), LengthParams(256, 100, 1, 1024)),
    "contentgen": Preset(0, LengthParams(1024, 150, 10, 2048), LengthParams(1024, 200, 10, 2048)),
    "summarization": Preset(0, LengthParams(4096, 500, 100, 8192), LengthParams(512, 150, 10, 2048)),
    "multidoc": Preset(0, LengthParams(10240, 1200, 500, 20480), LengthParams(1536, 300, 50, 4096)),
}

DEFAULT_PROMPT = LengthParams(512, 256, 2, 7000)
DEFAULT_OUTPUT = LengthParams(512, 256, 2, 7000)

#: the key under a distribution workload (``workload.<key>`` of a scenario) of each field
#: label this module's errors name (``--rate``, ``--prompt-tokens-stdev``, …)
FIELD_KEYS = {"--rate": "rate", "--num-requests": "num_requests",
              "--prefix-tokens": "prefix_tokens", "--arrival": "arrival", "--arrival-cv": "arrival_cv",
              **{f"--{w.replace('_', '-')}{suffix}": f"{w}.{part}"
                 for w in ("prompt_tokens", "output_tokens")
                 for suffix, part in (("", "mean"), ("-stdev", "stdev"), ("-min", "min"), ("-max", "max"))}}


def validate_lengths(flag: str, p: LengthParams) -> None:
    """BLIS's distribution-flag checks for ``--<flag>`` (``prompt-tokens`` / ``output-tokens``)."""
    mean_f, std_f, min_f, max_f = (f"--{flag}", f"--{flag}-stdev", f"--{flag}-min", f"--{flag}-max")
    if p.min < 1:
        raise ConfigError(f"must be >= 1, got {p.min}", field=min_f)
    if p.max < 1:
        raise ConfigError(f"must be >= 1, got {p.max}", field=max_f)
    if p.stdev < 0:
        raise ConfigError(f"must be >= 0, got {p.stdev}", field=std_f)
    if p.min > p.max:
        raise ConfigError(f"must be <= {max_f} ({p.max}), got {p.min}", field=min_f)
    if not p.min <= p.mean <= p.max:
        raise ConfigError(f"must be in [{min_f}, {max_f}] = [{p.min}, {p.max}], got {p.mean}",
                          field=mean_f)
    if not p.min <= p.stdev <= p.max:
        raise ConfigError(f"must be in [{min_f}, {max_f}] = [{p.min}, {p.max}], got {p.stdev}",
                          field=std_f)


def _synthesise(rate: float, num_requests: int, seed: int, prompt: LengthParams,
                output: LengthParams, prefix_tokens: int, client_id: str,
                arrival: ArrivalSpec | None = None) -> WorkloadSpecV2:
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"must be a finite number > 0 (req/s), got {rate}", field="--rate")
    if num_requests < 0:
        raise ConfigError(f"must be >= 0, got {num_requests}", field="--num-requests")
    if prefix_tokens < 0:
        raise ConfigError(f"must be >= 0, got {prefix_tokens}", field="--prefix-tokens")
    client = ClientSpec(
        id=client_id, rate_fraction=1.0, arrival=arrival or ArrivalSpec(process="constant"),
        input_distribution=prompt.to_dist(), output_distribution=output.to_dist(),
        prefix_group=SHARED_PREFIX_GROUP if prefix_tokens > 0 else "",
        prefix_length=prefix_tokens if prefix_tokens > 0 else 0)
    return WorkloadSpecV2(version="2", seed=seed, category="language", aggregate_rate=float(rate),
                          num_requests=num_requests, clients=[client])


def distribution_spec(rate: float = 1.0, num_requests: int = 100, seed: int = 42,
                      prompt: LengthParams = DEFAULT_PROMPT, output: LengthParams = DEFAULT_OUTPUT,
                      prefix_tokens: int = 0, arrival: str = "constant",
                      arrival_cv: float | None = None) -> WorkloadSpecV2:
    """The v2 spec of ``--workload distribution``: ``rate`` in req/s, lengths in tokens.

    ``arrival`` (``--arrival``): the client's arrival process, ``constant`` (BLIS's: gaps of
    exactly 1/rate), ``poisson`` or ``gamma`` with coefficient of variation ``arrival_cv``
    (default 1.0; ignored with a warning by the other processes). The gaps are drawn from the
    client's own seeded generator (docs/workloads.md, "Arrival processes").

    Raises ConfigError naming the offending flag (``--prompt-tokens-stdev``, ``--rate``, …).
    """
    prompt, output = LengthParams(*prompt), LengthParams(*output)
    validate_lengths("prompt-tokens", prompt)
    validate_lengths("output-tokens", output)
    if arrival not in DISTRIBUTION_ARRIVALS:
        raise ConfigError(f"must be one of {', '.join(DISTRIBUTION_ARRIVALS)}, got {arrival!r}",
                          field="--arrival")
    if arrival_cv is not None and not (math.isfinite(arrival_cv) and arrival_cv > 0):
        raise ConfigError(f"must be a finite number > 0, got {arrival_cv}", field="--arrival-cv")
    if arrival_cv is not None and arrival != "gamma":
        log.warning("--arrival-cv is ignored: the arrival process is %s, not gamma", arrival)
        arrival_cv = None
    return _synthesise(rate, num_requests, seed, prompt, output, prefix_tokens,
                       DISTRIBUTION_CLIENT_ID, ArrivalSpec(process=arrival, cv=arrival_cv))


def preset_spec(name: str, rate: float = 1.0, num_requests: int = 100, seed: int = 42,
                client_id: str = DISTRIBUTION_CLIENT_ID,
                presets: dict[str, Preset] | None = None) -> WorkloadSpecV2:
    """The v2 spec of ``--workload <preset>`` (no length validation, as in BLIS).

    ``client_id`` is ``distribution`` for ``run`` and ``preset-<name>`` for ``convert preset``;
    ``presets`` replaces the built-in table (a defaults.yaml ``workloads:`` section).
    """
    table = PRESETS if presets is None else presets
    p = table.get(name)
    if p is None:
        raise ConfigError(f"unknown workload {name!r} (valid: distribution, "
                          f"{', '.join(table)})", field="--workload")
    return _synthesise(rate, num_requests, seed, p.prompt, p.output, p.prefix_tokens, client_id)
