"""Saturation detection: does the offered load exceed what the deployment sustains?
(docs/metrics.md, "Saturation").

A deployment is **saturated** when, over the arrival window (first to last arrival), both

1. its **backlog** grows: the requests waiting (arrived, in the control plane, in a queueing
   delay or in a wait queue, not yet scheduled) sampled at up to :data:`MAX_SAMPLES` evenly
   spaced times have a least-squares slope ``b`` of at least ``(1 − MAX_ACHIEVED_RATIO)`` ×
   the offered rate whose t statistic ``b / se(b)`` is at least :data:`MIN_T_STAT`; and
2. its **completed throughput** falls short of the offered rate: over the second half of the
   window, completions / arrivals is below :data:`MAX_ACHIEVED_RATIO`.

Both are measured inside the arrival window, so a long drain after the last arrival hides
nothing, and a burst that drains before the window ends has a falling backlog and as many
completions as arrivals in the second half. Neither test has a per-model constant.

A request is in the backlog from its arrival until it is scheduled (its arrival plus its
scheduling delay: the last scheduling after a preemption), or until its deadline when it
timed out unscheduled, or to the end when it never left. Requests rejected by admission or
routing, or dropped, are never in it; requests still in the control plane at the end are not
seen (they arrived in the last admission plus routing latency).

:class:`BacklogProbe` keeps counts of arrivals, departures from the backlog and completions
in bins of ``2**k`` µs (at most :data:`MAX_BINS`, doubled as time grows): memory is bounded
whatever the run's length (it serves ``--streaming-metrics``, which feeds it as requests
leave). Samples are taken at bin edges.

**Per window of a time-varying load.** Given the times where the arrival rate changes (the
boundaries of its constant-rate pieces), :meth:`BacklogProbe.verdict` also takes the same
test over each piece's window (the piece clipped to the arrival window): a deployment that
falls behind at a peak and catches up later has a backlog that grows over the peak's pieces
although over the whole window it does not. A piece with fewer than :data:`MIN_SAMPLES` bin
edges is merged with the pieces after it (the last short one with the window before), and
every window spans at least 1/:data:`MAX_WINDOWS` of the arrival window, so at most
:data:`MAX_WINDOWS` windows are tested whatever the number of pieces. A window fires on the
two conditions and a third, its **rise**: the backlog's last sample minus its first is at
least :data:`MIN_T_STAT` × √(arrivals + departures from the backlog in the window), beyond
the counting noise of those two counts (a short window's random burst meets the first two).
The run is saturated when the whole-window test or any window's fires; the verdict keeps the
whole window's measurements and lists the windows that fired (at most
:data:`MAX_LISTED_WINDOWS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from blis_simpy.request import TIMED_OUT

__all__ = ["BacklogProbe", "MAX_ACHIEVED_RATIO", "MAX_BINS", "MAX_LISTED_WINDOWS", "MAX_SAMPLES",
           "MAX_WINDOWS", "MIN_SAMPLES", "MIN_T_STAT", "SaturationVerdict", "probe_metrics",
           "saturation_windows"]

#: bins of the probe (each an int64 count of three kinds)
MAX_BINS = 1 << 14
#: backlog samples the slope is fitted to (evenly spaced over the arrival window)
MAX_SAMPLES = 64
#: fewer bin edges than this inside the arrival window: no verdict
MIN_SAMPLES = 8
#: the backlog's slope must be at least this many standard errors above 0
MIN_T_STAT = 3.0
#: completions / arrivals over the window's second half must be below this
MAX_ACHIEVED_RATIO = 0.9
#: windows of a time-varying load tested at most (pieces are merged beyond)
MAX_WINDOWS = 1000
#: windows that fired listed in the verdict at most (the ones completing the least)
MAX_LISTED_WINDOWS = 10


@dataclass(frozen=True)
class SaturationVerdict:
    """The test's result. Rates in requests/s, times in µs; ``undetermined``: why there is no
    verdict ("" when there is one)."""

    saturated: bool
    undetermined: str = ""
    samples: int = 0
    window_start_us: int = 0
    window_end_us: int = 0
    backlog_first: int = 0
    backlog_last: int = 0
    backlog_slope_rps: float = 0.0
    backlog_slope_stderr_rps: float = 0.0
    offered_rps: float = 0.0
    achieved_rps: float = 0.0
    #: per-window tests of a time-varying load (0: none, the measurements above are the only
    #: test): windows tested, how many fired, the whole window's own result, and the fired
    #: windows' verdicts (time order; at most MAX_LISTED_WINDOWS, the lowest completed/offered)
    windows_tested: int = 0
    windows_fired: int = 0
    whole_window_saturated: bool = False
    fired_windows: tuple[SaturationVerdict, ...] = ()

    @property
    def t_stat(self) -> float:
        se = self.backlog_slope_stderr_rps
        if se > 0:
            return self.backlog_slope_rps / se
        return math.inf if self.backlog_slope_rps > 0 else 0.0

    @property
    def achieved_over_offered(self) -> float:
        return self.achieved_rps / self.offered_rps if self.offered_rps > 0 else 0.0

    @property
    def fired(self) -> SaturationVerdict:
        """The test the verdict rests on: the whole window's when it fired or no window did,
        else the fired window completing the least of its offered load (the earliest on a tie)."""
        if self.whole_window_saturated or not self.fired_windows:
            return self
        return min(self.fired_windows, key=lambda v: (v.achieved_over_offered, v.window_start_us))

    def to_dict(self) -> dict:
        """The JSON form (times in s, rates in requests/s): the whole window's measurements
        and, when windows were tested, ``whole_window_saturated``, ``windows_tested``,
        ``windows_fired`` and ``windows`` (the listed fired windows in this form)."""
        out = self._dict()
        if self.windows_tested:
            out.update(whole_window_saturated=self.whole_window_saturated,
                       windows_tested=self.windows_tested, windows_fired=self.windows_fired,
                       windows=[w._dict() for w in self.fired_windows])
        return out

    def _dict(self) -> dict:
        t = self.t_stat
        return {
            "saturated": self.saturated,
            "window_start_s": self.window_start_us / 1e6,
            "window_end_s": self.window_end_us / 1e6,
            "samples": self.samples,
            "backlog_first": self.backlog_first,
            "backlog_last": self.backlog_last,
            "backlog_slope_rps": self.backlog_slope_rps,
            "backlog_slope_stderr_rps": self.backlog_slope_stderr_rps,
            "backlog_slope_t": t if math.isfinite(t) else None,
            "offered_rps": self.offered_rps,
            "achieved_rps": self.achieved_rps,
            "achieved_over_offered": self.achieved_over_offered,
        }

    def summary(self) -> str:
        """One line: what was measured by the test that fired (:attr:`fired`)."""
        v = self.fired
        return (f"backlog +{v.backlog_slope_rps:.3g} ± {v.backlog_slope_stderr_rps:.2g} "
                f"req/s over the arrivals {v.window_start_us / 1e6:.3f}-"
                f"{v.window_end_us / 1e6:.3f} s ({v.backlog_first} -> {v.backlog_last} "
                f"waiting); {v.achieved_rps:.3g} of {v.offered_rps:.3g} req/s completed "
                f"({100 * v.achieved_over_offered:.0f} %)")

    def warning(self) -> str:
        """The one-line warning printed when saturated; names the window when only windows
        of a time-varying load fired."""
        v = self.fired
        if v is self:
            return "saturated: the offered load exceeds what the deployment sustains: " + self.summary()
        return (f"saturated between {v.window_start_us / 1e6:.1f} s and {v.window_end_us / 1e6:.1f} s "
                f"of the arrivals: the offered load exceeds what the deployment sustains: "
                f"{self.summary()} ({self.windows_fired} of {self.windows_tested} windows of the "
                f"arrival rate fired; not the whole arrival window)")


class BacklogProbe:
    """Binned counts of when requests arrived, left the backlog and completed (module
    docstring). Times are integer µs >= 0."""

    __slots__ = ("shift", "arrivals", "reentries", "leaves", "completions", "first_arrival_us",
                 "last_arrival_us", "n")

    def __init__(self):
        self.shift = 0                       # bin width 2**shift µs
        self.arrivals = np.zeros(MAX_BINS, dtype=np.int64)
        self.reentries = np.zeros(MAX_BINS, dtype=np.int64)    # back in a queue (PD decode)
        self.leaves = np.zeros(MAX_BINS, dtype=np.int64)
        self.completions = np.zeros(MAX_BINS, dtype=np.int64)
        self.first_arrival_us = -1
        self.last_arrival_us = -1
        self.n = 0

    def _fit(self, t_us: int) -> None:
        """Widen the bins until time ``t_us`` falls in one."""
        while (t_us >> self.shift) >= MAX_BINS:
            for a in (self.arrivals, self.reentries, self.leaves, self.completions):
                merged = a.reshape(-1, 2).sum(axis=1)
                a[: MAX_BINS // 2] = merged
                a[MAX_BINS // 2:] = 0
            self.shift += 1

    def add(self, arrival_us: int, left_us: int | None, done_us: int | None) -> None:
        """One request: its arrival, when it left the backlog (None: never) and when it
        completed (None: it did not)."""
        last = max(arrival_us, left_us or 0, done_us or 0)
        self._fit(last)
        s = self.shift
        self.arrivals[arrival_us >> s] += 1
        if left_us is not None:
            self.leaves[left_us >> s] += 1
        if done_us is not None:
            self.completions[done_us >> s] += 1
        self._saw(arrival_us, arrival_us, 1)

    def add_again(self, enter_us: int | None, left_us: int | None, done_us: int | None) -> None:
        """A request counted at its arrival waits again (a PD parent's decode sub-request, in
        its decode instance's queue from ``enter_us`` until ``left_us``; None: it did not,
        or did not leave) or completes at ``done_us`` (None: not yet)."""
        self._fit(max(enter_us or 0, left_us or 0, done_us or 0))
        s = self.shift
        if enter_us is not None:
            self.reentries[enter_us >> s] += 1
        if left_us is not None:
            self.leaves[left_us >> s] += 1
        if done_us is not None:
            self.completions[done_us >> s] += 1

    def add_many(self, arrival_us, left_us, done_us) -> None:
        """Many requests at once: int64 arrays of equal length, -1 for "never"."""
        arrival_us = np.asarray(arrival_us, dtype=np.int64)
        if not len(arrival_us):
            return
        left_us = np.asarray(left_us, dtype=np.int64)
        done_us = np.asarray(done_us, dtype=np.int64)
        self._fit(int(max(arrival_us.max(), left_us.max(), done_us.max())))
        s = self.shift
        np.add.at(self.arrivals, arrival_us >> s, 1)
        np.add.at(self.leaves, left_us[left_us >= 0] >> s, 1)
        np.add.at(self.completions, done_us[done_us >= 0] >> s, 1)
        self._saw(int(arrival_us.min()), int(arrival_us.max()), len(arrival_us))

    def _saw(self, first: int, last: int, n: int) -> None:
        if self.first_arrival_us < 0 or first < self.first_arrival_us:
            self.first_arrival_us = first
        self.last_arrival_us = max(self.last_arrival_us, last)
        self.n += n

    def verdict(self, rate_changes=None) -> SaturationVerdict:
        """The saturation test over the arrival window and, given ``rate_changes`` (the
        times, µs, where a time-varying load's arrival rate changes: its pieces' starts and
        ends, any order), over each piece's window (module docstring)."""
        if self.n < 2:
            return SaturationVerdict(False, "fewer than two requests")
        a0, a1 = self.first_arrival_us, self.last_arrival_us
        cums = self._cumulative()
        whole = self._test(cums, a0, a1)
        windows = ([] if rate_changes is None
                   else saturation_windows(rate_changes, a0, a1, 1 << self.shift))
        if len(windows) < 2:           # one window is the whole one
            return whole
        fired = [v for v in (self._test(cums, s, e, True) for s, e in windows) if v.saturated]
        listed = sorted(fired, key=lambda v: (v.achieved_over_offered, v.window_start_us))
        listed = sorted(listed[:MAX_LISTED_WINDOWS], key=lambda v: v.window_start_us)
        return replace(whole, saturated=whole.saturated or bool(fired),
                       windows_tested=len(windows), windows_fired=len(fired),
                       whole_window_saturated=whole.saturated, fired_windows=tuple(listed))

    def _cumulative(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrivals, departures from the backlog and completions before each bin edge."""
        cum_a = np.concatenate(([0], np.cumsum(self.arrivals)))   # cum[j]: events before edge j
        cum_l = np.concatenate(([0], np.cumsum(self.leaves) - np.cumsum(self.reentries)))
        cum_c = np.concatenate(([0], np.cumsum(self.completions)))
        return cum_a, cum_l, cum_c

    def _test(self, cums, a0: int, a1: int, counted: bool = False) -> SaturationVerdict:
        """The test over the window ``[a0, a1]`` (µs); ``counted`` (a window of the pieces):
        also the rise condition (module docstring)."""
        w = 1 << self.shift
        lo = -(-a0 // w)                  # first bin edge at or after the window's start
        hi = a1 // w                      # last edge at or before its end
        if hi - lo + 1 < MIN_SAMPLES:
            return SaturationVerdict(False, f"fewer than {MIN_SAMPLES} samples in the arrival "
                                            "window", window_start_us=a0, window_end_us=a1)
        k = min(MAX_SAMPLES, hi - lo + 1)
        edges = np.unique(np.round(np.linspace(lo, hi, k)).astype(np.int64))
        cum_a, cum_l, cum_c = cums
        backlog = cum_a[edges] - cum_l[edges]
        # ordinary least squares and the slope's standard error, as scipy.stats.linregress
        # gives them; written out because importing scipy.stats costs ~2 s and every run
        # takes this test
        x = edges.astype(np.float64) * (w / 1e6)                   # seconds
        y = backlog.astype(np.float64)
        xm = x.mean()
        sxx = float(((x - xm) ** 2).sum())
        b = float(((x - xm) * (y - y.mean())).sum()) / sxx
        resid = y - (y.mean() + b * (x - xm))
        se = math.sqrt(float((resid ** 2).sum()) / (len(x) - 2) / sxx)
        mid = int(edges[np.searchsorted(edges, (lo + hi) / 2)])
        end = int(edges[-1])
        span_s = (end - mid) * w / 1e6
        arrived = int(cum_a[end] - cum_a[mid])
        if arrived == 0 or span_s <= 0:
            return SaturationVerdict(False, "no arrival in the second half of the window",
                                     window_start_us=a0, window_end_us=a1)
        offered = arrived / span_s
        achieved = int(cum_c[end] - cum_c[mid]) / span_s
        # the deficit, measured twice: the backlog grows by at least the share of the offered
        # rate that a completed/offered ratio below MAX_ACHIEVED_RATIO leaves behind, and the
        # completions do fall short
        grows = (b >= (1 - MAX_ACHIEVED_RATIO) * offered
                 and (se == 0 or b / se >= MIN_T_STAT))
        saturated = grows and achieved < MAX_ACHIEVED_RATIO * offered
        if counted and saturated:
            # a window's rise beyond the counting noise of what entered and left the
            # backlog in it (sd sqrt(in + out) for independent Poisson counts)
            first = int(edges[0])
            moved = int(cum_a[end] - cum_a[first] + cum_l[end] - cum_l[first])
            saturated = int(backlog[-1] - backlog[0]) >= MIN_T_STAT * math.sqrt(max(moved, 0))
        return SaturationVerdict(saturated, "", len(edges), a0, a1, int(backlog[0]),
                                 int(backlog[-1]), b, se, offered, achieved)


def saturation_windows(rate_changes, a0: int, a1: int, bin_us: int) -> list[tuple[int, int]]:
    """The windows ``[start, end]`` (µs) the per-window test covers: the arrival window
    ``[a0, a1]`` cut at the ``rate_changes`` inside it, each piece merged with the ones after
    it until the window holds :data:`MIN_SAMPLES` edges of ``bin_us`` bins and spans at least
    1/:data:`MAX_WINDOWS` of the arrival window; a short remainder joins the window before."""
    inner = np.asarray(rate_changes, dtype=np.int64)
    cuts = np.concatenate(([a0], np.sort(inner[(inner > a0) & (inner < a1)], kind="stable"), [a1]))
    min_len = -(-(a1 - a0) // MAX_WINDOWS)
    out: list[tuple[int, int]] = []
    start = a0
    while start < a1:
        need = max(start + min_len, (-(-start // bin_us) + MIN_SAMPLES - 1) * bin_us)
        j = int(np.searchsorted(cuts, need))
        if j >= len(cuts):                # too short: the rest joins the window before
            if out:
                out[-1] = (out[-1][0], a1)
            else:
                out.append((start, a1))
            break
        end = int(cuts[j])
        out.append((start, end))
        start = end
    return out


def request_times(req, sched_us, done_us) -> tuple[int, int | None, int | None]:
    """``(arrival, left the backlog, completed)`` of one registry row (µs; None: never).
    ``sched_us``: its scheduling delay (from ``origin_us``), ``done_us``: its completion time."""
    if sched_us is not None:
        left = req.origin_us + sched_us
    elif done_us is not None:
        left = done_us
    else:
        deadline = getattr(req, "deadline_us", 0)
        left = deadline if deadline > 0 and getattr(req, "state", None) == TIMED_OUT else None
    return req.arrival_us, left, done_us


def probe_metrics(metrics, parents=None) -> BacklogProbe:
    """A probe of every request in an :class:`~blis_simpy.metrics.records.InstanceMetrics`
    (exact metrics: its registry, scheduling delays and completion times).

    With prefill/decode pools pass the instances' own records aggregated (sub-requests, not
    the projected parents) and ``parents`` (the cluster's parent records by ID): a parent
    arrives and waits with its prefill sub-request, waits again with its decode
    sub-request (``is_decode_sub``: from its enqueue at the decode instance until scheduled
    there), and completes when the cluster saw its decode finish (``completion_us``)."""
    probe = BacklogProbe()
    reg = metrics.registry
    sched = metrics.scheduling_delay
    done = metrics.completion_time
    subs = frozenset(p.prefill_sub_id for p in parents.values()) if parents else frozenset()
    arr, left, comp = [], [], []
    for rid, req in reg.items():
        a, lv, c = request_times(req, sched.get(rid), done.get(rid))
        if getattr(req, "is_decode_sub", False):
            enq = getattr(req, "enqueue_us", -1)
            probe.add_again(enq if enq >= 0 else a, lv, None)
            continue
        arr.append(a)
        left.append(-1 if lv is None else lv)
        comp.append(-1 if c is None or rid in subs else c)
    probe.add_many(arr, left, comp)
    for p in (parents or {}).values():
        if p.completed:
            probe.add_again(None, None, p.completion_us)
    return probe
