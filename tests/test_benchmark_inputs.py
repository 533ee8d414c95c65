"""The benchmark scripts check every argument before their first run, and a failed run never overwrites a complete result.

run.py, report.py and time_to_reward.py run for minutes to hours: a bad argument is one line from argparse
(exit 2) before any worker starts, and results are written under `<name>.partial` until the last run is done.
The other scripts (sampler.py, update_profile.py, vllm_rollout.py, …) refuse a bad argument the same way before
their first measurement, and an --out they could not write to before it, not after.
No worker is started here (run_one and each script's first piece of work are replaced), so no timing and no TRL are needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import agent_turns  # noqa: E402
import async_rollout  # noqa: E402
import attention  # noqa: E402
import bf16_peaks  # noqa: E402
import fsdp  # noqa: E402
import head_ab  # noqa: E402
import report  # noqa: E402
import run as bench  # noqa: E402
import sampler  # noqa: E402
import sampler_draw  # noqa: E402
import time_to_reward as ttr  # noqa: E402
import update_profile  # noqa: E402
import vllm_rollout  # noqa: E402


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
    ("{}", "is not a case file run.py wrote (benchmarks/results/<date>-<case>.json): it has no case, description, runs"),
])
def test_report_names_a_file_it_cannot_render(content, message, capsys, tmp_path):
    path = tmp_path / "case.json"
    if content is not None:
        path.write_text(content)
    refused(report.main, [str(path)], capsys, message)
    refused(report.main, [str(tmp_path / "case.txt")], capsys, "case.txt: give a case file run.py wrote")
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
    model = tmp_path / "model"  # a folder the model check takes (config.json and weights); run_one never loads it
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(RuntimeError, match="ttr_worker.py failed"):
        ttr.main(["--seeds", "0", "--budget", "1", "--out", str(tmp_path), "--model", str(model)])
    assert json.loads(path.read_text()) == earlier


def no_work(monkeypatch, module, *names):
    """Make each of `module`'s `names` (its first expensive calls) fail the test if reached."""
    for name in names:
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail(f"{module.__name__}.{name} ran"))


@pytest.mark.parametrize("main", [bench.main, ttr.main, sampler.main, update_profile.main, vllm_rollout.main, async_rollout.main,
                                  bf16_peaks.main], ids=lambda m: m.__module__)
def test_an_out_that_cannot_be_written_is_refused_before_any_work(main, capsys, monkeypatch, tmp_path):
    for module in (bench, ttr):
        no_work(monkeypatch, module, "run_one")
    no_work(monkeypatch, sampler, "matmul_peak")
    no_work(monkeypatch, update_profile, "build_trainer", "linear_peak")
    no_work(monkeypatch, vllm_rollout, "start_server")
    no_work(monkeypatch, async_rollout, "start_server")
    no_work(monkeypatch, bf16_peaks, "gflops")
    taken = tmp_path / "a-file"
    taken.write_text("")
    refused(main, ["--out", str(taken)], capsys, f"argument --out: '{taken}': not a writable folder (File exists)")


@pytest.mark.parametrize("argv,message", [
    (["--threads", "0"], "argument --threads: 0: give 1 or more"),  # torch.set_num_threads raised a RuntimeError
    (["--pairs", "0"], "argument --pairs: 0: give 1 or more"),  # used to fail on the medians, after every measurement
    (["--batches", "1", "0"], "argument --batches: 0: give 1 or more"),
    (["--lengths", "-64"], "argument --lengths: -64: give 1 or more"),
    (["--device", "bogus"], "--device 'bogus': give cpu, or cuda (cuda:N) on a machine with a CUDA GPU"),
    (["--device", "cuda"], "--device 'cuda': give cpu, or cuda (cuda:N) on a machine with a CUDA GPU"),
])
def test_sampler_refuses_bad_arguments_before_any_measurement(argv, message, capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, sampler, "matmul_peak", "read_bandwidth", "load_model")
    monkeypatch.setattr(sampler.torch.cuda, "is_available", lambda: False)
    refused(sampler.main, [*argv, "--out", str(tmp_path)], capsys, message)


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "argument --steps: 0: give 1 or more"),  # min() of no steps, after the profile
    (["--threads", "-1"], "argument --threads: -1: give 1 or more"),
    (["--ab-fused-adamw", "-2"], "argument --ab-fused-adamw: -2: give 1 or more"),  # ran with no pairs, then failed on the median
    (["--budget", "0"], "argument --budget: 0: give 1 or more"),
    (["--ab-token-budget", "2", "--ab-fused-adamw", "2"], "--ab-token-budget and --ab-fused-adamw: one of them per call"),  # one was dropped
    (["--time-only", "--ab-grouped-attention", "2"], "--ab-grouped-attention and --time-only: one of them per call"),
    (["--gradient-checkpointing"], "--gradient-checkpointing is for --time-only: this run would ignore it"),
    (["--time-only", "--ab-working-copy", "0"], "argument --ab-working-copy: 0: give 1 or more"),
    (["--ab-fused-adamw", "2", "--budget", "100"], "--budget is for --ab-token-budget: this run would ignore it"),
    (["--per-device", "8"], "--per-device is for --time-only and --ab-* runs: this run would ignore it"),
    (["--ab-working-copy", "2", "--steps", "3"], "--steps is for the profile and --time-only (--ab-* N runs N pairs)"),
])
def test_update_profile_refuses_bad_or_ignored_arguments_before_the_trainer_is_built(argv, message, capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, update_profile, "build_trainer", "linear_peak")
    refused(update_profile.main, [*argv, "--out", str(tmp_path)], capsys, message)


