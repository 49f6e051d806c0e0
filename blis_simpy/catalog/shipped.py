"""The YAML files shipped in ``catalog/data/`` (``gpus.yaml``, ``models.yaml``,
``coefficients.yaml``): ours, read-only, trusted.

The YAML files are the source (edited by hand, commented with their sources). Beside each
is a compiled copy, ``catalog/data/compiled/<stem>.json``: the same values as JSON plus the
SHA-256 of the YAML text it was made from. :func:`read_shipped` reads the copy when that hash
matches the YAML file next to it, and parses the YAML otherwise, so an out-of-date copy is
never used, only slower. JSON loads in C: the three files take ~0.3 ms against ~12 ms for
libyaml's parser plus PyYAML's Python constructor, which was the largest single item of a
small run's configuration time (docs/performance.md, "Start-up").

``python -m blis_simpy.catalog.shipped`` (``make catalog``) rewrites the copies after an
edit; tests/catalog/test_shipped.py fails while a copy is out of date and checks that each
copy loads to exactly what ``yaml.safe_load`` gives (same key order, same Python types).
Without libyaml the pure-Python safe loader reads the YAML. Files a user gives go through
the capped reader of :mod:`blis_simpy.yaml_input` instead.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import resources

SHIPPED = ("gpus.yaml", "models.yaml", "coefficients.yaml")


def safe_loader():
    """libyaml's safe loader when PyYAML was built with it, else the pure-Python one."""
    import yaml
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _data():
    return resources.files("blis_simpy.catalog").joinpath("data")


def _compiled_name(name: str) -> str:
    return "compiled/" + name.rsplit(".", 1)[0] + ".json"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_yaml(text: str) -> object:
    """``text`` parsed as :func:`yaml.safe_load` parses it (libyaml when available)."""
    import yaml
    return yaml.load(text, Loader=safe_loader())


def read_shipped(name: str) -> object:
    """``catalog/data/<name>`` parsed as YAML (``name``: e.g. ``gpus.yaml``), from its
    compiled copy when that copy was made from this very text."""
    text = _data().joinpath(name).read_text("utf-8")
    try:
        blob = json.loads(_data().joinpath(_compiled_name(name)).read_text("utf-8"))
        if isinstance(blob, dict) and "data" in blob and blob.get("yaml_sha256") == _digest(text):
            return blob["data"]
    except (OSError, ValueError):
        pass
    return parse_yaml(text)


def _check_json_safe(value, where: str) -> None:
    """Refuse what JSON would not give back as it is: non-string keys, tuples, dates, ..."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: key {k!r} is not a string")
            _check_json_safe(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json_safe(v, f"{where}[{i}]")
    elif value is not None and type(value) not in (str, int, float, bool):
        raise ValueError(f"{where}: {type(value).__name__} value {value!r} does not survive JSON")


def compiled_text(name: str) -> str:
    """The compiled copy of ``catalog/data/<name>`` as it should be on disk."""
    text = _data().joinpath(name).read_text("utf-8")
    data = parse_yaml(text)
    _check_json_safe(data, name)
    return json.dumps({"source": f"catalog/data/{name}", "yaml_sha256": _digest(text),
                       "data": data}, indent=1, allow_nan=True) + "\n"


def write_compiled() -> list[str]:
    """Rewrite every compiled copy whose content changed; the names rewritten."""
    written = []
    for name in SHIPPED:
        want = compiled_text(name)
        target = _data().joinpath(_compiled_name(name))
        try:
            have = target.read_text("utf-8")
        except OSError:
            have = None
        if have != want:
            with open(str(target), "w", encoding="utf-8") as fh:
                fh.write(want)
            written.append(name)
    return written


if __name__ == "__main__":
    changed = write_compiled()
    print("rewrote " + ", ".join(changed) if changed else "compiled catalogs are up to date",
          file=sys.stderr)


__all__ = ["SHIPPED", "compiled_text", "parse_yaml", "read_shipped", "safe_loader", "write_compiled"]
