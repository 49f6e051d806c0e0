"""Ctrl-C while a plugin never returns (issue 23, finding 6): the first SIGINT ends the run
with exit 130; it used to wait for an event the plugin never lets the simulation reach, and
only a second Ctrl-C stopped it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.cli.support import SMALL_SCENARIO

STUCK = """\
import pathlib
import time

from blis_simpy.routing.base import RoundRobin


class Stuck(RoundRobin, name="stuck-router"):
    def route(self, req, state):
        pathlib.Path(__file__).with_name("routing.started").write_text("x")
        while True:             # never returns
            time.sleep(0.01)
"""


def test_first_ctrl_c_ends_a_run_stuck_in_a_plugin(tmp_path):
    (tmp_path / "stuck_router.py").write_text(STUCK)
    sc = tmp_path / "s.yaml"
    sc.write_text("plugins: [stuck_router]\n" + SMALL_SCENARIO
                  + "cluster: {num_instances: 2, routing: {policy: stuck-router}}\n")
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc), "--format",
                          "json", "--results-path", str(out)], cwd=tmp_path, env=dict(os.environ),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (tmp_path / "routing.started").exists() and p.poll() is None:
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)        # once
        stdout, stderr = p.communicate(timeout=120)
    finally:
        p.kill()
    assert (p.returncode, stdout, stderr) == (130, "", "error: interrupted\n")
    assert not out.exists()
