"""inference-perf's ``stage_N_lifecycle_metrics.json`` and ``summary_lifecycle_metrics.json``
read into :class:`~blis_simpy.measured.run.AggregateStats` (docs/workloads.md,
"inference-perf results").

Each file is one JSON object (inference-perf ``reportgen/base.py``, ``summarize_requests``):
``load_summary.count`` (requests sent), ``successes`` (``count``; ``latency`` with
``request_latency``, ``time_to_first_token``, ``inter_token_latency``,
``time_per_output_token``, each null or ``{mean, min, p0.1 … p99.9, median, max}`` in seconds;
``prompt_len``, ``output_len`` in tokens) and ``failures`` (``count``, ``request_latency``).
Times become ms here. A malformed value is a ConfigError naming the file, the line of the key
and the dotted field. Caps: :data:`MAX_LIFECYCLE_BYTES` a file.
"""

from __future__ import annotations

from pathlib import Path

from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import is_number, json_line, read_json_text
from blis_simpy.measured.run import AggregateStats

MAX_LIFECYCLE_BYTES = 16 << 20
#: our metric name -> inference-perf's key under successes.latency
LATENCY_KEYS = {"ttft": "time_to_first_token", "itl": "inter_token_latency",
                "tpot": "time_per_output_token", "e2e": "request_latency"}
#: our statistic -> inference-perf's key (np.percentile, linear interpolation; 50 is "median")
STAT_KEYS = {"mean": "mean", "p50": "median", "p90": "p90", "p99": "p99"}
#: the largest latency a file may report, s (about 31 years: µs of it fit int64 many times over)
MAX_SECONDS = 1e9
MAX_COUNT = 1 << 40


class _File:
    def __init__(self, path: Path):
        self.path = path
        self.data, self.text = read_json_text(path, MAX_LIFECYCLE_BYTES)

    def error(self, problem: str, keys: tuple[str, ...]) -> ConfigError:
        return ConfigError(problem, file=str(self.path), line=json_line(self.text, keys), field=".".join(keys))

    def get(self, keys: tuple[str, ...], *, required: bool = True):
        cur = self.data
        for i, k in enumerate(keys):
            if not isinstance(cur, dict):
                raise self.error("not a JSON object", keys[:i])
            if cur.get(k) is None:
                if required:
                    raise self.error("missing", keys)
                return None
            cur = cur[k]
        return cur

    def count(self, keys: tuple[str, ...]) -> int:
        v = self.get(keys)
        if not is_number(v, integer=True) or not 0 <= v <= MAX_COUNT:
            raise self.error(f"not a count (an integer >= 0): {v!r}", keys)
        return int(v)

    def seconds(self, keys: tuple[str, ...]) -> float:
        v = self.get(keys)
        if not is_number(v) or not 0 <= v <= MAX_SECONDS:
            raise self.error(f"not a number of seconds in [0, {MAX_SECONDS:g}]: {v!r}", keys)
        return float(v)

    def mean(self, keys: tuple[str, ...]) -> float | None:
        if self.get(keys, required=False) is None:
            return None
        v = self.get(keys + ("mean",))
        if not is_number(v) or v < 0:
            raise self.error(f"not a number >= 0: {v!r}", keys + ("mean",))
        return float(v)


def read_lifecycle(path: Path) -> tuple[AggregateStats, int]:
    """The :class:`AggregateStats` of one lifecycle file and its ``load_summary.count``."""
    f = _File(Path(path))
    sent = f.count(("load_summary", "count"))
    ok = f.count(("successes", "count"))
    failed = f.count(("failures", "count"))
    if ok + failed != sent:
        raise f.error(f"successes {ok} + failures {failed} is not the {sent} requests sent", ("load_summary", "count"))
    latency: dict[str, dict[str, float]] = {}
    longest = 0.0
    for ours, key in LATENCY_KEYS.items():
        base = ("successes", "latency", key)
        if ok == 0 or f.get(base, required=ours == "e2e") is None:
            continue
        latency[ours] = {s: 1000.0 * f.seconds(base + (k,)) for s, k in STAT_KEYS.items()}
        if ours == "e2e":
            longest = f.seconds(base + ("max",))
    if failed and f.get(("failures", "request_latency"), required=False) is not None:
        longest = max(longest, f.seconds(("failures", "request_latency", "max")))
    stats = AggregateStats(
        successes=ok, failures=failed, latency_ms=latency,
        prompt_len_mean=f.mean(("successes", "prompt_len")) if ok else None,
        output_len_mean=f.mean(("successes", "output_len")) if ok else None,
        max_latency_ms=1000.0 * longest)
    return stats, sent
