"""Run every command of README.md and docs/*.md that is marked runnable (docs/extending.md,
"Writing docs"), and keep the README's page table and layout complete.

A fenced block is runnable when its info string carries the word ``runnable``:

* ```` ```sh runnable ```` — every command of the block (``#`` comments and blank lines
  skipped, ``\\`` continuations joined);
* ```` ```console runnable ```` — the lines starting with ``$ ``; the lines after a command
  (up to the next ``$ ``) are its output, and must be what it prints: stdout, then stderr,
  line by line with trailing spaces dropped (nothing shown = nothing printed);
* ```` ```python runnable ```` — the whole block, as a script.

Each page runs in its own scratch copy of the repository (without tests/; nothing is
written into the repo),
with the page's named blocks — a block whose first line is ``# NAME.py`` / ``# NAME.yaml``
— saved there under that name first, and its commands in page order (a later command may
read what an earlier one wrote). ``blis-simpy`` and ``python`` are this interpreter
(``sys.executable -m blis_simpy``), through shims first on ``PATH``. A command passes when
it exits 0 within its timeout (and, in a transcript, prints the output shown); ``bash -o
pipefail`` makes a failure anywhere in a pipe count.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 60                 # per command; each marked one takes ~1-5 s alone
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_NAMED = re.compile(r"^#\s*(?P<name>[A-Za-z0-9_.-]+\.(?:py|ya?ml|csv|json|toml))\b")
_SKIP_ANYWHERE = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}
# outputs, not sources; and tests/ (6 MB), which no documented command reads
_SKIP_AT_ROOT = {"results", "report", "runs", "logs", "plots", "build", "dist", "tests", ".ci"}


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    at_root = Path(folder) == ROOT
    return {n for n in names if n in _SKIP_ANYWHERE or n.endswith(".egg-info")
            or (at_root and (n in _SKIP_AT_ROOT or n.startswith("results")))}


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, the other words of its info string, its body and
    the 1-based line of its opening fence."""

    lang: str
    flags: tuple[str, ...]
    body: str
    line: int

    @property
    def runnable(self) -> bool:
        return "runnable" in self.flags


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text (CommonMark fences: ``` or ~~~, 3+ long)."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, words = m["fence"], m["info"].split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                       and set(lines[i].strip()) == {fence[0]}):
            body.append(lines[i])
            i += 1
        i += 1
        out.append(Block(words[0] if words else "", tuple(words[1:]), "\n".join(body) + "\n", start))
    return out


def _join_continuations(lines: list[str]) -> list[str]:
    out, cur = [], ""
    for raw in lines:
        cur = f"{cur} {raw.strip()}" if cur else raw.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


def commands(block: Block) -> list[str]:
    """The shell commands of a ``sh``/``bash``/``console`` block, continuations joined."""
    lines = block.body.rstrip("\n").split("\n")
    if block.lang == "console":
        picked, inside = [], False
        for ln in lines:
            if ln.startswith("$ "):
                picked.append(ln[2:])
                inside = ln.rstrip().endswith("\\")
            elif inside:
                picked.append(ln)
                inside = ln.rstrip().endswith("\\")
        lines = picked
    else:
        lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return [c for c in _join_continuations(lines) if c]


def transcript(block: Block) -> list[tuple[str, list[str]]]:
    """A ``console`` block's commands, each with the output lines shown after it."""
    out: list[tuple[str, list[str]]] = []
    inside = False
    for ln in block.body.rstrip("\n").split("\n"):
        if ln.startswith("$ "):
            out.append((ln[2:], []))
        elif inside:
            out[-1] = (out[-1][0] + "\n" + ln, out[-1][1])
        elif out:
            out[-1][1].append(ln.rstrip())
        inside = (ln.startswith("$ ") or inside) and ln.rstrip().endswith("\\")
    return [(_join_continuations(cmd.split("\n"))[0], shown) for cmd, shown in out]


def _printed(proc: subprocess.CompletedProcess) -> list[str]:
    text = (proc.stdout + proc.stderr).rstrip("\n")
    return [ln.rstrip() for ln in text.split("\n")] if text else []


def named_files(page_blocks: list[Block]) -> dict[str, str]:
    """The blocks of a page whose first line is ``# NAME.ext``: name -> text."""
    files = {}
    for b in page_blocks:
        m = _NAMED.match(b.body.split("\n", 1)[0])
        if m is not None and b.lang in ("python", "yaml", "yml", "toml", "json", "csv"):
            files[m["name"]] = b.body
    return files


def _shims(tmp: Path) -> Path:
    bindir = tmp / "shim-bin"
    bindir.mkdir()
    for name, target in (("blis-simpy", f'"{sys.executable}" -m blis_simpy'),
                         ("python", f'"{sys.executable}"'), ("python3", f'"{sys.executable}"')):
        p = bindir / name
        p.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bindir


def _run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


RUNNABLE_PAGES = [p for p in PAGES if any(b.runnable for b in blocks(p.read_text()))]


def run_page(text: str, rel: str, tmp: Path) -> tuple[int, str | None]:
    """Run the runnable blocks of one page (``rel`` names it in messages) in a scratch copy
    of the repository under ``tmp``: (commands that passed, the first failure or None)."""
    page_blocks = blocks(text)
    work = tmp / "repo"
    shutil.copytree(ROOT, work, ignore=_copy_ignore, symlinks=True)
    for name, body in named_files(page_blocks).items():
        (work / name).write_text(body)
    env = dict(os.environ, PATH=f"{_shims(tmp)}{os.pathsep}{os.environ.get('PATH', '')}",
               COLUMNS="120", NO_COLOR="1")
    env.pop("PYTHONPATH", None)
    ran = 0
    for b in (b for b in page_blocks if b.runnable):
        if b.lang == "python":
            script = work / f"_doc_block_{b.line}.py"
            script.write_text(b.body)
            todo = [(f"python block at {rel}:{b.line}", [sys.executable, script.name], None)]
        elif b.lang == "console":
            todo = [(c, ["bash", "-o", "pipefail", "-c", c], shown) for c, shown in transcript(b)]
        elif b.lang in ("sh", "bash"):
            todo = [(c, ["bash", "-o", "pipefail", "-c", c], None) for c in commands(b)]
        else:
            return ran, f"{rel}:{b.line}: a runnable {b.lang!r} block (sh, console or python)"
        if not todo:
            return ran, f"{rel}:{b.line}: a runnable block with no command"
        for shown, argv, output in todo:
            try:
                proc = _run(argv, work, env)
            except subprocess.TimeoutExpired:
                return ran, f"{rel}:{b.line}: `{shown}` did not finish in {TIMEOUT_S} s"
            if proc.returncode != 0:
                return ran, (f"{rel}:{b.line}: `{shown}` exited {proc.returncode}\n"
                             f"stdout (end): {proc.stdout[-1500:]}\nstderr (end): {proc.stderr[-1500:]}")
            if output is not None and _printed(proc) != output:
                return ran, (f"{rel}:{b.line}: `{shown}` printed\n" + "\n".join(_printed(proc))
                             + "\nnot the output shown:\n" + "\n".join(output))
            ran += 1
    return ran, None


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_runnable_commands_exit_0(page: Path, tmp_path: Path):
    ran, failure = run_page(page.read_text(), page.relative_to(ROOT).as_posix(), tmp_path)
    assert failure is None, failure
    assert ran > 0


def test_a_failing_command_is_reported_and_named_blocks_are_saved(tmp_path: Path):
    page = "\n".join([
        "```yaml", "# tiny.yaml", "model: m", "latency: {model: blackbox, alpha_coeffs: [0, 0, 0],"
        " beta_coeffs: [1000, 0, 0]}", "engine: {total_kv_blocks: 100}", "```",
        "```sh runnable", "blis-simpy validate tiny.yaml", "head -1 tiny.yaml | grep -q tiny.yaml",
        "```", "```console runnable", "$ blis-simpy validate scenarios/nosuch.yaml", "ok", "```",
        "```sh runnable", "echo never reached", "```"])
    ran, failure = run_page(page, "page.md", tmp_path)
    assert ran == 2
    assert failure.startswith("page.md:11: `blis-simpy validate scenarios/nosuch.yaml` exited 2\n")
    assert "nosuch.yaml" in failure.split("stderr (end): ", 1)[1]
    assert (tmp_path / "repo" / "tiny.yaml").read_text().startswith("# tiny.yaml\nmodel: m\n")


