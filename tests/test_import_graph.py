"""Dependencies point one way: the package import graph of blis_simpy has no cycle.

Every ``import blis_simpy.X`` / ``from blis_simpy.X import`` counts, at module level or inside
a function: a function-level import that dodges a cycle is still a cycle. The graph is read
from the source with :mod:`ast` (nothing is imported). Also checks the layering the
architecture promises: latency and kv know nothing of SimPy or of the engine above them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "blis_simpy"


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(PKG.rglob("*.py"))}


def _imports() -> dict[str, set[str]]:
    """module -> every module it imports anywhere in its source (absolute names;
    ``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module)."""
    mods = _modules()
    out: dict[str, set[str]] = {}
    for mod, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
                found |= subs
                if len(subs) < len(node.names):
                    found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[mod] = found - {mod}
    return out


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for mod, deps in _imports().items():
        for dep in deps:
            if not dep.startswith("blis_simpy."):
                continue
            a, b = _package(mod), _package(dep)
            if a != b:
                g[a].add(b)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    assert _cycles(_graph()) == []


def test_no_import_cycle_between_modules():
    """Module by module, function-level imports included (a package's ``__init__`` that
    re-exports its submodules is the package itself importing them, not a cycle)."""
    mods = _modules().keys()
    g = {m: {d for d in deps if d in mods} for m, deps in _imports().items()}
    assert _cycles(g) == []


def test_a_cycle_is_detected():
    """The checker itself: a two-package loop is reported."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_latency_and_kv_sit_below_the_engine():
    g = _graph()
    for low in ("latency", "kv", "catalog", "units", "errors", "request"):
        above = g.get(low, set()) & {"engine", "cluster", "config", "cli", "disagg", "routing",
                                     "admission", "des"}
        assert not above, f"{low} imports {sorted(above)}"
    for low in ("latency", "kv"):
        for mod, deps in _imports().items():
            if _package(mod) == low:
                assert not any(d == "simpy" or d.startswith("simpy.") for d in deps), mod


def test_the_architecture_doc_lists_the_exact_package_edges():
    """docs/architecture.md's table of package imports is the code's graph, edge for edge."""
    doc = (PKG.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {}
    for line in doc[doc.index("| level | package | imports |"):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        _, pkgs, deps = (c.strip() for c in line.strip("|").split("|"))
        for p in pkgs.replace("`", "").split(","):
            rows[p.strip()] = {d.strip() for d in deps.split(",")}
    g = {k: v for k, v in _graph().items() if k != "__main__"}
    assert rows == g


def _bench_imports() -> dict[str, set[str]]:
    """bench script -> every blis_simpy module it imports (anywhere in its source)."""
    out = {}
    for path in sorted((PKG.parent / "bench").glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[f"bench/{path.name}"] = {m for m in found if m.startswith("blis_simpy")}
    return out


def _imports_cli(deps: set[str]) -> set[str]:
    return {d for d in deps if d == "blis_simpy.cli" or d.startswith("blis_simpy.cli.")}


def test_nothing_outside_the_cli_imports_the_cli():
    """The CLI sits on top: no package of blis_simpy (``__main__``, the console entry,
    aside) and no bench script imports ``blis_simpy.cli``; they go through the run layer."""
    bad = {mod: sorted(_imports_cli(deps)) for mod, deps in _imports().items()
           if _package(mod) not in ("cli", "__main__") and _imports_cli(deps)}
    bad |= {script: sorted(_imports_cli(deps)) for script, deps in _bench_imports().items()
            if _imports_cli(deps)}
    assert bad == {}


def test_the_cli_check_sees_a_bench_import():
    """The checker itself: the bench scan finds what the bench scripts import."""
    found = _bench_imports()
    assert "blis_simpy.run" in found["bench/bench_replay.py"]
    assert _imports_cli({"blis_simpy.cli.runner", "blis_simpy.run", "blis_simpy.client"}) == {
        "blis_simpy.cli.runner"}


def test_only_the_run_layer_builds_a_simulation():
    """``Simulation(...)``, the composition root, lives in the run layer and is constructed
    there alone: the CLI, calibrate, fit, the planner and bench go through
    :mod:`blis_simpy.run`."""
    assert (PKG / "run" / "simulation.py").exists() and not (PKG / "cluster" / "simulation.py").exists()
    files = [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] != "run"]
    files += sorted((PKG.parent / "bench").glob("*.py"))
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Simulation"):
                bad.append(str(path.relative_to(PKG.parent)))
    assert bad == []
