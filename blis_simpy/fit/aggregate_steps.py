"""Step observations from aggregate results: what a stage's means say about the engine's step.

An inference-perf results file has no timeseries, but each load stage ran long enough to be
in a steady state, and its means pin the step the engine ran at:

* the **decode step**: a successful request decoded ``n`` tokens (``AggregateRun.decoded_output_len``)
  between its first token and its last, one per step, so the mean step while it decoded is
  ``(mean E2E − mean TTFT) / (n − 1)``;
* the **batch**: by Little's law the requests decoding at once are the rate at which requests
  went through decoding times how long each spent there — ``successes / (stage duration + mean
  E2E) × (mean E2E − mean TTFT)`` (the stage drains for about one E2E after its last send), at
  most the engine's ``max_num_seqs``;
* the **context**: a decoding request holds its prompt plus half its output on average.

A stage where more than :data:`MAX_FAILED_SHARE` of the requests failed (an overloaded server
whose clients timed out) gives none: its failed requests decoded too, and its successes
waited through preemptions, so neither the batch nor the step can be read from them. Nor does
a stage whose requests waited longer than they decoded (mean TTFT > mean E2E − mean TTFT):
its server was overloaded — a queue, the batch at the running cap — and every step admitted
waiting prompts beside the decodes, so its mean step is not a pure-decode step.

Each stage becomes one :class:`~blis_simpy.fit.prefit.StepObs` for the deployment of its run,
so :func:`~blis_simpy.fit.prefit.prefit_steps` can fit the physics model's step costs to many
runs at once (models, TPs, GPUs) in milliseconds, with no simulation. What this leaves out —
prefill chunks of arriving requests mixed into decode steps, preemptions, the spread of the
batch around its mean — is what the simulation that follows the fit shows.

Units: ``*_us`` µs, ``*_ms`` ms, token counts in tokens, rates in requests/s.
"""

from __future__ import annotations

from blis_simpy.deploy.resolve import resolve
from blis_simpy.fit.prefit import StepObs, decode_steps
from blis_simpy.measured.run import AggregateRun

#: a stage whose failures (client timeouts) exceed this share of its requests gives no
#: observation: the requests that timed out decoded too, so the successes alone neither give
#: the batch (Little's law) nor a pure step (preemption stalls, KV-bound batches)
MAX_FAILED_SHARE = 0.01


def stage_steps(run: AggregateRun, max_num_seqs: int, *, deployment=None) -> list[StepObs]:
    """One pure-decode step observation per stage of ``run`` with successes and both means
    (module docstring); ``deployment`` is recorded on each (the run's resolved deployment)."""
    out = []
    n = run.decoded_output_len
    if n <= 1:
        return out
    for st, stats in zip(run.stages, run.real_stages, strict=False):
        lat = stats.latency_ms
        if stats.successes <= 0 or "e2e" not in lat or "ttft" not in lat:
            continue
        if stats.failures > MAX_FAILED_SHARE * (stats.successes + stats.failures):
            continue          # timed-out requests decoded too: Little's law on the successes fails
        e2e_ms, ttft_ms = lat["e2e"]["mean"], lat["ttft"]["mean"]
        if not e2e_ms > ttft_ms > 0:
            continue
        decode_ms = e2e_ms - ttft_ms
        if ttft_ms > decode_ms:
            continue          # queue-dominated: prompts prefilled in every step (docstring)
        span_s = (st.end_us - st.start_us) / 1e6 + e2e_ms / 1000.0
        batch = min(float(max_num_seqs), stats.successes / span_s * decode_ms / 1000.0)
        if batch < 1.0:
            batch = 1.0
        prompt = stats.prompt_len_mean or 0.0
        context = prompt + n / 2.0
        out.append(StepObs(t_s=st.end_us / 1e6, batch=batch, context=context,
                           step_us=decode_ms * 1000.0 / (n - 1), deployment=deployment,
                           label=f"{run.name} stage {st.index}",
                           max_batch=float(max_num_seqs) if batch < max_num_seqs else 0.0))
    return out


def case_steps(space, cases) -> list[StepObs]:
    """The step observations of fit cases, each with its own resolved deployment: the decode
    ticks of a logged run, the stage means of an aggregate run (:mod:`.aggregate_steps`)."""
    out = []
    for c in cases:
        dep = space.dep if c.scenario is space.scenario else resolve(c.scenario, quiet=True)
        if isinstance(c.run, AggregateRun):
            out += stage_steps(c.run, c.scenario.engine.max_num_running_reqs, deployment=dep)
        else:
            out += [StepObs(o.t_s, o.batch, o.context, o.step_us, deployment=dep, label=f"{c.run.name} t={o.t_s:g}s")
                    for o in decode_steps(c.run)]
    return out


__all__ = ["case_steps", "stage_steps"]
