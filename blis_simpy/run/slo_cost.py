"""SLO attainment, goodput, GPUs and cost of a finished run (docs/metrics.md, "SLOs and
goodput", "Deployment and cost").

:func:`attach` fills :attr:`Report.slo <blis_simpy.metrics.report.Report.slo>` (when the
scenario sets an SLO target) and :attr:`Report.deployment` (always) from the scenario, the
simulation (its resolved per-instance deployments) and its result.
"""

from __future__ import annotations

from blis_simpy.metrics.autoscale import autoscale_report
from blis_simpy.metrics.cost import deployment_cost
from blis_simpy.metrics.gateway import gateway_report
from blis_simpy.metrics.report import Report
from blis_simpy.metrics.slo import SLOSpec, slo_report, tally_metrics

__all__ = ["attach", "attach_gateway", "autoscale_section", "instance_gpus"]


def instance_gpus(sim) -> list[tuple[int, float | None]]:
    """``(GPUs, catalog USD per GPU-hour or None)`` of every configured instance of ``sim``
    (a :class:`~blis_simpy.run.simulation.Simulation`): TP (its pool's, if any) × DP."""
    dp = sim.scenario.dp
    out = []
    for e in range(sim.scenario.cluster.num_instances):
        d = sim.pools.deployment_for(e)
        price = d.gpu.price_per_hour_usd if d.gpu is not None else None
        out.append((max(d.tp, 1) * dp, price))
    return out


def attach(scenario, sim, result, report: Report) -> None:
    """Add the SLO and deployment sections to ``report`` (see the module docstring)."""
    cluster = report.cluster
    duration_s = float(cluster.sim_ended_time) / 1e6
    spec = SLOSpec.from_config(scenario.slo)
    if spec.active:
        report.slo = slo_report(spec, tally_metrics(cluster, spec),
                                result.counters.arrived_by_class, duration_s)
    tokens_per_sec = 0.0              # as MetricsOutput's tokens_per_sec
    if cluster.completed_requests > 0 and duration_s > 0:
        tokens_per_sec = float(cluster.total_output_tokens) / duration_s
    report.deployment = deployment_cost(instance_gpus(sim), tokens_per_sec,
                                        gpu_hour_usd=scenario.cost.gpu_hour_usd)
    if result.autoscale is not None:
        report.autoscaling = autoscale_section(scenario, sim, result, spec)


def autoscale_section(scenario, sim, result, spec: SLOSpec):
    """The ``"autoscaling"`` section (docs/metrics.md, "Autoscaling"): the record of the
    autoscaler, the per-interval SLO attainment from the completed requests (not kept under
    ``--streaming-metrics``), GPU-hours priced as the deployment is."""
    done = None
    if not scenario.metrics.streaming:       # with PD pools: the parents' record
        records = [result.cluster] if result.cluster is not None else result.instances
        done = [(req.arrival_us, ok) for m in records for req, ok in _judged(m, spec)]
    price = scenario.cost.gpu_hour_usd
    pool_prices = None
    if price is None and result.autoscale.pools:     # each pool at its GPU's catalog price
        pool_prices = {}
        for p in result.autoscale.pools:
            gpu = sim.pools.deployments[p["name"]].gpu
            pool_prices[p["name"]] = gpu.price_per_hour_usd if gpu is not None else None
    elif price is None:
        gpu = sim.pools.global_deployment.gpu
        price = gpu.price_per_hour_usd if gpu is not None else None
    return autoscale_report(result.autoscale, result.counters.arrived, done, judged=spec.active,
                            gpu_hour_usd=price, pool_prices=pool_prices)


def attach_gateway(scenario, sim, report: Report) -> None:
    """Add the gateway queue's results (docs/metrics.md, "Gateway queue") when the run had one:
    per-flow SLO attainment from the cluster record (exact metrics with an SLO target only)."""
    gw = getattr(sim.cluster, "gateway", None)
    if gw is None:
        return
    cluster = report.cluster
    spec = SLOSpec.from_config(scenario.slo)
    met = None
    if spec.active and cluster.streaming is None:
        flow = gw.policy.flow
        met = {}
        for req, ok in _judged(cluster, spec):
            if ok:
                f = flow(req)
                met[f] = met.get(f, 0) + 1
    weight = getattr(gw.policy, "weight", lambda _f: 1.0)
    fs = scenario.cluster.gateway.fair_share
    report.gateway = gateway_report(gw.counters, flow_key=fs.key if fs is not None else "tenant",
                                    weight=weight, duration_s=float(cluster.sim_ended_time) / 1e6,
                                    met_by_flow=met)


def _judged(m, spec: SLOSpec):
    """``(request, met every target)`` of each completed request of the metrics record ``m``
    (an instance's or the cluster's), in request-ID order."""
    reg, ttft, itl = m.registry, m.ttft, m.itl
    for rid in sorted(m.e2e):
        req = reg.get(rid)
        if req is not None:
            ok = spec.targets_for(req.slo_class).meets(ttft.get(rid), itl.get(rid), m.e2e[rid])
            yield req, all(ok)
