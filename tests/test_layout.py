"""The layout of issue 27 changed no number and no file format: a fixed-seed fp32 run logs what the code before it
logged, and a checkpoint that code wrote resumes (tests/fixtures/make_layout_fixtures.py made both fixtures)."""

import json
import math
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures"))

from make_layout_fixtures import even_tokens, fixture_config, fixture_model, fixture_prompts, timing_key  # noqa: E402

from fastgrpo import GRPOTrainer  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures", "layout_run")


def records(path):
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if not timing_key(k) and k != "num_tokens"} for line in f]


def reference_records():
    """The fixture's records as the code logs them now: `learning_rate` is the rate each step used (Trainer's reading,
    before the schedule moves on: the fixture logged the next step's, so step k now logs the fixture's step k − 1 and
    step 1 the configured 1e-2); `num_tokens`, logged since (TRL's count), is left out of both sides by `records`."""
    reference = records(os.path.join(FIXTURES, "reference_metrics.jsonl"))
    used = [1e-2] + [r["learning_rate"] for r in reference[:-1]]
    return [{**r, "learning_rate": lr} for r, lr in zip(reference, used)]


def assert_same_numbers(got, expected):
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for g, e in zip(got, expected):
        assert set(g) == set(e), f"step {e['step']}: keys {sorted(set(g) ^ set(e))} differ"
        for key, value in e.items():
            assert math.isclose(g[key], value, rel_tol=1e-6, abs_tol=1e-6), f"step {e['step']} {key}: {g[key]} != {value}"


def trainer(tokenizer, output_dir):
    return GRPOTrainer(fixture_model(tokenizer), even_tokens, args=fixture_config(str(output_dir), save_steps=1),
                       train_dataset=fixture_prompts(), processing_class=tokenizer)


def test_a_fixed_seed_run_logs_the_numbers_of_the_code_before_the_layout(tmp_path, tokenizer):
    # μ = 2, β = 0.04, two micro-batches per optimizer step, 4 steps = 2 rollouts, fp32.
    trainer(tokenizer, tmp_path / "out").train()
    reference = reference_records()
    assert len(reference) == 4 and all("kl" in r and "loss" in r for r in reference)
    assert_same_numbers(records(tmp_path / "out" / "metrics.jsonl"), reference)


def test_a_checkpoint_written_before_the_layout_resumes_and_continues_the_run(tmp_path, tokenizer):
    # checkpoint-1 is mid-rollout: it holds the pickled rollout (1 of its 2 steps done) and the logging window.
    out = tmp_path / "run"
    shutil.copytree(os.path.join(FIXTURES, "run"), out)
    resumed = trainer(tokenizer, out)
    result = resumed.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert result.global_step == 4
    # Steps 2–4 as the uninterrupted run logged them (the log's cut-back sizes are keyed by the absolute path the
    # fixture was written at, so the copy's metrics.jsonl restarts after the checkpoint: step 1 is not compared).
    logged = [r for r in records(out / "metrics.jsonl") if r["step"] > 1]
    assert_same_numbers(logged, reference_records()[1:])
