"""A small hand-made inference-perf results folder, laid out as the tool writes it.

Two constant stages (2 req/s x 2 s, then 1 req/s x 2 s: 4 + 2 requests) of a shared-prefix
workload with one group of two prompts (16-token system prompt, 16-token question, 3 output
tokens, ignore_eos), streaming, on meta-llama/llama-3.1-8b-instruct (exp-config.yaml). The
measured figures are round numbers chosen for hand-checked errors (seconds in the files).
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = """\
api:
  type: completion
  streaming: true
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 1
    num_prompts_per_group: 2
    system_prompt_len: 16
    question_len: 16
    output_len: 3
load:
  type: constant
  interval: 1.0
  stages:
  - rate: 2.0
    duration: 2
  - rate: 1.0
    duration: 2
  num_workers: 4
  request_timeout: {timeout}
server:
  type: vllm
  model_name: meta-llama/Llama-3.1-8B-Instruct
  ignore_eos: true
"""

EXP = """\
model: meta-llama/Llama-3.1-8B-Instruct
tensor_parallelism: 1
max_model_len: 4096
max_num_batched_tokens: 2048
max_num_seqs: 128
app: inference-perf
"""


def lat(mean: float, median: float, p90: float, p99: float, mx: float) -> dict:
    """A latency summary in seconds, with the keys inference-perf writes."""
    return {"mean": mean, "min": 0.0, "p0.1": 0.0, "p1": 0.0, "median": median, "p90": p90,
            "p99": p99, "p99.9": mx, "max": mx}


def lifecycle(ok: int, failed: int, *, e2e, ttft, itl, tpot, prompt_len: float = 32.0,
              output_len: float = 3.0, fail_max: float | None = None) -> dict:
    return {
        "load_summary": {"count": ok + failed, "schedule_delay": lat(0.0, 0.0, 0.0, 0.0, 0.0)},
        "successes": {
            "count": ok,
            "latency": {"request_latency": lat(*e2e) if ok else None,
                        "normalized_time_per_output_token": lat(0.001, 0.001, 0.001, 0.001, 0.001) if ok else None,
                        "time_per_output_token": lat(*tpot) if ok else None,
                        "time_to_first_token": lat(*ttft) if ok else None,
                        "inter_token_latency": lat(*itl) if ok else None},
            "throughput": {"requests_per_sec": 1.0},
            "prompt_len": lat(prompt_len, prompt_len, prompt_len, prompt_len, prompt_len) if ok else None,
            "output_len": lat(output_len, output_len, output_len, output_len, output_len) if ok else None,
        },
        "failures": {"count": failed,
                     "request_latency": lat(fail_max, fail_max, fail_max, fail_max, fail_max) if failed else None,
                     "prompt_len": None},
    }


# stage 0: E2E 4 ms, TTFT 2 ms, ITL/TPOT 1 ms; stage 1: E2E 6 ms, TTFT 2 ms, ITL/TPOT 2 ms
STAGE0 = dict(e2e=(0.004, 0.004, 0.005, 0.006, 0.006), ttft=(0.002, 0.002, 0.002, 0.003, 0.003),
              itl=(0.001, 0.001, 0.001, 0.001, 0.001), tpot=(0.001, 0.001, 0.001, 0.001, 0.001))
STAGE1 = dict(e2e=(0.006, 0.006, 0.006, 0.006, 0.006), ttft=(0.002, 0.002, 0.002, 0.002, 0.002),
              itl=(0.002, 0.002, 0.002, 0.002, 0.002), tpot=(0.002, 0.002, 0.002, 0.002, 0.002))
TOTAL = dict(e2e=(0.005, 0.005, 0.006, 0.006, 0.006), ttft=(0.002, 0.002, 0.002, 0.003, 0.003),
             itl=(0.0015, 0.001, 0.002, 0.002, 0.002), tpot=(0.0015, 0.001, 0.002, 0.002, 0.002))


def write_run(root: Path, name: str = "run-a", *, timeout: str = "null", summary: bool = True,
              exp: bool = True) -> Path:
    """The folder ``root/name`` (exp-config.yaml + results/); returns it."""
    run = root / name
    res = run / "results"
    res.mkdir(parents=True)
    (res / "config.yaml").write_text(CONFIG.format(timeout=timeout))
    if exp:
        (run / "exp-config.yaml").write_text(EXP)
    files = {"stage_0_lifecycle_metrics.json": lifecycle(4, 0, **STAGE0),
             "stage_1_lifecycle_metrics.json": lifecycle(2, 0, **STAGE1)}
    if summary:
        files["summary_lifecycle_metrics.json"] = lifecycle(6, 0, **TOTAL)
    for fname, doc in files.items():
        (res / fname).write_text(json.dumps(doc, indent=2))
    return run
