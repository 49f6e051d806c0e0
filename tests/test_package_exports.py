"""blis_simpy.workload re-exports its public names lazily (PEP 562): each name resolves to
the object its submodule defines, and importing the package loads no submodule."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import blis_simpy.workload as workload


def test_every_exported_name_is_its_submodules_object():
    assert sorted(workload.__all__) == sorted(workload._EXPORTS)
    for name, module in workload._EXPORTS.items():
        sub = importlib.import_module(f"blis_simpy.workload.{module}")
        assert getattr(workload, name) is getattr(sub, name), name
    assert set(workload.__all__) <= set(dir(workload))


def test_from_import_of_a_name_and_of_a_submodule():
    from blis_simpy.workload import _yaml, read_trace
    from blis_simpy.workload.tracev2_read import read_trace as direct
    assert read_trace is direct and _yaml.__name__ == "blis_simpy.workload._yaml"


def test_an_unknown_name_is_an_attribute_error():
    try:
        workload.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_package_loads_no_submodule():
    code = ("import sys, json, blis_simpy.workload; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('blis_simpy.workload.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert json.loads(out) == []
