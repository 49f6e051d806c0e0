"""Leave-one-run-out accuracy of the physics step costs over real runs of several kinds.

Used by ``bench/realdata.py --cross-validate``. Every run — a per-request vLLM log
(``--data``) or an inference-perf results folder (``--aggregate-data``) — is replayed with the
``physics`` backend three times:

* **uncalibrated**: the physical default set (datasheet and measured sustained rates, the
  default fixed costs);
* **in-sample**: the step costs pre-fitted (``blis_simpy.fit.prefit.prefit_steps``) to the
  step observations of the runs — the decode ticks of the logs, the stage means of the
  aggregate results (``blis_simpy.fit.aggregate_steps``) — and the front end's fixed latency
  (``blis_simpy.fit.frontend``) to the light stages of the runs measured at the client;
* **held out**: the same fits without the run, so the run is predicted by costs it never
  informed.

Which runs a fit uses: those of the run's own GPU when that GPU has at least
:data:`MIN_GPU_RUNS` of them (held out: other than the run itself) — a per-GPU set, as
``blis-simpy fit`` ships — else every run of every GPU (held out: every other run), so a
GPU with no other run is predicted from the other GPUs' runs and its own catalog figures.
Never per model or per run. For each replay: the signed errors of mean E2E, mean TTFT and
mean ITL (per-token: ``(E2E − TTFT)/(decoded − 1)``) and their average of absolute values,
avg3 (docs/accuracy.md). Times in ms, errors in %.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from blis_simpy.calibrate import scenario_data
from blis_simpy.calibrate.aggregate import calibrate_aggregate
from blis_simpy.calibrate.compare import compare
from blis_simpy.calibrate.twin import simulate
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.errors import ConfigError
from blis_simpy.fit.aggregate_steps import case_steps
from blis_simpy.fit.frontend import fit_frontend, with_frontend
from blis_simpy.fit.prefit import StepObs, prefit_steps
from blis_simpy.fit.space import PhysicsSpace
from blis_simpy.measured.inference_perf import is_inference_perf, load_inference_perf
from blis_simpy.measured.vllm_log import load_vllm_log

MODES = ("uncalibrated", "in-sample", "held-out")
#: a GPU with this many runs (besides a held-out one) is fitted on its own runs only
MIN_GPU_RUNS = 2


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


def training_runs(cases: list[Case], target: Case, held_out: bool) -> list[Case]:
    """The runs a fit for ``target`` uses (module docstring): its GPU's runs when there are
    :data:`MIN_GPU_RUNS` of them, else every run; without ``target`` when ``held_out``."""
    pool = [c for c in cases if not (held_out and c is target)]
    own = [c for c in pool if c.gpu == target.gpu]
    return own if len(own) >= MIN_GPU_RUNS else pool


def cross_validate(cases: list[Case], progress=None) -> dict:
    """Replay every case uncalibrated, in-sample and held out (module docstring); returns the
    fitted parameters (per run: in-sample and held out) and fills ``case.results``."""
    if not cases:
        raise ConfigError("no run to cross-validate", field="--cross-validate")
    space = PhysicsSpace(cases[0].scenario, cases[0].deployment)
    for c in cases:
        c.obs = case_steps(space, [c])
    names = [p.name for p in space.params]
    fits: dict[tuple[str, ...], tuple] = {}        # training runs -> (vector, step MAPEs, front end)

    def fitted(train: list[Case]):
        key = tuple(c.name for c in train)
        if key not in fits:
            res = prefit_steps(space, [o for c in train for o in c.obs])
            x = res.x if res is not None else space.x0()
            fe = fit_frontend(space, train, space.to_set(x))
            mape = (res.mape_before_pct, res.mape_after_pct) if res is not None else None
            fits[key] = (x, mape, fe)
        return fits[key]

    report = {"parameters": names + ["network_us"], "start": space.x0() + [0.0], "in_sample": {},
              "held_out": {}, "step_mape_pct": {}, "observations": {c.name: len(c.obs) for c in cases}}
    for c in cases:
        sets = {"uncalibrated": (space.x0(), None, None)}
        for mode, held in (("in-sample", False), ("held-out", True)):
            sets[mode] = fitted(training_runs(cases, c, held))
            x, mape, fe = sets[mode]
            report["in_sample" if mode == "in-sample" else "held_out"][c.name] = (
                list(x) + [fe.params.network_us if fe is not None else 0.0])
            if mode == "in-sample" and mape is not None:
                report["step_mape_pct"][c.name] = {"start": mape[0], "in_sample": mape[1]}
        for mode in MODES:
            x, _, fe = sets[mode]
            t0 = time.perf_counter()
            c.results[mode] = c.replay(space.deployment(c.scenario, with_frontend(space.to_set(x), fe)))
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
    lines.append("| run | set | " + " | ".join(report["parameters"]) + " |")
    lines.append("|---|---|" + "---|" * len(report["parameters"]))
    lines.append("| (all) | uncalibrated | " + " | ".join(f"{v:.4g}" for v in report["start"]) + " |")
    for name in report["in_sample"]:
        for mode in ("in_sample", "held_out"):
            lines.append(f"| {name} | {mode.replace('_', '-')} | "
                         + " | ".join(f"{v:.4g}" for v in report[mode][name]) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["Case", "MIN_GPU_RUNS", "MODES", "aggregate_cases", "cross_validate", "per_request_cases",
           "render_markdown", "training_runs"]
