"""User subclasses of an instance, the KV-transfer fabric, a cluster, a latency model and a KV
cache, each written as a module beside a scenario, run through the CLI with no change to the
package (docs/extending.md). Every figure is computed by hand in the comments.

The workloads are TraceV2 traces with one or two requests; the built-in latency is blackbox
with alpha = 0 and beta = [1000, 0, 0]: every engine step takes exactly 1000 µs, whatever it
holds, and requests wait no queueing delay.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import LOCATED, trace_row, write_trace_files

# --------------------------------------------------------------------------- the plugins
ENGINE_PLUGIN = '''
import logging

from blis_simpy.engine.fast import FastInstance

log = logging.getLogger("blis_simpy")


class CountingInstance(FastInstance, name="inj-counting"):
    """Counts the steps it runs and reports the count when the run ends."""

    steps_seen = 0

    def on_step_end(self, now_us, step_us, completed):
        super().on_step_end(now_us, step_us, completed)
        self.steps_seen += 1

    def finalize(self):
        log.warning("%s ran %d steps", self.id, self.steps_seen)
        return super().finalize()
'''

FABRIC_PLUGIN = '''
from blis_simpy.disagg.fabric import KVTransferFabric


class SetupFabric(KVTransferFabric, name="inj-setup"):
    """Every KV transfer first waits a fixed connection set-up time."""

    setup_us = 2500

    def start(self, parent, nbytes):
        self.env.process(self._after_setup(parent, nbytes))

    def _after_setup(self, parent, nbytes):
        yield self.env.timeout(self.setup_us)
        super().start(parent, nbytes)
'''

CLUSTER_PLUGIN = '''
import logging

from blis_simpy.cluster.cluster import Cluster

log = logging.getLogger("blis_simpy")


class TallyCluster(Cluster, name="inj-tally"):
    """Logs every request that leaves an instance."""

    def on_request_done(self, inst, req, tick_us):
        super().on_request_done(inst, req, tick_us)
        log.warning("%s left %s at %d us", req.id, inst.id, tick_us)
'''

LATENCY_PLUGIN = '''
from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.latency.base import LatencyModel


class ConstantStep(LatencyModel, name="inj-constant-step"):
    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        step_us: int = Field(gt=0)
        queue_us: int = Field(0, ge=0)

    def step_time_us(self, batch):
        return self.params.step_us

    def queueing_time_us(self, req):
        return self.params.queue_us


class PerLayer(LatencyModel, name="inj-per-layer"):
    """Reads the model architecture, the GPU and TP it is built with."""

    needs_model_config = True

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        layer_us: int = Field(gt=0)

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        if self.gpu is None or self.gpu.name != "H100":
            raise ValueError(f"built for {self.gpu}")
        self.step_us = self.params.layer_us * self.model_config.num_layers // self.tp

    def step_time_us(self, batch):
        return self.step_us


class Broken(LatencyModel, name="inj-broken"):
    def __init__(self, params=None, **kw):
        raise RuntimeError("no calibration for this GPU")
'''

KV_PLUGIN = '''
from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.kv.cache import KVCache


class ReservedKV(KVCache, name="inj-reserved"):
    """Keeps reserve_blocks of the GPU KV blocks out of the cache."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        reserve_blocks: int = Field(0, ge=0)

    def __init__(self, total_blocks, block_size=16, *, params=None):
        reserve = params.reserve_blocks if params is not None else 0
        super().__init__(total_blocks - reserve, block_size, params=params)
