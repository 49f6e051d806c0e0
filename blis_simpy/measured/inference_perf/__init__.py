"""An inference-perf results folder read into an
:class:`~blis_simpy.measured.run.AggregateRun` (docs/workloads.md, "inference-perf results").

The folder is a run folder holding ``results/`` (and optionally ``exp-config.yaml`` and
``model_config/config.json``) or the ``results`` folder itself. ``results/config.yaml`` is the
configuration as it ran (:mod:`.config`); ``results/stage_N_lifecycle_metrics.json`` (one per
stage that sent requests) and ``results/summary_lifecycle_metrics.json`` (optional: without it
there is no whole-run percentile to compare) the measured aggregates (:mod:`.lifecycle`);
the workload is rebuilt from the configuration (:mod:`.rebuild`).

``exp-config.yaml`` (the harness's record of the server: ``model``, ``tensor_parallelism``,
``max_model_len``, ``max_num_batched_tokens``, ``max_num_seqs``; other keys ignored) gives
the :class:`~blis_simpy.measured.run.Settings`; its absence leaves them None (calibrate then
needs ``--scenario`` or ``--model``). It never names the GPU or the KV blocks: ``--hardware``
and ``--total-kv-blocks`` give them. A ``model_config/config.json`` beside it is the model's
shape.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from blis_simpy.config.loader import read_mapping
from blis_simpy.config.scenario import EngineConfig
from blis_simpy.errors import ConfigError
from blis_simpy.measured.inference_perf.config import IPConfig, read_config
from blis_simpy.measured.inference_perf.lifecycle import read_lifecycle
from blis_simpy.measured.inference_perf.rebuild import pause_us, rebuild, timeout_us_of
from blis_simpy.measured.run import AggregateRun, AggregateStats, Settings
from blis_simpy.measured.vllm_meta import MAX_SETTING
from blis_simpy.workload.tracev2 import TraceHeader, TraceServer

__all__ = ["DEFAULT_SEED", "is_inference_perf", "load_inference_perf", "with_seed"]

#: the rebuild's seed unless calibrate/fit is given another (``--seed`` or the scenario's)
DEFAULT_SEED = 42
CONFIG = "config.yaml"
SUMMARY = "summary_lifecycle_metrics.json"


def results_folder(path: str | os.PathLike) -> Path | None:
    """The ``results`` folder of an inference-perf run folder (or the folder itself when it
    is one), None when ``path`` is neither."""
    p = Path(path)
    if (p / "results" / CONFIG).is_file():
        return p / "results"
    if (p / CONFIG).is_file() and ((p / SUMMARY).is_file() or (p / "stage_0_lifecycle_metrics.json").is_file()):
        return p
    return None


def is_inference_perf(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and results_folder(path) is not None


def _settings(path: Path, seed: int) -> Settings:
    data, src = read_mapping(str(path), "an experiment configuration")
    eng = EngineConfig()

    def integer(key: str, default: int | None, *aliases: str) -> int | None:
        names = [k for k in (key, *aliases) if data.get(k) is not None]
        if not names:
            if default is None:
                raise src.error("missing", (key,))
            return default
        v = data[names[0]]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SETTING:
            raise src.error(f"not an integer in [1, {MAX_SETTING}]: {v!r}", (names[0],))
        return v

    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise src.error("missing or not a model name", ("model",))
    cfg_dir = path.parent / "model_config"
    has_cfg = (cfg_dir / "config.json").is_file()
    return Settings(
        model=model.strip().lower(), model_from=f"{path.name} model", hardware="",
        hardware_from="not recorded: --hardware or --scenario gives it",
        tp=integer("tensor_parallelism", 1, "tensor_parallel_size"),
        dp=integer("data_parallelism", 1, "data_parallel_size"), expert_parallel=False,
        max_num_seqs=integer("max_num_seqs", eng.max_num_running_reqs),
        max_num_batched_tokens=integer("max_num_batched_tokens", eng.max_num_scheduled_tokens),
        max_model_len=integer("max_model_len", 0) or 0, block_size=eng.block_size, kv_blocks=None,
        gpu_memory_utilization=eng.gpu_memory_utilization, prefix_caching=True, seed=seed,
        model_config_folder=str(cfg_dir) if has_cfg else "")


def _pooled(stages: list[AggregateStats]) -> tuple[float | None, float | None]:
    """The successes' mean prompt and output lengths over the stages (success-weighted)."""
    out = []
    for key in ("prompt_len_mean", "output_len_mean"):
        pairs = [(s.successes, getattr(s, key)) for s in stages if getattr(s, key) is not None]
        n = sum(c for c, _ in pairs)
        out.append(sum(c * v for c, v in pairs) / n if n else None)
    return out[0], out[1]


