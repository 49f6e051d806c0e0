"""The one reader of YAML a user gives: scenarios, policy bundles, workload specs, trace
headers, sweep and plan files, coefficient sets, BLIS ``defaults.yaml`` files.

Untrusted YAML can ask for far more than its size: ten lines of nested aliases ("billion
laughs") expand to a billion nodes, an alias inside its own anchor (``&a [*a]``) to an
endless one, and ten thousand ``[`` overflow Python's stack. :class:`CappedLoader` (PyYAML's
safe loader) refuses, while composing and before anything is built from the document:

* a document of more than :data:`MAX_YAML_BYTES` bytes (:func:`read_text`);
* nesting deeper than :data:`MAX_DEPTH` sequences/mappings;
* aliases that would add more than :data:`MAX_ALIAS_NODES` nodes when expanded (each
  alias counts the nodes of what it names, its own aliases expanded), and an alias to an
  enclosing node;
* with :attr:`CappedLoader.max_nodes` set (a subclass per kind of file: plan files), more
  keys and values than that written in the document (aliases have their own cap): a
  three-megabyte list of a million items takes PyYAML half a minute and a gigabyte to
  build, so a file whose kind is small is refused while composing instead;
* an integer of more than :data:`~blis_simpy.infile.MAX_INT_DIGITS` digits (Python cannot convert it);
* a mapping key that YAML reads as a boolean or null (``yes:``, ``on:``, ``~:``): no key
  of ours is one, and quoted (``'yes':``) it is the string (reported as the key's field).

Each refusal, and every syntax error, is one :class:`~blis_simpy.errors.ConfigError`
naming the file and line (``error: FILE:LINE: problem``; the CLI exits 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from blis_simpy.errors import ConfigError
from blis_simpy.infile import TOO_MANY_DIGITS, open_input, too_many_digits

#: the largest YAML file read, bytes (our files are kilobytes; PyYAML needs minutes for
#: hundreds of megabytes)
MAX_YAML_BYTES = 16 << 20
#: deepest nesting of sequences and mappings (ours nest under ten levels)
MAX_DEPTH = 64
#: nodes that aliases may add to a document when expanded
MAX_ALIAS_NODES = 100_000

_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_INT = "tag:yaml.org,2002:int"


class CappedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the caps of this module enforced while composing."""

    #: nodes (keys, values, items) written in a document at most; None: no cap
    max_nodes: int | None = None
    #: what the document is, for the refusal of ``max_nodes`` ("a plan file")
    kind: str = "this file"

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0              # nodes of the document with its aliases expanded
        self._alias_nodes = 0        # of which aliases added
        self._size: dict[str, int] = {}     # anchor -> expanded size of the node it names
        self._open: set[str] = set()        # anchors of the nodes being composed

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            name = event.anchor
            if name in self._open:
                raise _refuse(f"alias *{name} refers to a node that contains it", event)
            added = self._size.get(name, 0)
            self._nodes += added
            self._alias_nodes += added
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise _refuse(f"aliases expand to more than {MAX_ALIAS_NODES} nodes", event)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refuse(f"nested too deeply (more than {MAX_DEPTH} levels)", event)
        start = self._nodes
        self._nodes += 1
        self._check_nodes(event)
        name = event.anchor
        if name is not None:
            self._open.add(name)
        node = super().compose_node(parent, index)
        if name is not None:
            self._open.discard(name)
            self._size[name] = self._nodes - start
        self._depth -= 1
        return node

    def _check_nodes(self, event) -> None:
        if self.max_nodes is not None and self._nodes - self._alias_nodes > self.max_nodes:
            raise _refuse(f"more than {self.max_nodes:,} keys and values, the most {self.kind} "
                          "may have", event)

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag in (_BOOL, _NULL) and not key.style:
                what = "a boolean" if key.tag == _BOOL else "null"
                raise _refuse(f"reads as {what} in YAML; quote it ('{key.value}') to mean the text",
                              key, field=key.value)
            if isinstance(key, yaml.ScalarNode) and _huge_int(_):     # named by its key here
                raise _refuse(TOO_MANY_DIGITS, _, field=key.value)
        return node


def _huge_int(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _INT and too_many_digits(node.value)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused (located on its line) when it has too many digits to convert (a
    mapping's value is refused while composing, naming its key)."""
    if _huge_int(node):
        raise _refuse(TOO_MANY_DIGITS, node)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


CappedLoader.add_constructor(_INT, _construct_int)


class _Refused(yaml.MarkedYAMLError):
    """A cap of this module was hit (located by the event or node that hit it)."""

    field: str | None = None


def _refuse(problem: str, at, field: str | None = None) -> _Refused:
    e = _Refused(problem=problem, problem_mark=at.start_mark)
    e.field = field
    return e


def read_text(path: str, *, max_bytes: int = MAX_YAML_BYTES) -> str:
    """The UTF-8 text of ``path`` (a leading BOM dropped), at most ``max_bytes`` bytes; a
    missing, unreadable, undecodable or larger file is a ConfigError naming it."""
    path = str(path)
    try:
        # a FIFO that no process writes reads as empty instead of blocking in open() for ever
        with open_input(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", file=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a YAML file", file=path) from None
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror or e}", file=path) from None
    if len(raw) > max_bytes:
        raise ConfigError(f"larger than {max_bytes} bytes", file=path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"not valid UTF-8 ({e.reason})", file=path, line=line) from None


def parse(text: str, path: str | None, *, loader: type[CappedLoader] = CappedLoader,
          check: Callable[[yaml.Node], None] | None = None) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML document: ``(data, root_node)``, ``(None, None)`` when it is empty.

    ``check(root_node)`` runs between composing and building the data (duplicate keys,
    key lines) and may raise its own ConfigError. Any YAML problem is a ConfigError naming
    ``path`` and the line."""
    try:
        ldr = loader(text)
    except yaml.reader.ReaderError as e:        # a NUL or other non-printable character
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        raise ConfigError(f"invalid YAML: unacceptable character #x{e.character:04x}: "
                          "special characters are not allowed", file=path, line=line) from None
    try:
        node = ldr.get_single_node()
        if node is not None and check is not None:
            check(node)
        data = ldr.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(p for p in (e.context, e.problem) if p) or "invalid YAML"
        prefix = "" if isinstance(e, _Refused) else "invalid YAML: "
        raise ConfigError(prefix + problem, file=path, line=mark.line + 1 if mark else None,
                          field=getattr(e, "field", None)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}".replace("<unicode string>", path or "YAML"),
                          file=path) from None
    except RecursionError:      # not expected under MAX_DEPTH; still one line
        raise ConfigError(f"nested too deeply (more than {MAX_DEPTH} levels)", file=path) from None
    finally:
        ldr.dispose()
    return data, node


def load(path: str, *, loader: type[CappedLoader] = CappedLoader,
         check: Callable[[yaml.Node], None] | None = None) -> tuple[Any, yaml.Node | None]:
    """:func:`read_text` then :func:`parse`."""
    return parse(read_text(path), str(path), loader=loader, check=check)


__all__ = ["MAX_ALIAS_NODES", "MAX_DEPTH", "MAX_YAML_BYTES", "CappedLoader", "load", "parse", "read_text"]
