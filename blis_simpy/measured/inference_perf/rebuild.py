"""The workload of an inference-perf run, rebuilt as the tool generated it (docs/workloads.md,
"inference-perf results"; sources: kubernetes-sigs/inference-perf ``datagen/*.py``,
``loadgen/load_timer.py``, ``loadgen/load_generator.py``).

* **shared_prefix**: ``num_groups`` system prompts of ``system_prompt_len`` random tokens,
  each followed by ``num_prompts_per_group`` questions of ``question_len`` random tokens; the
  ``P`` prompts are shuffled once, and request ``j`` of every stage sends prompt ``j mod P`` of
  that order (the data generator restarts at the first prompt each stage), so repeated prompts
  are full prefix-cache hits and a group's prompts share its system prompt.
* **random**: request ``j`` of a stage has ``input[j]`` fresh random tokens and asks for
  ``output[j]`` tokens, the lengths drawn once as inference-perf does (normal(mean,
  std_dev), clipped to [min, max], rounded, ``total_count`` values; indices wrap past it);
  no token is shared. **synthetic**: the same lengths, each prompt the first ``input[j]``
  tokens of one fixed text, so prompts share prefixes.
* **Lengths.** The prompt text is decoded from random token IDs and tokenized again by the
  server, which changes its length; when the results give the successes' mean prompt length
  (inference-perf's count of the text), every prompt length is scaled by that mean over the
  configured one (a system prompt and its questions in proportion, rounded to the nearest
  token, ties to even). With ``ignore_eos`` the server decodes exactly the tokens asked
  for; without it, output lengths are scaled down to the measured mean (never up).
* **Sends.** A constant stage of rate ``r`` and duration ``d`` sends ``int(r·d)`` requests at
  the cumulative sums of exponential(1/r) gaps scaled to add up to ``d``, after the stage's
  start; a poisson stage draws a Poisson(r) count per second and spreads each second's
  requests the same way (the counts of :data:`POISSON_BLOCK_S` seconds at a time, then the
  gaps of each non-empty second). Send times are rounded to the µs.
* **Stages** run one after another: a stage's timer starts :func:`pause_us` after the
  previous stage has drained (every request finished or failed). Here the drain is the real
  one at most: the stage's last send plus its longest measured latency.
* **Timeout.** The client gives up ``timeout`` after a send (aiohttp rounds a total timeout
  over 5 s up to the event loop's next whole second): :func:`client_deadline_us`.

Token IDs are uniform in [0, 128000) like replay's. Draw order, from
``numpy_rng(derive_seed(seed, "inference-perf"))``: shared_prefix — per group its system
prompt then its questions, then the shuffle (``permutation(P)``); random/synthetic — the
input lengths then the output lengths (then, synthetic, the text); then each stage's gaps in
stage order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import MAX_TOKEN_IDS
from blis_simpy.measured.inference_perf.config import IPConfig, IPLengths, IPStage
from blis_simpy.measured.run import StageWindow
from blis_simpy.rng import derive_seed, numpy_rng
from blis_simpy.workload.replay import VOCAB_SIZE
from blis_simpy.workload.tracev2 import TraceRecord

RNG_STREAM = "inference-perf"
#: aiohttp rounds a timeout longer than this up to the loop's next whole second
#: (aiohttp helpers.py, ceil_timeout, ceil_threshold=5)
CEIL_THRESHOLD_US = 5_000_000
#: seconds of a poisson stage whose request counts are drawn at once
POISSON_BLOCK_S = 4096


@dataclass
class Rebuilt:
    """The rebuilt workload: records stage after stage (``stages`` say which), the mean
    output length asked for (tokens; the server decodes exactly that with ignore_eos), and
    notes on what was assumed."""

    records: list[TraceRecord]
    stages: list[StageWindow]
    mean_output_tokens: float
    notes: list[str]


def pause_us(cfg: IPConfig) -> int:
    """Between one stage draining and the next stage's timer start: ``load.interval``, plus the
    1 s a stage gives its workers to fill the request queue when they are separate processes
    (``num_workers`` > 0)."""
    return round((cfg.interval_s + (1.0 if cfg.num_workers > 0 else 0.0)) * 1e6)


def client_deadline_us(send_us: int, timeout_us: int) -> int:
    """When the client gives up on a request sent at ``send_us`` (µs on the rebuilt clock):
    ``send + timeout``, rounded up to a whole second when the timeout is over 5 s."""
    t = send_us + timeout_us
    if timeout_us > CEIL_THRESHOLD_US:
        t = -(-t // 1_000_000) * 1_000_000
    return t


def _normal_lengths(rng: np.random.Generator, d: IPLengths) -> np.ndarray:
    """inference-perf's ``generate_distribution`` (utils/distribution.py), normal case."""
    x = rng.normal(loc=d.mean, scale=d.std_dev, size=d.total_count)
    return np.clip(np.round(np.clip(x, d.min, d.max)).astype(np.int64), d.min, d.max)


