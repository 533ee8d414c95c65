"""The time-to-reward benchmark's figures, on hand-made runs (no training, no timing).

Each fake run is what ttr_worker.py writes: one record per reward-function call,
in call order, a rollout being one call of every function.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import time_to_reward as ttr  # noqa: E402


def run(name: str, rollouts: list[tuple[float, list[float], list[float]]]) -> dict:
    """A fake run: per rollout (time, correctness values, brevity values), two reward functions."""
    calls = []
    for t, a, b in rollouts:
        calls += [{"time": t - 0.1, "reward": "correct", "values": a}, {"time": t, "reward": "brevity", "values": b}]
    return {"spec": {"name": name}, "calls": calls}


FAST = run("fast", [(10.0, [0, 0], [0.2, 0.4]), (20.0, [1, 0], [0.5, 0.5]), (30.0, [1, 1], [0.5, 0.5]), (40.0, [1, 1], [1.0, 1.0])])


def test_rollout_reward_is_the_sum_of_the_functions_per_completion_at_the_last_call():
    assert ttr.rollout_rewards(FAST)[1] == (20.0, [1.5, 0.5])


def test_rolling_reward_averages_the_last_three_rollouts_completions():
    # rollout totals: [0.2, 0.4], [1.5, 0.5], [1.5, 1.5], [2, 2]
    curve = ttr.rolling(FAST)
    assert [t for t, _ in curve] == [10.0, 20.0, 30.0, 40.0]
    assert curve[0][1] == pytest.approx(0.3)
    assert curve[1][1] == pytest.approx((0.2 + 0.4 + 1.5 + 0.5) / 4)
    assert curve[3][1] == pytest.approx((1.5 + 0.5 + 1.5 + 1.5 + 2 + 2) / 6)


def test_time_to_target_is_the_first_scoring_time_the_rolling_reward_reaches_it():
    assert ttr.to_target(FAST, 0.65) == (20.0, 2)  # rolling 0.65 at the second rollout: reached exactly
    assert ttr.to_target(FAST, 1.0) == (40.0, 4)  # 0.93 at the third, 1.5 at the fourth
    assert ttr.to_target(FAST, 5.0) == (None, None)


def test_summary_takes_medians_over_seeds_and_leaves_a_setting_that_missed_without_a_median():
    slow = run("slow", [(25.0, [0, 0], [0.2, 0.4]), (50.0, [1, 1], [1, 1]), (75.0, [1, 1], [1, 1])])
    never = run("slow", [(30.0, [0, 0], [0, 0])])
    record = {"target": 1.0, "runs": [FAST, FAST, slow, never], "budget": 100, "seeds": [0, 1], "threads": 1}
    rows = {r["name"]: r for r in ttr.summary(record)}
    assert rows["fast"]["seconds"] == 40.0 and rows["fast"]["reached"] == 2 and rows["fast"]["rollouts"] == 4
    assert rows["slow"]["reached"] == 1 and rows["slow"]["seconds"] is None and rows["slow"]["seconds_range"] == (50.0, 50.0)
    assert "| fast | 2/2 | 40 [40–40] | 4 [4–4] |" in ttr.markdown(record)


def test_report_renders_table_and_plot_from_a_results_file(tmp_path):
    path = tmp_path / "r.json"
    record = {"suite": "t", "task": "arithmetic", "target": 1.0, "budget": 100, "seeds": [0], "threads": 1,
              "runs": [FAST, run("TRL μ=1", [(40.0, [0, 0], [0, 0]), (80.0, [1, 1], [1, 1])])]}
    path.write_text(json.dumps(record))
    table = ttr.render(str(path))
    assert "| TRL μ=1 | 1/1 | 80 [80–80] | 2 [2–2] |" in table  # rolling (0 + 0 + 2 + 2) / 4 = 1.0 at 80 s
    assert "| fast | 1/1 | 40 [40–40] | 4 [4–4] | 10.0 | 1.50 | 2.00× sooner |" in table
    assert os.path.getsize(tmp_path / "r.png") > 1000 and (tmp_path / "r.md").exists()