'''

PLUGINS = {"inj_engine": ENGINE_PLUGIN, "inj_fabric": FABRIC_PLUGIN, "inj_cluster": CLUSTER_PLUGIN,
           "inj_latency": LATENCY_PLUGIN, "inj_kv": KV_PLUGIN}

BLACKBOX = "latency: {model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [1000, 0, 0]}"


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The plugin modules and two traces, side by side (scenarios are written next to them).
    req 0: 32 prompt tokens, 3 outputs at 0 µs; req 1: 32 / 3 at 500 µs (``two``) or 64 / 2
    at 500,000 µs (``pd``)."""
    d = tmp_path_factory.mktemp("injection")
    for mod, src in PLUGINS.items():
        (d / f"{mod}.py").write_text(src)
    write_trace_files(d, [trace_row(0, 0, 32, 3), trace_row(1, 500, 32, 3)], name="two")
    write_trace_files(d, [trace_row(0, 0, 32, 3), trace_row(1, 500_000, 64, 2)], name="pd")
    return d


def scenario(folder: Path, name: str, body: str, trace: str = "two") -> Path:
    """The exact times below are worked out for BLIS's synchronous scheduling (a request
    queued during a step joins the next one), so every scenario here turns async scheduling off."""
    p = folder / f"{name}.yaml"
    body = (body.replace("engine: {", "engine: {async_scheduling: false, ") if "engine: {" in body
            else f"{body}\nengine: {{async_scheduling: false}}")
    p.write_text(f"model: m\nplugins: [{', '.join(PLUGINS)}]\n{body}\nhorizon_us: 10000000\n"
                 f"workload: {{kind: trace, header: {trace}.yaml, data: {trace}.csv}}\n")
    return p


def run(cli, sc: Path, tmp_path: Path):
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(out.read_text())["requests"]
    return res, {r["requestID"]: r for r in rows}


def us(ms: float) -> int:
    return round(ms * 1000)


def one_located_line(res, sc: Path, line: int, field: str) -> str:
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    m = LOCATED.match(lines[0])
    assert m, lines[0]
    assert (m["file"], int(m["line"]), m["field"]) == (str(sc), line, field)
    return m["problem"]


# --------------------------------------------------------------------------- instance
def test_instance_subclass_runs_from_a_scenario_in_a_fresh_process(folder, tmp_path):
    """Steps (1000 µs each): [0, 1000) r0 prefill -> token 1; [1000, 2000) r0 token 2 + r1
    prefill (queued at 500) -> its token 1; [2000, 3000) r0 token 3 (done), r1 token 2;
    [3000, 4000) r1 token 3. Four steps, shared by both requests; TTFT r0 1000, r1 1500."""
    sc = scenario(folder, "engine", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100, implementation: "
                                    "inj-counting}")
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc),
                           "--results-path", str(out), "--format", "json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "instance_0 ran 4 steps" in proc.stderr
    rows = {r["requestID"]: r for r in json.loads(out.read_text())["requests"]}
    assert [(us(r["ttft_ms"]), us(r["e2e_ms"])) for r in rows.values()] == [(1000, 3000), (1500, 3500)]


def test_instance_class_bad_name_is_one_located_line(cli, folder):
    sc = scenario(folder, "engine_bad", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100, "
                                        "implementation: nope}")
    problem = one_located_line(cli("run", "--scenario", sc), sc, 4, "engine.implementation")
    assert problem.startswith("unknown engine implementation 'nope'; valid: ")
    assert {"fast", "reference", "inj-counting"} <= set(problem.split("valid: ")[1].split(", "))


# --------------------------------------------------------------------------- fabric
PD = """engine: {{total_kv_blocks: 100}}
cluster: {{num_instances: 2}}
disaggregation:
  prefill_instances: 1
  decode_instances: 1
  decider: {{policy: always}}
  transfer: {{bandwidth_gbps: 1.0, base_latency_ms: 0, kv_bytes_per_token: 1000, contention: none,
             fabric: {fabric}}}"""


@pytest.mark.parametrize("fabric, setup_us", [("default", 0), ("inj-setup", 2500)])
def test_fabric_subclass_adds_its_setup_time(cli, folder, tmp_path, fabric, setup_us):
    """1 GB/s = 1000 B/µs. r0: 32 prompt tokens = 2 blocks of 16 = 32 x 1000 B -> 32 µs of
    transfer; prefill [0, 1000), transfer from 1000 (+ set-up) -> decode steps of 1000 µs:
    TTFT = 1000 + setup + 32 + 1000, E2E one step later (3 outputs: the prefill's token, 2
    decode steps). r1 (at 500 ms): 64 tokens = 4 blocks -> 64 µs; 2 outputs: TTFT = E2E =
    1000 + setup + 64 + 1000."""
    sc = scenario(folder, f"pd_{fabric}", f"{BLACKBOX}\n{PD.format(fabric=fabric)}", trace="pd")
    _, rows = run(cli, sc, tmp_path)
    got = {k: (us(r["ttft_ms"]), us(r["e2e_ms"])) for k, r in rows.items()}
    assert got == {"request_0": (2032 + setup_us, 3032 + setup_us),
                   "request_1": (2064 + setup_us, 2064 + setup_us)}


def test_fabric_bad_name_is_one_located_line(cli, folder):
    sc = scenario(folder, "pd_bad", f"{BLACKBOX}\n{PD.format(fabric='nope')}", trace="pd")
    problem = one_located_line(cli("run", "--scenario", sc), sc, 11, "disaggregation.transfer.fabric")
    assert problem.startswith("unknown kv transfer fabric 'nope'; valid: ")


# --------------------------------------------------------------------------- cluster
def test_cluster_subclass_sees_every_request_leave(cli, folder, tmp_path):
    """Same run as the instance test: r0 completes in the step ending at 3000, r1 at 4000."""
    sc = scenario(folder, "cluster", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100}}\n"
                                     "cluster: {implementation: inj-tally}")
    res, _ = run(cli, sc, tmp_path)
    assert "request_0 left instance_0 at 3000 us" in res.stderr
    assert "request_1 left instance_0 at 4000 us" in res.stderr


def test_cluster_class_must_fit_the_topology(cli, folder):
    sc = scenario(folder, "cluster_pd", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100}}\n"
                                        "cluster: {implementation: pd}")
    problem = one_located_line(cli("run", "--scenario", sc), sc, 5, "cluster.implementation")
    assert problem == ("cluster 'pd' needs prefill/decode pools (disaggregation.prefill_instances and "
                       "decode_instances > 0)")


# --------------------------------------------------------------------------- latency model
def test_latency_plugin_with_params_gives_exact_times(cli, folder, tmp_path):
    """Queueing 200 µs, steps of 1500 µs. r0: queued at 200, steps [200, 1700) prefill,
    [1700, 3200), [3200, 4700): TTFT 1700, E2E 4700. r1 (arrives 500, queued at 700) joins
    at 1700: steps end 3200, 4700, 6200 -> TTFT 3200 - 500 = 2700, E2E 6200 - 500 = 5700."""
    sc = scenario(folder, "latency", "latency: {model: inj-constant-step, params: {step_us: 1500, "
                                     "queue_us: 200}}\nengine: {total_kv_blocks: 100}")
    _, rows = run(cli, sc, tmp_path)
    got = {k: (us(r["ttft_ms"]), us(r["e2e_ms"])) for k, r in rows.items()}
    assert got == {"request_0": (1700, 4700), "request_1": (2700, 5700)}


def test_latency_plugin_gets_model_config_gpu_and_tp(cli, folder, tmp_path):
    """Llama-3.1-8B has 32 layers: 100 µs x 32 / TP 2 = 1600 µs per step. r0: TTFT 1600, E2E
    4800; r1 (at 500) joins at 1600: 3200 - 500, 6400 - 500."""
    sc = scenario(folder, "per_layer", "latency: {model: inj-per-layer, params: {layer_us: 100}}\n"
                                       "engine: {total_kv_blocks: 100}\nhardware: H100\ntp: 2")
    text = sc.read_text().replace("model: m\n", "model: meta-llama/llama-3.1-8b-instruct\n")
    sc.write_text(text)
    _, rows = run(cli, sc, tmp_path)
    got = {k: (us(r["ttft_ms"]), us(r["e2e_ms"])) for k, r in rows.items()}
    assert got == {"request_0": (1600, 4800), "request_1": (2700, 5900)}


@pytest.mark.parametrize("latency, line, field, problem", [
    ("{model: inj-nope}", 3, "latency.model", "unknown latency model 'inj-nope'; valid: "),
    ("{model: inj-constant-step, params: {step_us: 0}}", 3, "latency.params.step_us",
     "input should be greater than 0, got 0"),
    ("{model: inj-constant-step, params: {step_us: 5, colour: blue}}", 3, "latency.params.colour",
     "unknown key"),
    ("{model: inj-constant-step}", 3, "latency.params.step_us", "required key is missing"),
    ("{model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [1, 0, 0], params: {x: 1}}", 3,
     "latency.params.x", "unknown key"),
    ("{model: inj-constant-step, params: {step_us: 5}, beta_coeffs: [1, 0, 0]}", 3, "latency.model",
     "latency model 'inj-constant-step' (a plugin) takes no alpha/beta coefficients; give its own "
     "parameters under latency.params"),
    ("{model: inj-broken}", 3, "latency.model",
     "latency model 'inj-broken' (inj_latency.Broken) failed to build: RuntimeError: no calibration "
     "for this GPU"),
])
def test_latency_plugin_errors_are_one_located_line(cli, folder, latency, line, field, problem):
    sc = scenario(folder, "latency_bad", f"latency: {latency}\nengine: {{total_kv_blocks: 100}}")
    got = one_located_line(cli("run", "--scenario", sc), sc, line, field)
    assert got.startswith(problem)


# --------------------------------------------------------------------------- KV cache
def test_kv_cache_plugin_with_params(cli, folder, tmp_path):
    """100 blocks, 96 reserved: 4 blocks of 16 = 64 token slots for two requests of 32 + 3
    tokens (3 blocks each once decoding) -> r1 waits for r0's blocks: r0 as alone (1000,
    3000); r1 is admitted at 3000 when r0's blocks free: TTFT 4000 - 500, E2E 6000 - 500."""
    sc = scenario(folder, "kv", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100, kv_cache: inj-reserved, "
                                "kv_cache_params: {reserve_blocks: 96}}")
    res, rows = run(cli, sc, tmp_path)
    assert json.loads(res.stdout)["total_kv_blocks"] == 4
    got = {k: (us(r["ttft_ms"]), us(r["e2e_ms"])) for k, r in rows.items()}
    assert got == {"request_0": (1000, 3000), "request_1": (3500, 5500)}


def test_tiered_kind_is_the_cpu_tier_keys(cli, folder, tmp_path):
    """``kv_cache: tiered`` with its params runs what the ``engine.kv_cpu_blocks`` keys run."""
    flat = scenario(folder, "tier_flat", f"{BLACKBOX}\nengine: {{total_kv_blocks: 3, kv_cpu_blocks: 8, "
                                         "kv_transfer_bandwidth: 2.0}")
    kind = scenario(folder, "tier_kind", f"{BLACKBOX}\nengine: {{total_kv_blocks: 3, kv_cache: tiered, "
                                         "kv_cache_params: {cpu_blocks: 8, transfer_bandwidth: 2.0}}")
    a, b = cli("run", "--scenario", flat, "--format", "json"), cli("run", "--scenario", kind, "--format", "json")
    assert a.exit_code == b.exit_code == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout


@pytest.mark.parametrize("engine, field, problem", [
    ("kv_cache: inj-nope", "engine.kv_cache", "unknown kv cache 'inj-nope'; valid: "),
    ("kv_cache: inj-reserved, kv_cache_params: {reserve_blocks: -1}",
     "engine.kv_cache_params.reserve_blocks", "input should be greater than or equal to 0, got -1"),
    ("kv_cache: tiered", "engine.kv_cpu_blocks", "input should be greater than 0, got 0"),
    ("kv_cache: gpu, kv_cache_params: {cpu_blocks: 4}", "engine.kv_cache_params.cpu_blocks",
     "unknown key"),
    ("kv_cache: inj-reserved, kv_cache_params: {reserve_blocks: 100}", "engine.kv_cache",
     "kv cache 'inj-reserved' (inj_kv.ReservedKV) failed to build: ValueError: total KV blocks must "
     "be > 0, got 0"),
])
def test_kv_cache_errors_are_one_located_line(cli, folder, engine, field, problem):
    sc = scenario(folder, "kv_bad", f"{BLACKBOX}\nengine: {{total_kv_blocks: 100, {engine}}}")
    got = one_located_line(cli("run", "--scenario", sc), sc, 4, field)
    assert got.startswith(problem)


# --------------------------------------------------------------------------- library API
def test_simulation_takes_the_classes_directly():
    """``Simulation(..., instance_class=)``: an unregistered subclass, same four steps as the
    CLI test above (each ends 1000 µs after it starts)."""
    from blis_simpy.engine.instance import Instance
    from blis_simpy.run.simulation import Simulation
    from tests.engine.helpers import make_requests
    from tests.engine.helpers import scenario as engine_scenario

    class Recording(Instance):
        def on_step_end(self, now_us, step_us, completed):
            self.ends = [*getattr(self, "ends", []), (now_us + step_us, [r.id for r in completed])]

    sc = engine_scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), async_scheduling=False)
    sim = Simulation(sc, make_requests([(0, 32, 3), (500, 32, 3)]), instance_class=Recording)
    sim.run()
    assert type(sim.instances[0]) is Recording
    assert sim.instances[0].ends == [(1000, []), (2000, []), (3000, ["request_0"]),
                                     (4000, ["request_1"])]
    with pytest.raises(TypeError, match="expected a subclass of KVTransferFabric"):
        Simulation(sc, [], fabric_class=Recording)
