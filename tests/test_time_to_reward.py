"""The time-to-reward benchmark: its figures on hand-made runs, and one tiny end-to-end run of both systems.

Each fake run is what ttr_worker.py writes: one record per reward-function call,
in call order, a rollout being one call of every function. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
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


def test_rolling_reward_over_the_last_sampled_completions_and_trained_rollouts_for_dynamic_sampling():
    # rounds of any size (dynamic sampling): the last 3 completions, whatever rounds they came from
    rounds = {**run("dapo", [(10.0, [0], [0.5]), (20.0, [1, 1], [0.5, 0.5]), (30.0, [0], [0.0])]), "rollouts": 2}
    rounds["spec"]["rolling_completions"] = 3  # totals: [0.5], [1.5, 1.5], [0]
    assert [r for _, r in ttr.rolling(rounds)] == pytest.approx([0.5, 3.5 / 3, 3.0 / 3])
    assert ttr.trained_rollouts(rounds) == 2 and ttr.trained_rollouts(FAST) == 4  # recorded, else one per scoring call


def test_time_to_target_is_the_first_scoring_time_the_rolling_reward_reaches_it():
    assert ttr.to_target(FAST, 0.65) == (20.0, 2)  # rolling 0.65 at the second rollout: reached exactly
    assert ttr.to_target(FAST, 1.0) == (40.0, 4)  # 0.93 at the third, 1.5 at the fourth
    assert ttr.to_target(FAST, 5.0) == (None, None)


def test_kernel_seconds_to_target_are_those_recorded_at_the_rollout_that_reaches_it():
    timed = run("fast", [(10.0, [0, 0], [0.2, 0.4]), (20.0, [1, 0], [0.5, 0.5])])
    for i, call in enumerate(timed["calls"]):  # the rollouts' calls: 1.0 and 1.5 s, then 4.0 and 4.5 s
        call["kernel_seconds"] = [1.0, 1.5, 4.0, 4.5][i]
    assert ttr.kernel_to_target(timed, 0.65) == 4.5  # reached at the second rollout: its last call's record
    assert ttr.kernel_to_target(timed, 0.3) == 1.5
    assert ttr.kernel_to_target(timed, 5.0) is None and ttr.kernel_to_target(FAST, 0.65) is None  # never reached; not recorded
    record = {"target": 0.65, "runs": [timed, FAST], "budget": 100, "seeds": [0, 1], "threads": 1}
    assert ttr.summary(record)[0]["kernel_seconds"] == [4.5, None]
    # final rolling reward: the median of 0.65 (timed ends at its second rollout) and 1.5 (FAST's fourth)
    assert "| fast | 2/2 | 20 [20–20] | 2 [2–2] | 10.0 | 1.07 | — | 4.5, — |" in ttr.markdown(record)


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


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install trl==1.16.0 matplotlib)")
def test_harness_runs_both_systems_within_the_budget_on_the_same_rows(tmp_path):
    sys.path.insert(0, BENCHMARKS)
    from run import tiny_model_path

    cmd = [sys.executable, os.path.join(BENCHMARKS, "time_to_reward.py"), "--suite", "builtin", "--seeds", "0", "--budget", "3",
           "--settings", "TRL μ=1,fastgrpo μ=4 target_kl=0.005", "--threads", "1", "--model", tiny_model_path(), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("*-ttr-builtin.json")
    record = json.loads(path.read_text())
    trl, fast = record["runs"]
    assert [trl["spec"]["system"], fast["spec"]["system"]] == ["trl", "fastgrpo"]
    for run in record["runs"]:
        assert run["calls"] and {c["reward"] for c in run["calls"]} == {"reasoning_gym_reward", "brevity_reward"}
        assert all(len(c["values"]) == 16 for c in run["calls"])  # one rollout: 2 prompts × G = 8
        assert run["train_seconds"] >= 3 and run["phase_seconds"]["generate"] > 0
        assert run["phase_seconds"]["rollout"] >= run["phase_seconds"]["generate"]
        kernel = [c["kernel_seconds"] for c in run["calls"]]  # the process's kernel CPU seconds since train() began
        assert 0 <= kernel[0] and kernel == sorted(kernel)
    rollouts = len(ttr.rollout_rewards(fast))
    assert trl["target_kl_stops"] is None and 0 <= fast["target_kl_stops"] <= rollouts  # fastgrpo's counter reached the record
    assert fast["steps"] <= 8 * rollouts  # μ = 4 × 2 micro-batches at most per rollout: the setting's overrides were applied
    assert trl["spec"]["job"] == fast["spec"]["job"] and trl["spec"]["job"]["num_generations"] == 8  # the same GRPOConfig values
    assert (tmp_path / path.name.replace(".json", ".png")).stat().st_size > 1000