def _scaled(n: np.ndarray | int, factor: float) -> np.ndarray:
    return np.maximum(np.round(np.asarray(n, dtype=np.float64) * factor).astype(np.int64), 1)


def _send_offsets_s(rng: np.random.Generator, cfg: IPConfig, stage: IPStage) -> np.ndarray:
    """Seconds after the stage's start of its ``requests`` sends (module docstring)."""
    n = stage.requests
    if cfg.load_type == "constant":
        gaps = rng.exponential(1.0 / stage.rate_rps, n)
        return np.cumsum(gaps * (stage.duration_s / gaps.sum()))
    out: list[float] = []
    second = 0
    while len(out) < n:      # per-second counts a block at a time (a slow rate has many empty seconds)
        counts = rng.poisson(stage.rate_rps, POISSON_BLOCK_S)
        for i in np.flatnonzero(counts).tolist():
            gaps = rng.exponential(1.0 / counts[i], counts[i])
            out.extend((second + i + np.cumsum(gaps / gaps.sum())).tolist())
            if len(out) >= n:
                break
        second += POISSON_BLOCK_S
    return np.asarray(out[:n])


def _shared_prefix(cfg: IPConfig, rng: np.random.Generator, prompt_len_mean: float | None,
                   notes: list[str]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The ``P`` shuffled prompts, their lengths and output lengths (tokens)."""
    groups, per, sys_len, q_len, out_len = cfg.shared_prefix
    scale = prompt_len_mean / (sys_len + q_len) if prompt_len_mean else 1.0
    s = round(sys_len * scale)
    t = max(round((sys_len + q_len) * scale), 1)
    if groups * per * t > MAX_TOKEN_IDS:
        raise ConfigError(f"{groups * per} prompts of {t} tokens are more than {MAX_TOKEN_IDS} token IDs",
                          file=cfg.path, field="data.shared_prefix")
    prompts = []
    for _ in range(groups):
        system = rng.integers(0, VOCAB_SIZE, size=min(s, t), dtype=np.int32)
        for _ in range(per):
            question = rng.integers(0, VOCAB_SIZE, size=t - len(system), dtype=np.int32)
            prompts.append(np.concatenate((system, question)))
    order = rng.permutation(len(prompts))
    prompts = [prompts[i] for i in order]
    if t != sys_len + q_len:
        notes.append(f"prompts of {t} tokens ({s} of them the group's system prompt) for the configured "
                     f"{sys_len} + {q_len}: scaled to the measured mean prompt length {prompt_len_mean:.2f}")
    n = len(prompts)
    return prompts, np.full(n, t, dtype=np.int64), np.full(n, out_len, dtype=np.int64)


def _distribution(cfg: IPConfig, rng: np.random.Generator, prompt_len_mean: float | None, n_max: int,
                  notes: list[str]) -> tuple[list[np.ndarray] | None, np.ndarray, np.ndarray]:
    """random/synthetic: (the prompts for synthetic, else None; input and output length per
    request index)."""
    ins = _normal_lengths(rng, cfg.input)
    outs = _normal_lengths(rng, cfg.output)
    if n_max > min(len(ins), len(outs)):
        notes.append(f"a stage sends {n_max} requests, more than the {min(len(ins), len(outs))} drawn "
                     "lengths (total_count): the lengths are used again from the first")
    if prompt_len_mean:
        scale = prompt_len_mean / float(ins[np.arange(n_max) % len(ins)].mean())
        ins = _scaled(ins, scale)
        notes.append(f"prompt lengths scaled by {scale:.4f}, to the measured mean prompt length "
                     f"{prompt_len_mean:.2f}")
    if cfg.data_type != "synthetic":
        return None, ins, outs
    if int(ins.max()) > MAX_TOKEN_IDS:
        raise ConfigError(f"a prompt of more than {MAX_TOKEN_IDS} tokens", file=cfg.path,
                          field="data.input_distribution.max")
    text = rng.integers(0, VOCAB_SIZE, size=int(ins.max()), dtype=np.int32)
    return [text[:n] for n in ins.tolist()], ins, outs


def rebuild(cfg: IPConfig, seed: int, *, prompt_len_mean: float | None, output_len_mean: float | None,
            drains_us: list[int], timeout_us: int | None) -> Rebuilt:
    """The workload of ``cfg`` (module docstring). ``prompt_len_mean``/``output_len_mean``:
    the measured means over the successes (None: unknown); ``drains_us``: per stage how long
    after its last send it drained, at most (places the next stage)."""
    rng = numpy_rng(derive_seed(seed, RNG_STREAM))
    notes: list[str] = []
    n_max = max(st.requests for st in cfg.stages)
    if cfg.shared_prefix is not None:
        prompts, ins, outs = _shared_prefix(cfg, rng, prompt_len_mean, notes)
    else:
        prompts, ins, outs = _distribution(cfg, rng, prompt_len_mean, n_max, notes)
    asked = float(outs[np.arange(n_max) % len(outs)].mean())
    if not cfg.ignore_eos and output_len_mean and output_len_mean < asked:
        outs = _scaled(outs, output_len_mean / asked)
        notes.append(f"ignore_eos is off: output lengths scaled down to the measured mean {output_len_mean:.2f}")
    records: list[TraceRecord] = []
    stages: list[StageWindow] = []
    start = 0
    for k, st in enumerate(cfg.stages):
        first = len(records)
        for j, off in enumerate(_send_offsets_s(rng, cfg, st).tolist()):
            send = start + round(off * 1e6)
            ids = prompts[j % len(prompts)] if prompts is not None else None
            records.append(TraceRecord(
                request_id=len(records), client_id=f"stage-{k}", streaming=cfg.streaming,
                input_tokens=int(ins[j % len(ins)]) if ids is None else len(ids),
                output_tokens=int(outs[j % len(outs)]), arrival_time_us=send, send_time_us=send,
                input_token_ids=ids))
        end = max([start + round(st.duration_s * 1e6)] + [r.send_time_us for r in records[first:]])
        stages.append(StageWindow(k, start, end, st.rate_rps, first, len(records) - first))
        start = end + (drains_us[k] if k < len(drains_us) else 0) + pause_us(cfg)
    records = place(records, stages, [s.start_us for s in stages], timeout_us)[0]
    mean_out = sum(r.output_tokens for r in records) / len(records)
    return Rebuilt(records, stages, mean_out, notes)


def place(records: list[TraceRecord], stages: list[StageWindow], starts_us: list[int],
          timeout_us: int | None) -> tuple[list[TraceRecord], list[StageWindow]]:
    """The records and stages with stage ``k`` moved to start at ``starts_us[k]`` (its sends
    keep their offsets from the stage start), each record's ``deadline_us`` the client's
    (:func:`client_deadline_us`; 0 without a timeout)."""
    out, windows = [], []
    for st, new in zip(stages, starts_us, strict=True):
        shift = new - st.start_us
        for r in records[st.first: st.first + st.count]:
            t = r.send_time_us + shift
            out.append(replace(r, arrival_time_us=t, send_time_us=t,
                               deadline_us=client_deadline_us(t, timeout_us) if timeout_us else 0))
        windows.append(replace(st, start_us=new, end_us=st.end_us + shift))
    return out, windows


def timeout_us_of(cfg: IPConfig) -> int:
    """The client's timeout in µs (at least 1)."""
    return max(1, math.ceil(cfg.timeout_s * 1e6))
