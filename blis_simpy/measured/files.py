"""Capped, located readers of the files of a measured run: JSONL, JSON and the timeseries CSV.

Every malformed input is a :class:`~blis_simpy.errors.ConfigError` naming the file, the
1-based line and the field. Inputs are capped: :data:`MAX_ROWS` lines a file,
:data:`MAX_TOKEN_IDS` token IDs a file, :data:`MAX_FILE_BYTES` bytes a file
(:data:`MAX_META_BYTES` for a JSON object file such as meta.json). Timeseries ticks are
seconds; throughputs tokens/s.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from blis_simpy.errors import ConfigError
from blis_simpy.infile import json_loads, open_input, read_input_text
from blis_simpy.measured.run import Tick
from blis_simpy.workload.tracev2 import MAX_TOKEN_IDS_PER_FILE

MAX_ROWS = 1_000_000                     # lines of one JSONL / CSV file
MAX_FILE_BYTES = 2 << 30                 # 2 GiB: any one input file
MAX_META_BYTES = 64 << 20                # meta.json
MAX_TOKEN_IDS = MAX_TOKEN_IDS_PER_FILE   # token IDs of one workload file (all lines)
MAX_TOKEN_ID = 2**31 - 1                 # a token ID: the traces store them as int32


def is_number(v, *, integer: bool = False) -> bool:
    """A JSON number (not a bool) that is finite; with ``integer``, also integral."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if integer:
        return isinstance(v, int) or (float(v).is_integer() and math.isfinite(v))
    return math.isfinite(v)


def read_jsonl(path: Path, numbers: tuple[str, ...] = (), integers: tuple[str, ...] = (),
               id_lists: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a JSONL file; each named key must be present with the right type
    (``id_lists``: lists of token IDs, integers >= 0)."""
    try:
        return _read_jsonl(path, numbers, integers, id_lists)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None


def _read_jsonl(path: Path, numbers: tuple[str, ...], integers: tuple[str, ...],
                id_lists: tuple[str, ...]) -> list[dict]:
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes", file=str(path))
    rows = []
    n_ids = 0
    with open_input(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            if len(rows) >= MAX_ROWS:
                raise ConfigError(f"more than {MAX_ROWS} rows", file=str(path), line=ln)
            try:
                row = json_loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not JSON: {exc.msg}", file=str(path), line=ln) from None
            except RecursionError:
                raise ConfigError("not JSON: nested too deeply", file=str(path), line=ln) from None
            if not isinstance(row, dict):
                raise ConfigError("not a JSON object", file=str(path), line=ln)
            for key in numbers + integers:
                if not is_number(row.get(key), integer=key in integers):
                    kind = "an integer" if key in integers else "a finite number"
                    raise ConfigError(f"missing or not {kind}", file=str(path), line=ln, field=key)
            for key in id_lists:
                ids = row.get(key)
                if not isinstance(ids, list) or not all(type(x) is int and 0 <= x <= MAX_TOKEN_ID for x in ids):
                    raise ConfigError(f"missing or not a list of token IDs (integers 0 to {MAX_TOKEN_ID})",
                                      file=str(path), line=ln, field=key)
                n_ids += len(ids)
                if n_ids > MAX_TOKEN_IDS:
                    raise ConfigError(f"more than {MAX_TOKEN_IDS} token IDs in the file",
                                      file=str(path), line=ln, field=key)
            rows.append(row)
    if not rows:
        raise ConfigError("no rows", file=str(path))
    return rows


def read_json_object(path: Path, max_bytes: int) -> dict:
    """A JSON file holding one object, at most ``max_bytes``; errors are located."""
    return read_json_text(path, max_bytes)[0]


def read_json_text(path: Path, max_bytes: int) -> tuple[dict, str]:
    """:func:`read_json_object` and the file's text (to locate keys: :func:`json_line`)."""
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    if path.stat().st_size > max_bytes:
        raise ConfigError(f"larger than {max_bytes} bytes", file=str(path))
    try:
        text = read_input_text(path)
        data = json_loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    except RecursionError:
        raise ConfigError("not JSON: nested too deeply", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object", file=str(path))
    return data, text


def json_line(text: str, keys: tuple[str, ...]) -> int | None:
    """The 1-based line of the nested key ``keys`` in JSON ``text`` written one key a line
    (``json.dump(indent=...)``): each key is looked for after the one before it. None when
    a key is not found (then the error names the field only)."""
    pos = 0
    for k in keys:
        pos = text.find(json.dumps(k), pos)
        if pos < 0:
            return None
    return text.count("\n", 0, pos) + 1


def read_ticks(path: Path) -> list[Tick]:
    """timeseries.csv: ``t,prompt_throughput,gen_throughput,running,waiting[,kv_cache_pct]``
    (``t_s`` instead of ``t`` is accepted, as ``convert`` writes it)."""
    try:
        return _read_ticks(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None
    except csv.Error as exc:
        raise ConfigError(f"malformed CSV: {exc}", file=str(path)) from None


def _read_ticks(path: Path) -> list[Tick]:
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    ticks = []
    with open_input(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        names = reader.fieldnames or []
        t_col = "t_s" if "t_s" in names and "t" not in names else "t"
        need = (t_col, "prompt_throughput", "gen_throughput", "running", "waiting")
        missing = [c for c in need if c not in names]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", file=str(path), line=1)
        has_kv = "kv_cache_pct" in names
        for ln, row in enumerate(reader, 2):
            if len(ticks) >= MAX_ROWS:
                raise ConfigError(f"more than {MAX_ROWS} rows", file=str(path), line=ln)
            try:
                vals = [float(row[c]) for c in need]
                kv = float(row["kv_cache_pct"]) if has_kv and row["kv_cache_pct"] not in ("", None) else None
            except (TypeError, ValueError):
                raise ConfigError("not a number in a needed column", file=str(path), line=ln) from None
            if not all(math.isfinite(v) and v >= 0 for v in vals) or not all(
                    v.is_integer() for v in vals[3:]) or (kv is not None and not 0 <= kv <= 100):
                raise ConfigError("values must be finite, >= 0, gauges integers, kv_cache_pct "
                                  "in [0, 100]", file=str(path), line=ln)
            ticks.append(Tick(vals[0], vals[1], vals[2], int(vals[3]), int(vals[4]), kv))
    if not ticks:
        raise ConfigError("no rows", file=str(path))
    return ticks
