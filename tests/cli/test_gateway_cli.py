"""The gateway queue from the command line and the scenario file (docs/cli.md, "Gateway queue"):
flags set ``cluster.gateway`` keys and win over the file; bad input is one located line (exit 2);
the JSON document and the timeline carry the gateway's results only when there is a gateway."""

from __future__ import annotations

import csv
import json

from .support import LOCATED

FLAGS = ("--gateway-detector", "concurrency", "--gateway-max-concurrency", "1",
         "--gateway-queue-depth", "2")


def test_without_a_gateway_nothing_changes_shape(cli, small_scenario, tmp_path):
    tl = tmp_path / "tl.csv"
    res = cli("run", "--scenario", small_scenario, "--format", "json", "--timeline", tl)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert "gateway" not in doc and "shed_gateway" not in doc["request_accounting"]
    assert "gateway_queue_depth" not in tl.read_text().splitlines()[0]


def test_flags_put_a_gateway_in_front_of_the_router(cli, small_scenario, tmp_path):
    tl = tmp_path / "tl.csv"
    res = cli("run", "--scenario", small_scenario, "--format", "json", "--timeline", tl,
              "--timeline-interval-ms", "1", *FLAGS)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    g, acc = doc["gateway"], doc["request_accounting"]
    # 24 requests at 20/s on one instance that takes one at a time: the queue of 2 overflows
    assert g["shed"] > 0 and g["shed_by_reason"] == {"queue_full": g["shed"]}
    assert g["peak_depth"] == 2 and g["entered"] == 24
    assert acc["shed_gateway"] == g["shed"]
    assert sum(v for k, v in acc.items() if k != "offered") == acc["offered"] == 24
    assert g["wait"]["count"] == g["dispatched"] and g["wait"]["p99_ms"] > 0
    rows = list(csv.DictReader(tl.open()))
    depths = {int(r["gateway_queue_depth"]) for r in rows}
    assert max(depths) == 2 and min(depths) == 0


def test_a_flag_wins_over_the_file(cli, small_scenario):
    text = small_scenario.read_text().replace("engine:", "cluster:\n  gateway: {max_depth: 5}\nengine:")
    small_scenario.write_text(text)
    res = cli("run", "--scenario", small_scenario, "--format", "json", *FLAGS)
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["gateway"]["peak_depth"] == 2


def test_bad_gateway_key_in_a_file_is_located(cli, small_scenario):
    text = small_scenario.read_text().replace("engine:", "cluster:\n  gateway:\n    order: lifo\nengine:")
    small_scenario.write_text(text)
    res = cli("run", "--scenario", small_scenario)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    m = LOCATED.match(lines[0])
    assert m and m["field"] == "cluster.gateway.order" and m["line"] == "9", lines[0]


def test_bad_gateway_flag_is_one_line(cli, small_scenario):
    for args, what in ((("--gateway-fair-share", "a:0"), "--gateway-fair-share"),
                       (("--gateway-order", "lifo"), "--gateway-order"),
                       (("--gateway-policy", "nope"), "--gateway-policy")):
        res = cli("run", "--scenario", small_scenario, *args)
        assert res.exit_code == 2, args
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {what}:"), lines


def test_a_shed_session_request_ends_its_session(cli):
    """Closed-loop sessions behind a small gateway queue: each shed request cancels its session
    as a rejection would (INV-11 is checked by the run)."""
    from .support import REPO
    res = cli("run", "--scenario", REPO / "scenarios" / "multiturn_chat.yaml", "--format", "json",
              *FLAGS)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["gateway"]["shed"] > 0
    assert doc["sessions"]["cancelled_rejected"] == doc["gateway"]["shed"]


def test_same_inputs_same_bytes(cli, small_scenario):
    args = ("run", "--scenario", small_scenario, "--format", "json", *FLAGS, "--gateway-order",
            "priority", "--gateway-shed", "lowest", "--gateway-fair-share", "x:2")
    first, second = cli(*args), cli(*args)
    assert first.exit_code == 0 and first.stdout == second.stdout
