"""Strict YAML loading with source positions, shared by the workload-spec and trace loaders.

Every problem becomes a :class:`~blis_simpy.errors.ConfigError` carrying the file, the
1-based line of the offending key (from the YAML node marks) and the field path. Field paths
are rendered like BLIS's messages: ``client[2].arrival.cv`` (the ``clients`` / ``cohorts``
lists use the singular name), ``server.block_size``.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic
import yaml

from blis_simpy.errors import ConfigError, validation_problem
from blis_simpy.yaml_input import CappedLoader, parse, read_text

_SINGULAR = {"clients": "client", "cohorts": "cohort"}
_PLURAL = {v: k for k, v in _SINGULAR.items()}


class _Loader(CappedLoader):
    """The capped safe loader (:mod:`blis_simpy.yaml_input`: size, nesting and alias caps)
    that keeps timestamps as strings (Go's yaml decodes them into strings)."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.2 / Go floats without a dot ("1e+06", as Go's yaml writes 1000000.0) are floats too.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _check_duplicates(node: yaml.Node | None, path: str) -> None:
    """Reject duplicate mapping keys anywhere in the document (PyYAML silently keeps the last)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        raise ConfigError("duplicate key", file=path, line=k.start_mark.line + 1,
                                          field=k.value)
                    seen.add(k.value)
                stack.append(v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def load_yaml(path: str, text: str | None = None) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML document through the capped reader; returns ``(data, root_node)``
    (``(None, None)`` if empty)."""
    path = str(path)
    if text is None:
        text = read_text(path)
    return parse(text, path, loader=_Loader, check=lambda node: _check_duplicates(node, path))


def line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the key addressed by ``loc`` (or of its deepest existing ancestor)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def render_loc(loc: tuple) -> str:
    """``('clients', 2, 'arrival', 'cv')`` → ``client[2].arrival.cv``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            nxt = loc[i + 1] if i + 1 < len(loc) else None
            name = _SINGULAR.get(part, part) if isinstance(nxt, int) else part
            out += ("." if out else "") + name
    return out


_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_field(field: str) -> tuple:
    """Inverse of :func:`render_loc` (best effort): ``client[2].cv`` → ``('clients', 2, 'cv')``."""
    parts: list = []
    for m in _PART.finditer(field):
        if m.group(2) is not None:
            if parts and parts[-1] in _PLURAL:
                parts[-1] = _PLURAL[parts[-1]]
            parts.append(int(m.group(2)))
        else:
            parts.append(m.group(1))
    return tuple(parts)


def locate(err: ConfigError, path: str, node: yaml.Node | None) -> ConfigError:
    """Add file and line (from ``err.field``) to an error raised by semantic validation."""
    if err.file:
        return err
    line = err.line or (line_of(node, parse_field(err.field)) if err.field else None)
    return ConfigError(err.problem, file=str(path), line=line, field=err.field)


def _clean_loc(loc: tuple) -> tuple:
    # pydantic inserts validator/union tags (e.g. "function-after[...]") in the location
    return tuple(p for p in loc if isinstance(p, int) or not any(c in p for c in "[]()"))


def from_validation_error(e: pydantic.ValidationError, path: str | None,
                          node: yaml.Node | None, model: type | None = None) -> ConfigError:
    """The first pydantic error as a ConfigError naming the key, with its line if known
    (and, with the ``model`` validated, the known keys closest to an unknown one)."""
    first = e.errors(include_url=False)[0]
    loc = _clean_loc(tuple(first["loc"]))
    return ConfigError(validation_problem(first, model), file=str(path) if path else None,
                       line=line_of(node, loc) if path else None,
                       field=render_loc(loc) or None)