def test_a_transcript_must_print_the_output_shown(tmp_path: Path):
    page = "\n".join([
        "```console runnable", "$ printf 'a  \\nb\\n'", "a", "b", "$ echo err >&2; echo out",
        "out", "err", "$ true", "$ echo 2 \\", "   3", "2 4", "```"])
    ran, failure = run_page(page, "page.md", tmp_path)
    assert ran == 3         # trailing spaces dropped; stdout, then stderr; nothing = nothing
    assert failure == "page.md:1: `echo 2 3` printed\n2 3\nnot the output shown:\n2 4"


def test_the_markup_is_read_as_documented():
    text = "\n".join([
        "# t", "```sh runnable", "# a comment", "blis-simpy run --rate 1 \\", "    --seed 2",
        "", "echo hi | grep hi   # trailing comment", "```", "```console runnable",
        "$ blis-simpy validate a.yaml \\", "    --x", "ok: a.yaml", "$ head -1 b.csv", "t_us", "```",
        "~~~python", "# tool.py", "print(1)", "~~~", "```sh", "make test", "```"])
    got = blocks(text)
    assert [(b.lang, b.flags, b.line) for b in got] == [
        ("sh", ("runnable",), 2), ("console", ("runnable",), 9), ("python", (), 16), ("sh", (), 20)]
    assert commands(got[0]) == ["blis-simpy run --rate 1 --seed 2",
                                "echo hi | grep hi   # trailing comment"]
    assert commands(got[1]) == ["blis-simpy validate a.yaml --x", "head -1 b.csv"]
    assert transcript(got[1]) == [("blis-simpy validate a.yaml --x", ["ok: a.yaml"]),
                                  ("head -1 b.csv", ["t_us"])]
    assert named_files(got) == {"tool.py": "# tool.py\nprint(1)\n"}
    assert not got[3].runnable


def test_every_page_has_runnable_commands_where_the_tour_promises_them():
    readme = blocks((ROOT / "README.md").read_text())
    tour = [c for b in readme if b.runnable for c in commands(b)]
    assert len(tour) >= 8 and any(c.startswith("blis-simpy replay") for c in tour)
    for c in tour:      # every file the tour names is in the repository
        for word in c.split():
            if word.startswith("scenarios/"):
                assert (ROOT / word).is_file(), f"README tour names missing {word}"


def test_readme_lists_every_doc_page_and_package():
    text = (ROOT / "README.md").read_text()
    table = text.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in table, f"README's documentation table omits docs/{page.name}"
    layout = text.split("## Layout", 1)[1]
    packages = sorted(p.parent.name for p in (ROOT / "blis_simpy").glob("*/__init__.py"))
    missing = [p for p in packages if f" {p}/ " not in layout.replace("\n", " \n")]
    assert not missing, f"README's layout omits blis_simpy/{missing}"
