"""Data parallelism inside one engine: DP ranks, their front door, lockstep stepping.

vLLM's ``--data-parallel-size N`` runs N engine cores (*ranks*) behind one API server. Each
rank is a separate engine core with its own scheduler, wait queue, running batch and KV
pool, and its own ``max_num_seqs`` / ``max_num_batched_tokens`` limits. Here each rank is an
ordinary :class:`~blis_simpy.engine.instance.Instance` (or ``FastInstance``) in
``Simulation.instances`` — engine ``e``, rank ``r`` at index ``e * dp + r`` — so metrics,
invariants and snapshots see ranks as instances. A :class:`DPEngine` ties the ranks of one
engine together:

* **Front door** (:meth:`DPEngine.pick`). The cluster's router chooses an instance as it
  always does; if that instance is a rank of an engine with ``dp > 1``, the engine's front
  door re-picks the rank with vLLM's DP load-balancing rule (the v1 engine client's
  DP load balancer): the rank with the smallest ``4 * waiting + running`` wins, ties go to
  the lowest rank. ``waiting`` counts the requests placed on the rank that are not running
  yet (still in the latency model's queueing delay, or in the wait queue) and ``running``
  is the size of its running batch. vLLM reads these counts from its DP coordinator (with
  its own increments in between); we read each rank's exact state at routing time.

* **Lockstep** (:class:`LockstepGroup`, MoE models only). The ranks of an MoE engine meet
  in collective operations in every MoE layer, so vLLM steps them together: in every step
  every rank runs a forward pass, a rank with nothing to run executes a 1-token dummy
  batch, and the step lasts as long as the slowest rank (token counts are padded to the
  group's maximum). The group is one SimPy process — one event per lockstep step — that
  runs while any rank has work. At time ``t`` it runs :meth:`Instance.begin_step` on every
  rank that has work (running or queued requests), asks the latency model for the common
  duration ``D = lockstep_step_time_us(views)`` (an idle rank passes an empty view, which the
  model times as :meth:`BatchView.dummy`), adds the largest pending KV-transfer stall of
  any rank (everyone waits for it), and runs :meth:`Instance.finish_step` on those ranks
  with ``step_us = D``; then it wakes at ``t + D``. The ranks' own step chains never run: a
  request reaching an idle group rings the group's doorbell (``Instance._push_step``);
  the group then steps at once, or when its last step ends if that is later (unlike a
  lone instance, which BLIS lets start a step before its last one has ended).
  The group's events carry the last rank's step key (:mod:`blis_simpy.des`), so requests
  queued on any rank at time ``t`` are in the wait queues when the group steps at ``t``.
  Idle ranks do no bookkeeping in a lockstep step (no step count, no clock advance), so a
  rank's metrics only cover the steps in which it had work.

  Dense models (and runs without a model config) keep independent ranks, as vLLM does: DP
  ranks of a dense model share nothing but the front door.

Times are integer µs.
"""

from __future__ import annotations

from simpy.events import Event

from blis_simpy.des import succeed_at
from blis_simpy.engine.limits import checked_step_us
from blis_simpy.latency.base import BatchView


class DPEngine:
    """The ``dp`` ranks of one engine behind one front door (see the module docstring).

    ``index`` is the engine's position in the cluster; ``ranks`` its instances in rank
    order. With ``lockstep`` the ranks are stepped by a :class:`LockstepGroup`.
    """

    def __init__(self, env, index: int, ranks: list, *, lockstep: bool):
        if not ranks:
            raise ValueError("a data-parallel engine needs at least one rank")
        self.env = env
        self.index = index
        self.ranks = list(ranks)
        for r, inst in enumerate(self.ranks):
            inst.dp_engine = self
            inst.dp_rank = r
            inst.metrics.dp_engine = index
            inst.metrics.dp_rank = r
        self.lockstep: LockstepGroup | None = LockstepGroup(env, self.ranks) if lockstep else None

    @staticmethod
    def load_score(inst) -> int:
        """vLLM's DP load-balancing score of a rank: ``4 * waiting + running``."""
        return 4 * (inst.in_queueing_delay + len(inst.waitq)) + len(inst.running)

    def pick(self, routed):
        """The rank a request routed to ``routed`` (any rank of this engine) goes to: the
        smallest :meth:`load_score`, ties to the lowest rank."""
        best = self.ranks[0]
        best_score = self.load_score(best)
        for inst in self.ranks[1:]:
            score = self.load_score(inst)
            if score < best_score:
                best, best_score = inst, score
        return best


class LockstepGroup:
    """Steps the ranks of one engine together: one SimPy event per lockstep step.

    Hooks for subclasses: :meth:`step_time_us` (the common duration of a step). The ranks'
    own hooks (``form_batch``, ``on_step_end``, …) run inside their begin/finish phases.
    ``steps`` counts lockstep steps, ``dummy_rank_steps`` the rank-steps that ran the dummy
    batch (a rank without a scheduled request in that step).
    """

    def __init__(self, env, ranks: list):
        self.env = env
        self.ranks = list(ranks)
        self.latency = self.ranks[0].latency
        #: the event key of the last rank's steps: every rank's arrivals at time t are
        #: queued before the group steps at t
        self.key = self.ranks[-1].key_step
        self.steps = 0
        self.dummy_rank_steps = 0
        self.free_at_us = 0        # end of the last lockstep step
        self._doorbell: Event | None = None
        for inst in self.ranks:
            inst.lockstep = self
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ process
    def _run(self):
        """Sleep on the doorbell, then step while any rank has work."""
        env = self.env
        while True:
            self._doorbell = Event(env)
            yield self._doorbell
            while True:
                nxt = self.step(env.now)
                if nxt is None:
                    break
                yield env.wake_at(nxt, self.key)

    def ring(self, t_us: int) -> None:
        """Work arrived on a rank at ``t_us``: wake the group if it is asleep, at ``t_us``
        or when its last step ends if that is later (a stepping group picks the work up at
        its next step)."""
        bell = self._doorbell
        if bell is None:
            return
        self._doorbell = None
        succeed_at(bell, max(t_us, self.free_at_us), self.key)

    # ------------------------------------------------------------------ one step
    def step(self, now_us: int) -> int | None:
        """One lockstep step at ``now_us``; the time of the next one, or None when no rank
        has work left."""
        busy = [inst for inst in self.ranks if inst.running or inst.waitq]
        if not busy:
            return None
        self.steps += 1
        views = []
        for inst in self.ranks:
            if inst.running or inst.waitq:
                inst._touch(now_us)
                views.append(inst.begin_step(now_us))
            else:
                views.append(BatchView())
        self.dummy_rank_steps += sum(1 for v in views if v.size == 0)
        stall = max(inst.kv.consume_pending_transfer_latency() for inst in self.ranks)
        step_us = self.step_time_us(views) + stall
        step_us = checked_step_us(step_us, self.ranks[0].id, now_us)
        self.free_at_us = now_us + step_us
        for inst in busy:
            inst.finish_step(now_us, step_us)
        for inst in busy:
            inst.listener.on_event_end(inst)
        if any(inst.running or inst.waitq for inst in self.ranks):
            return now_us + step_us
        return None

    def step_time_us(self, views: list[BatchView]) -> int:
        """Hook: the common duration (µs) of a step whose rank ``r`` runs ``views[r]``
        (size 0 = the dummy batch)."""
        return self.latency.lockstep_step_time_us(views)
