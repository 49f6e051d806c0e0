"""Leave-one-run-out accuracy of the physics step costs over real runs of several kinds.

Used by ``bench/realdata.py --cross-validate``. Every run — a per-request vLLM log
(``--data``) or an inference-perf results folder (``--aggregate-data``) — is replayed with the
``physics`` backend three times:

* **uncalibrated**: the physical default set (datasheet and measured sustained rates, the
  default fixed costs);
* **in-sample**: the step costs pre-fitted (``blis_simpy.fit.prefit.prefit_steps``) to the
  step observations of *every* run — the decode ticks of the logs, the stage means of the
  aggregate results (``blis_simpy.fit.aggregate_steps``);
* **held out**: the same fit without the run's own observations, so the run is predicted by
  costs it never informed.

The costs are shared across GPUs and models (multipliers of each GPU's own rates, and CPU
costs), never per run: a run of a GPU with no other run is predicted from the other GPUs'
runs and its own catalog figures. For each replay: the signed errors of mean E2E, mean TTFT
and mean ITL (per-token: ``(E2E − TTFT)/(decoded − 1)``) and their average of absolute
values, avg3 (docs/accuracy.md). Times in ms, errors in %.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from blis_simpy.build.resolve import Deployment, resolve
from blis_simpy.calibrate import scenario_data
from blis_simpy.calibrate.aggregate import calibrate_aggregate
from blis_simpy.calibrate.compare import compare
from blis_simpy.calibrate.twin import simulate
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.fit.aggregate_steps import case_steps
from blis_simpy.fit.prefit import StepObs, prefit_steps
from blis_simpy.fit.space import PhysicsSpace
from blis_simpy.observed.inference_perf import is_inference_perf, load_inference_perf
from blis_simpy.observed.vllm_log import load_vllm_log

MODES = ("uncalibrated", "in-sample", "held-out")


@dataclass
class Case:
    """One run: its scenario and resolved deployment, its step observations, and how to
    replay it with a set of coefficients."""

    name: str
    kind: str                     # "per-request" | "aggregate"
    gpu: str
    scenario: Scenario
    deployment: Deployment
    run: object
    obs: list[StepObs] = field(default_factory=list)   # made by cross_validate
    results: dict = field(default_factory=dict)      # mode -> errors

    def replay(self, dep: Deployment) -> dict:
        """Replay with ``dep``: signed errors (%) of the three means and avg3 (%)."""
        if self.kind == "aggregate":
            score = calibrate_aggregate(self.scenario, self.run, deployment=dep).total.score
        else:
            score = compare(self.run, simulate(self.scenario, self.run, deployment=dep,
                                               sample_period_us=0)).score
        if score is None:
            return {}
        out = {m: 100.0 * (score.sim[m] - score.real[m]) / score.real[m] for m in score.real}
        out["avg3"] = score.avg3_pct
        return out


def _physics(data: dict, name: str) -> Scenario:
    data = dict(data, name=name)
    data["latency"] = {"model": "physics", "coefficients": "default"}
    return Scenario(**data)


def per_request_cases(folder: Path) -> list[Case]:
    """The vLLM log runs of ``folder`` (folders with a meta.json)."""
    out = []
    for p in sorted(q for q in folder.iterdir() if (q / "meta.json").is_file()):
        run = load_vllm_log(p, require_ticks=True)
        sc = _physics(scenario_data(run.settings, run.name), run.name)
        dep = resolve(sc, quiet=True)
        out.append(Case(run.name, "per-request", dep.gpu.name, sc, dep, run))
    return out


def aggregate_cases(folder: Path, hardware: str, kv_cpu_gib: float) -> list[Case]:
    """The inference-perf results folders of ``folder``; ``hardware`` for runs that do not
    record their GPU, ``kv_cpu_gib`` the CPU KV offload they ran with (0 = none)."""
    out = []
    for p in sorted(q for q in folder.iterdir() if q.is_dir() and is_inference_perf(q)):
        run = load_inference_perf(p)
        if run.settings is None:
            raise ConfigError("records no engine settings (exp-config.yaml)", file=str(p))
        data = scenario_data(run.settings, run.name)
        if not data.get("hardware"):
            if not hardware:
                raise ConfigError("records no GPU: pass --hardware", file=str(p))
            data["hardware"] = hardware
        if kv_cpu_gib > 0:
            data["engine"] = dict(data["engine"], kv_cpu_gib=kv_cpu_gib)
        sc = _physics(data, run.name)
        dep = resolve(sc, quiet=True)
        out.append(Case(run.name, "aggregate", dep.gpu.name, sc, dep, run))
    return out


def cross_validate(cases: list[Case], progress=None) -> dict:
    """Replay every case uncalibrated, in-sample and held out (module docstring); returns the
    fitted parameters (in-sample and per held-out run) and fills ``case.results``."""
    if not cases:
        raise ConfigError("no run to cross-validate", field="--cross-validate")
    space = PhysicsSpace(cases[0].scenario, cases[0].deployment)
    for c in cases:
        c.obs = case_steps(space, [c])
    names = [p.name for p in space.params]
    every = [o for c in cases for o in c.obs]
    fitted = prefit_steps(space, every)
    if fitted is None:
        raise ConfigError(f"{len(every)} step observations: too few to fit", field="--cross-validate")
    report = {"parameters": names, "start": space.x0(), "in_sample": fitted.x, "held_out": {},
              "step_mape_pct": {"start": fitted.mape_before_pct, "in_sample": fitted.mape_after_pct},
              "observations": {c.name: len(c.obs) for c in cases}}
    for c in cases:
        rest = [o for d in cases if d is not c for o in d.obs]
        held = prefit_steps(space, rest)
        sets = {"uncalibrated": space.x0(), "in-sample": fitted.x,
                "held-out": held.x if held is not None else space.x0()}
        report["held_out"][c.name] = sets["held-out"]
        for mode in MODES:
            t0 = time.perf_counter()
            c.results[mode] = c.replay(space.deployment(c.scenario, space.to_set(sets[mode])))
            if progress is not None:
                progress(c.name, mode, time.perf_counter() - t0)
    report["runs"] = [{"name": c.name, "kind": c.kind, "gpu": c.gpu, "results": c.results} for c in cases]
    return report


def render_markdown(report: dict) -> str:
    """The cross-validation as markdown: one row per run and mode, then the parameters."""
    lines = ["| run | GPU | set | E2E mean | TTFT mean | ITL mean | avg3 |", "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        for mode in MODES:
            e = r["results"].get(mode) or {}
            cells = [f"{e[m]:+.1f}%" if m in e else "-" for m in ("e2e", "ttft", "itl")]
            avg = f"{e['avg3']:.1f}%" if "avg3" in e else "-"
            lines.append(f"| {r['name']} | {r['gpu']} | {mode} | {' | '.join(cells)} | {avg} |")
    lines.append("")
    for mode in MODES:
        vals = sorted(r["results"][mode]["avg3"] for r in report["runs"] if "avg3" in r["results"].get(mode, {}))
        if vals:
            med = statistics.median(vals)
            lines.append(f"- {mode}: median avg3 {med:.1f}% over {len(vals)} runs (max {vals[-1]:.1f}%)")
    lines.append("")
    lines.append("| parameter | start | in-sample | " + " | ".join(f"held out: {n}" for n in report["held_out"]) + " |")
    lines.append("|---|---|---|" + "---|" * len(report["held_out"]))
    for i, p in enumerate(report["parameters"]):
        row = [f"{report['start'][i]:.4g}", f"{report['in_sample'][i]:.4g}"]
        row += [f"{x[i]:.4g}" for x in report["held_out"].values()]
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["Case", "MODES", "aggregate_cases", "cross_validate", "per_request_cases", "render_markdown"]
