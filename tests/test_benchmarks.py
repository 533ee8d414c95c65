"""The benchmark harness really runs fastgrpo and TRL on one tiny case, and its JSON carries every figure.

Needs TRL in the test environment (`pip install trl==1.16.0 matplotlib`; the
benchmark environment, benchmarks/requirements.txt, has both). Asserts no
timing: the numbers are the benchmark's business, not the test's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install trl==1.16.0 matplotlib)"),
]

GROUP_FIELDS = {
    "seconds_per_step", "phase_seconds_per_step", "completion_tokens_per_second", "generation_tokens_per_second",
    "peak_rss_bytes", "time_to_target_seconds", "reward_at_equal_time", "limit_fraction", "matmul_peak_flops",
    "memory_split_bytes", "update_tokens_computed_over_padded",
    "kernel_seconds_first_step", "kernel_seconds_per_later_step", "page_faults_first_step",
}
RUN_FIELDS = {
    "system", "spec", "threads", "matmul_peak_flops", "train_seconds", "steps_done", "peak_rss_bytes",
    "step_ends", "kernel_at_step_ends", "rollouts", "passes", "phases", "parameters", "body_parameters", "head_parameters", "memory_split_bytes",
}


def test_harness_runs_both_systems_and_writes_every_field(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--cases", "tiny", "--mus", "1",
           "--steps", "1", "--pairs", "1", "--out", str(tmp_path), "--date", "test"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]

    with open(tmp_path / "test-tiny.json") as f:
        case = json.load(f)
    assert {r["system"] for r in case["runs"]} == {"fastgrpo", "trl"}
    assert [r["system"] for r in case["runs"]] == ["fastgrpo", "trl"]  # alternation, fastgrpo first
    for run in case["runs"]:
        assert RUN_FIELDS <= set(run)
        assert run["steps_done"] == 1
        assert len(run["rollouts"]) == 1 and all(len(r["rewards"]) == 16 for r in run["rollouts"])
        assert any(p["grad"] for p in run["passes"])  # the update's forward passes were seen
        kernel = run["kernel_at_step_ends"]  # (kernel CPU seconds, minor faults) at the start and each step end
        assert len(kernel) == 2 and all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(kernel, kernel[1:]))
        assert kernel[-1][1] > kernel[0][1]  # training a model touches fresh memory: some first-touch page faults
    # Same work: identical prompts, config values and weights folder for both systems.
    fast, trl = case["runs"]
    assert fast["prompt_tokens_by_row"] == trl["prompt_tokens_by_row"]
    assert {k: v for k, v in fast["spec"].items() if k != "system"} == {k: v for k, v in trl["spec"].items() if k != "system"}
    assert fast["parameters"] == trl["parameters"]

    summary = case["summary"]
    assert set(summary["groups"]) == {"fastgrpo/mu1", "trl/mu1"}
    for group in summary["groups"].values():
        assert GROUP_FIELDS <= set(group)
        assert set(group["phase_seconds_per_step"]) == {"generation", "logps", "update", "other"}
        assert set(group["limit_fraction"]) == {"generation", "logps", "update", "all"}
        assert group["peak_rss_bytes"] > 0 and group["matmul_peak_flops"] > 0
    assert set(summary["ratios"]["mu1"]["median"]) == {"seconds_per_step", "update_seconds_per_step", "peak_rss_bytes", "completion_tokens_per_second"}
    assert {"target", "r0", "baseline_final", "clear_rise", "equal_time_seconds", "speedup_fastgrpo_mu4_vs_trl_mu1",
            "speedup_fastgrpo_mu4_vs_trl_mu4"} <= set(summary["time_to_reward"])
    assert {"trl", "transformers", "torch", "fastgrpo"} <= set(case["versions"])
    assert "| fastgrpo | 1 |" in case["table"] and "| trl | 1 |" in case["table"]
    assert "| system | μ | kernel s: first step |" in case["table"]
    for png in case["plots"]:  # file names next to the JSON (no path outside the results folder)
        assert os.path.basename(png) == png and os.path.getsize(tmp_path / png) > 1000
