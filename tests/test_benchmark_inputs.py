"""The benchmark scripts check every argument before their first run, and a failed run never overwrites a complete result.

run.py, report.py and time_to_reward.py run for minutes to hours: a bad argument is one line from argparse
(exit 2) before any worker starts, and results are written under `<name>.partial` until the last run is done.
No worker is started here (run_one is replaced), so no timing and no TRL are needed.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import report  # noqa: E402
import run as bench  # noqa: E402
import time_to_reward as ttr  # noqa: E402


def refused(main, argv, capsys, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--cases", "tiny,bogus"], "--cases: unknown 'bogus'; choose from tiny, smollm2"),
    (["--mus", "a"], "--mus 'a': 'a' is not a whole number"),
    (["--mus", "1,0"], "--mus '1,0': 0: give 1 or more"),
    (["--threads", "0"], "argument --threads: 0: give 1 or more"),
    (["--threads", "-3"], "argument --threads: -3: give 1 or more"),
    (["--pairs", "0"], "argument --pairs: 0: give 1 or more"),  # 0 used to mean the case's default
    (["--steps", "0"], "argument --steps: 0: give 1 or more"),
    (["--date", "2026/12"], "--date '2026/12': results are named <date>-<case>.json"),
])
def test_run_refuses_bad_arguments_before_any_run(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "run_one", lambda spec, log: pytest.fail("a run started"))
    refused(bench.main, [*argv, "--out", str(tmp_path)], capsys, message)
    assert os.listdir(tmp_path) == []


def test_a_failed_run_leaves_the_earlier_complete_result_whole(monkeypatch, tmp_path):
    earlier = {"case": "tiny", "description": "complete", "runs": [{"system": "fastgrpo"}, {"system": "trl"}]}
    (tmp_path / "d-tiny.json").write_text(json.dumps(earlier))
    calls = []

    def second_fails(spec, log):
        calls.append(spec["system"])
        if len(calls) == 2:
            raise RuntimeError("worker.py failed")
        return {"system": spec["system"]}

    monkeypatch.setattr(bench, "run_one", second_fails)
    monkeypatch.setattr(bench, "model_path", lambda name: "/models/" + name)
    with pytest.raises(RuntimeError, match="worker.py failed"):
        bench.main(["--cases", "tiny", "--mus", "1", "--steps", "1", "--pairs", "1", "--out", str(tmp_path), "--date", "d"])
    assert json.loads((tmp_path / "d-tiny.json").read_text()) == earlier  # the complete result, untouched
    partial = json.loads((tmp_path / "d-tiny.json.partial").read_text())  # what the failed case did finish
    assert [r["system"] for r in partial["runs"]] == ["fastgrpo"] and calls == ["fastgrpo", "trl"]


@pytest.mark.parametrize("content,message", [
    (None, "cannot be read"),
    ("{", "is not JSON"),
    ("{}", "is not a case file run.py wrote: it has no case, description, runs"),
])
def test_report_names_a_file_it_cannot_render(content, message, capsys, tmp_path):
    path = tmp_path / "case.json"
    if content is not None:
        path.write_text(content)
    refused(report.main, [str(path)], capsys, message)
    refused(report.main, [str(tmp_path / "case.txt")], capsys, "give a case file ending in .json")
    refused(report.main, [], capsys, "the following arguments are required: CASE.json")


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "a,b"], "--seeds 'a,b': give whole numbers"),
    (["--seeds", ""], "--seeds '': give whole numbers"),
    (["--seeds", "0,-1"], "--seeds '0,-1': give seeds ≥ 0"),
    (["--settings", "TRL μ=1,bogus"], "--settings: suite 'builtin' has no 'bogus'; its settings are 'TRL μ=1'"),  # not dropped silently
    (["--budget", "-1"], "argument --budget: -1.0: give a positive number of seconds"),
    (["--budget", "inf"], "argument --budget: inf: give a positive number of seconds"),
    (["--threads", "0"], "argument --threads: 0: give 1 or more"),
    (["--report", "/nonexistent.json"], "--report: /nonexistent.json: cannot be read"),
])
def test_time_to_reward_refuses_bad_arguments_before_any_run(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(ttr, "run_one", lambda spec, log: pytest.fail("a run started"))
    refused(ttr.main, [*argv, "--out", str(tmp_path), "--model", str(tmp_path)], capsys, message)
    assert os.listdir(tmp_path) == []


def test_a_failed_time_to_reward_run_leaves_todays_results_whole(monkeypatch, tmp_path):
    import datetime

    path = tmp_path / f"{datetime.date.today().isoformat()}-ttr-builtin.json"
    earlier = {"suite": "builtin", "task": "arithmetic", "target": 0.7, "budget": 150, "seeds": [0, 1, 2], "runs": ["complete"]}
    path.write_text(json.dumps(earlier))

    def fails(spec, log):
        raise RuntimeError("ttr_worker.py failed")

    monkeypatch.setattr(ttr, "run_one", fails)
    with pytest.raises(RuntimeError, match="ttr_worker.py failed"):
        ttr.main(["--seeds", "0", "--budget", "1", "--out", str(tmp_path), "--model", str(tmp_path)])
    assert json.loads(path.read_text()) == earlier