def _measurement_notes(stats: AggregateStats | None, decoded: float, ignore_eos: bool) -> list[str]:
    """What the results say about inference-perf's own token counts: a short count of the
    streamed text, and chunks that are not tokens (its TPOT and ITL are per chunk)."""
    if stats is None or stats.successes == 0:
        return []
    notes = []
    out = stats.output_len_mean
    if ignore_eos and out is not None and out < 0.95 * decoded:
        notes.append(f"inference-perf counted {out:.1f} output tokens per request, the server decoded "
                     f"{decoded:g} (ignore_eos): the three-number score's ITL divides by the decoded length")
    lat = stats.latency_ms
    if all(m in lat for m in ("e2e", "ttft", "tpot")) and lat["tpot"]["mean"] > 0 and decoded > 1:
        gaps = (lat["e2e"]["mean"] - lat["ttft"]["mean"]) / lat["tpot"]["mean"]
        per_token = gaps / (decoded - 1)
        if abs(per_token - 1.0) > 0.1:
            notes.append(f"inference-perf's TPOT and ITL are per streamed chunk: (mean E2E - mean TTFT) / mean "
                         f"TPOT gives about {gaps:.0f} chunk gaps for {decoded - 1:g} token gaps "
                         f"({per_token:.2f} a token), so they are not per-token latencies; the score's ITL is")
    return notes


def _build(run: AggregateRun, cfg: IPConfig, seed: int) -> AggregateRun:
    """``run`` with its workload rebuilt from ``cfg`` with ``seed``."""
    total = run.real_total
    prompt, output = (total.prompt_len_mean, total.output_len_mean) if total is not None else _pooled(run.real_stages)
    drains = [math.ceil(s.max_latency_ms * 1000) for s in run.real_stages]
    timeout = timeout_us_of(cfg)
    rb = rebuild(cfg, seed, prompt_len_mean=prompt, output_len_mean=output, drains_us=drains, timeout_us=timeout)
    st = run.settings
    header = TraceHeader(trace_version=2, mode="generated", workload_seed=seed,
                         workload_spec=f"inference-perf {cfg.data_type} / {cfg.load_type} ({cfg.path})",
                         server=TraceServer(type="vllm", model=cfg.model_name or (st.model if st else ""),
                                            tensor_parallel=st.tp if st else 0,
                                            max_num_seqs=st.max_num_seqs if st else 0,
                                            max_model_len=st.max_model_len if st else 0))
    base = [n for n in run.notes if not n.startswith(("rebuild: ", "measured: "))]
    measured = _measurement_notes(total if total is not None else (run.real_stages[0] if run.real_stages else None),
                                  rb.mean_output_tokens, cfg.ignore_eos)
    notes = base + [f"rebuild: {n}" for n in rb.notes] + [f"measured: {n}" for n in measured]
    return replace(run, header=header, records=rb.records, stages=rb.stages, seed=seed,
                   decoded_output_len=rb.mean_output_tokens, notes=notes,
                   settings=replace(st, seed=seed) if st is not None else None)


def with_seed(run: AggregateRun, seed: int) -> AggregateRun:
    """``run`` rebuilt with another seed (itself when the seed is the same)."""
    return run if seed == run.seed else _build(run, run.spec, seed)


def load_inference_perf(path: str | os.PathLike, seed: int = DEFAULT_SEED) -> AggregateRun:
    """Read and check an inference-perf results folder and rebuild its workload (module
    docstring)."""
    p = Path(path)
    res = results_folder(p)
    if res is None:
        raise ConfigError(f"not an inference-perf results folder (no results/{CONFIG})", file=str(p))
    run_dir = res.parent if res != p else (p.parent if (p.parent / "exp-config.yaml").is_file() else p)
    cfg = read_config(str(res / CONFIG))
    notes: list[str] = []
    stages = []
    for k, st in enumerate(cfg.stages):
        f = res / f"stage_{k}_lifecycle_metrics.json"
        if st.requests == 0:
            stages.append(AggregateStats(0, 0, {}, None, None, 0.0))
            continue
        if not f.is_file():
            raise ConfigError(f"missing file: stage {k} sent {st.requests} requests (load.stages[{k}] of "
                              f"{CONFIG}) and has no lifecycle metrics", file=str(f))
        stats, sent = read_lifecycle(f)
        if sent != st.requests:
            notes.append(f"stage {k}: the results count {sent} requests sent, the configuration "
                         f"int(rate x duration) = {st.requests}; the rebuild sends {st.requests}")
        stages.append(stats)
    total = read_lifecycle(res / SUMMARY)[0] if (res / SUMMARY).is_file() else None
    if total is None:
        notes.append(f"no {SUMMARY}: whole-run percentiles are not compared (means are pooled from the stages)")
    exp = run_dir / "exp-config.yaml"
    settings = _settings(exp, seed) if exp.is_file() else None
    if cfg.timeout_default:
        notes.append(f"load.request_timeout is null: the client's timeout is aiohttp's default "
                     f"{cfg.timeout_s:g} s")
    if not cfg.streaming:
        notes.append("api.streaming is off: inference-perf records no TTFT, ITL or TPOT; only E2E is compared")
    run = AggregateRun(name=run_dir.name, source=str(p), settings=settings, header=TraceHeader(trace_version=2),
                       records=[], stages=[], real_stages=stages, real_total=total,
                       timeout_us=timeout_us_of(cfg), pause_us=pause_us(cfg), decoded_output_len=0.0,
                       seed=seed, notes=notes, spec=cfg)
    return _build(run, cfg, seed)