@pytest.mark.parametrize("module,argv,message", [
    (vllm_rollout, ["--rounds", "0"], "argument --rounds: 0: give 1 or more"),  # failed on the medians, after the server
    (vllm_rollout, ["--steps", "2"], "--steps 2: give 3 or more (2 steps per rollout, and the first rollout is warm-up"),
    (async_rollout, ["--rounds", "0"], "argument --rounds: 0: give 1 or more"),
    (async_rollout, ["--steps", "3"], "--steps 3: give 4 or more (2 steps per rollout"),
])
def test_the_vllm_benchmarks_refuse_bad_arguments_before_the_server_starts(module, argv, message, capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, module, "start_server")
    refused(module.main, [*argv, "--out", str(tmp_path)], capsys, message)


@pytest.mark.parametrize("module", [vllm_rollout, async_rollout])
def test_the_vllm_benchmarks_say_vllm_is_missing_rather_than_wait_for_the_server(module, capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, module, "start_server")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    refused(module.main, ["--out", str(tmp_path)], capsys, "vLLM is not installed (make vllm)")


@pytest.mark.parametrize("argv,message", [
    (["--pairs", "0"], "argument --pairs: 0: give 1 or more"),
    (["--out", "turns.txt"], "argument --out: 'turns.txt': give a .json file"),
])
def test_agent_turns_refuses_bad_arguments_before_the_model_loads(argv, message, capsys, monkeypatch):
    no_work(monkeypatch, agent_turns, "load_model")
    refused(agent_turns.main, argv, capsys, message)


def test_agent_turns_refuses_an_out_file_it_could_not_write_after_the_runs(capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, agent_turns, "load_model")
    (tmp_path / "a-file").write_text("")
    refused(agent_turns.main, ["--out", str(tmp_path / "a-file" / "turns.json")], capsys, "not a writable folder (")


@pytest.mark.parametrize("module,work,argv,message", [
    (attention, "rows", ["--threads", "0"], "argument --threads: 0: give 1 or more"),  # torch.set_num_threads raised
    (bf16_peaks, "gflops", ["--threads", "-1"], "argument --threads: -1: give 1 or more"),
    (sampler_draw, "keep_freed_memory", ["--rounds", "0"], "argument --rounds: 0: give 1 or more"),  # median of no rounds
    (sampler_draw, "keep_freed_memory", ["--vocab", "x"], "argument --vocab: 'x' is not a whole number"),
    (sampler_draw, "keep_freed_memory", ["--rows", "0"], "argument --rows: 0: give 1 or more"),
])
def test_the_small_measurements_refuse_bad_counts(module, work, argv, message, capsys, monkeypatch, tmp_path):
    no_work(monkeypatch, module, work)
    refused(module.main, [*argv, *(["--out", str(tmp_path)] if module is bf16_peaks else [])], capsys, message)


@pytest.mark.parametrize("argv,message", [
    (["--baseline", "no-such-revision"], "--baseline no-such-revision: no ChunkedHead in update/chunked_head.py or update/logprobs.py"),
    (["--baseline", "HEAD", "--as-trained", "--bf16", "false"], "--as-trained is the bf16 path: drop --bf16 false"),  # was exit 1
    (["--baseline", "HEAD", "--pairs", "0"], "argument --pairs: 0: give 1 or more"),  # median of no pairs, after the warm-up
    (["--baseline", "HEAD", "--tokens", "0"], "argument --tokens: 0: give 1 or more"),
])
def test_head_ab_refuses_bad_arguments_before_the_heads_run(argv, message, capsys, monkeypatch):
    import fastgrpo.run.allocator

    no_work(monkeypatch, head_ab, "run_once")
    no_work(monkeypatch, fastgrpo.run.allocator, "keep_freed_memory")  # it would change this process's malloc settings
    refused(head_ab.main, argv, capsys, message)


@pytest.mark.parametrize("argv,message", [
    (["OUT"], "give the run's name after OUT (ddp or fsdp), or --report"),  # was a TypeError from os.path.join
    (["OUT", "ddp", "--steps", "1"], "--steps 1: give 2 or more"),  # no seconds per step for the report
    (["OUT", "ddp", "--report"], "--report runs nothing: drop 'ddp'"),
])
def test_fsdp_refuses_bad_arguments_before_the_run(argv, message, capsys, monkeypatch):
    no_work(monkeypatch, fsdp, "run")
    refused(fsdp.main, argv, capsys, message)


@pytest.mark.parametrize("content,message", [
    (None, "ddp.json: cannot be read (No such file or directory); give a run's file with step times (write it with torchrun ... benchmarks/fsdp.py"),
    ("{", "ddp.json is not JSON (Expecting"),
    ("{}", "ddp.json is not a run's file with step times (write it with torchrun ... benchmarks/fsdp.py"),
])
def test_fsdp_report_names_the_file_it_cannot_read(content, message, capsys, tmp_path):
    if content is not None:
        (tmp_path / "ddp.json").write_text(content)
    refused(fsdp.main, [str(tmp_path), "--report"], capsys, message)


def test_async_rollout_says_it_needs_two_cores_before_the_server_starts(tmp_path):
    # It pins the server to core 0 and each run to core 1; on one core it failed a minute in, after the server started.
    import subprocess

    proc = subprocess.run(["taskset", "-c", "0", sys.executable, os.path.join(BENCHMARKS, "async_rollout.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "this needs `taskset` (util-linux) and both cores, and this process may use cores [0]" in proc.stderr
