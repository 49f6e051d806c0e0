"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

#: Property tests are derandomised by default so every run draws the same examples: a failure
#: reproduces on the next run and on CI. Example counts stay per test (``@settings(max_examples=)``,
#: else Hypothesis's 100); ``deadline=None`` because a per-example time limit flakes on a busy
#: machine; ``database=None`` so an example saved by an earlier run cannot change what runs.
#: ``HYPOTHESIS_PROFILE=dev`` draws fresh random examples (to look for new failures).
settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None, database=None,
                          print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Table widths follow ``$COLUMNS`` (docs/cli.md, "Tables and the terminal width"); the tests
#: expect the width of piped output unless they set one themselves, whatever the shell that
#: runs them exported (pytest-xdist's workers get COLUMNS=80).
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)

REPO = Path(__file__).resolve().parents[1]
#: the sibling folder of real vLLM runs and BLIS's reference files beside a development checkout;
#: ``BLIS_SIMPY_SHARED_DIR`` points the tests elsewhere (an empty folder: a user's fresh clone)
SHARED = Path(os.environ.get("BLIS_SIMPY_SHARED_DIR") or REPO / ".." / "shared").resolve()
#: small excerpts of those files, shipped with the tests (tests/data/README.md names the sources)
EXCERPTS = REPO / "tests" / "data"
#: the Go BLIS's recorded outputs, kept in the repository (tests/conformance/cases/README.md)
CONFORMANCE = REPO / "tests" / "conformance" / "cases"


def conformance_case(name: str) -> Path:
    """The folder of one recorded conformance case; fails (never skips) if it is missing."""
    p = CONFORMANCE / name
    assert p.is_dir(), f"conformance case {name} is not in {CONFORMANCE}"
    return p


@dataclass(frozen=True)
class DataSource:
    """Where a test reads real data from: ``kind`` is ``"excerpt"`` (the shipped tests/data)
    or ``"full"`` (the same path under :data:`SHARED`); ``root`` the folder the parts live in."""

    kind: str
    root: Path

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @property
    def full(self) -> bool:
        return self.kind == "full"


def data_sources(*parts: str, excerpt: str | None = None) -> list:
    """pytest params for a fixture over ``parts`` (e.g. ``"realdata"``): the shipped excerpt
    (``tests/data/<parts>``, or ``tests/data/<excerpt>``) always, and the full folder under
    :data:`SHARED` when it is there. Nothing skips without it: the full case is then simply
    not collected."""
    mine = EXCERPTS / excerpt if excerpt else EXCERPTS.joinpath(*parts)
    assert mine.is_dir(), f"the shipped excerpt {mine} is missing"
    out = [pytest.param(DataSource("excerpt", mine), id="excerpt")]
    if SHARED.joinpath(*parts).exists():
        out.append(pytest.param(DataSource("full", SHARED.joinpath(*parts)), id="full"))
    return out


@dataclass(frozen=True)
class RealFacts:
    """What the tests know of one realdata source (tests/data/README.md): requests per run, the
    workload file, and a later turn whose prompt begins with all of an earlier one's
    (``pair``: earlier line, later line, their prompt lengths in tokens; lines 0-based)."""

    requests: int
    workload: str
    pair: tuple[int, int, int, int]


REALDATA_FACTS = {
    "full": RealFacts(300, "workload-sharegpt-llama-3.1-8b-300-sps10.jsonl", (207, 237, 1265, 1871)),
    "excerpt": RealFacts(48, "workload-sharegpt-llama-3.1-8b-48-sps10.jsonl", (40, 47, 455, 1255)),
}


@pytest.fixture(scope="module", params=data_sources("realdata"))
def realdata(request) -> DataSource:
    """The folder of the two real vLLM runs and their workload: the shipped excerpt (the first
    48 requests), and the full runs when they are beside the checkout."""
    return request.param
