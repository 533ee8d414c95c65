"""Logs hold everything trained, exactly once, whatever stops and resumes the run (issue 22, kind 10).

A run stopped inside a rollout's steps (Ctrl-C, a crash after a checkpoint, a callback) and resumed
writes the same metrics.jsonl records (timings aside) and the same completions.jsonl rows as the run
that was never stopped: the checkpoint carries the logging window (sums and completions trained on
but not yet logged), and resume cuts the logs back to the checkpoint's step and takes the window back.
"""

import json
import os
import signal

import pytest
from transformers import TrainerCallback

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.run.interrupt import TrainingInterrupted


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def config(out, **overrides):
    # A rollout: 4 prompts × G = 4 completions, 4 optimizer steps of 4 completions each (steps_per_generation = 4);
    # logging every 3 steps never lines up with a rollout's end.
    values = dict(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, steps_per_generation=4, max_prompt_length=32,
        max_completion_length=4, max_steps=10, learning_rate=1e-3, logging_steps=3, save_strategy="no", log_completions=True,
        num_completions_to_print=0, disable_tqdm=True, seed=0, bf16=False, report_to="none",
    )
    values.update(overrides)
    return GRPOConfig(**values)


class At(TrainerCallback):
    """At optimizer step `step`: send SIGINT (Ctrl-C), ask for a save, or a save and a stop."""

    def __init__(self, step, action):
        self.step, self.action = step, action

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            if self.action == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)
            else:
                control.should_save = True
                control.should_training_stop = self.action == "stop"


def run(out, tokenizer, make_model, prompts, callbacks=(), resume=None, **overrides):
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(out, **overrides), train_dataset=prompts, processing_class=tokenizer, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def logs(out):
    def read(name):
        with open(os.path.join(out, name)) as f:
            return [json.loads(line) for line in f]

    timings = ("seconds/", "step_time")  # wall-clock: the only values a resumed run may not repeat
    metrics = [{k: v for k, v in r.items() if not k.startswith(timings) and not k.endswith("per_second")} for r in read("metrics.jsonl")]
    return metrics, read("completions.jsonl")


def same_records(got, want):
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        assert all(g[k] == pytest.approx(w[k], rel=1e-4, abs=1e-6) for k in w), g["step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer):
    from conftest import tiny_model

    out = tmp_path_factory.mktemp("whole")
    run(out, tokenizer, lambda: tiny_model(tokenizer), _prompts())
    return logs(out)


def _prompts():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i} for i in range(32)])


@pytest.mark.parametrize("stop_at", [2, 6, 8])  # inside the first rollout, inside the second (after a log at 6), at a rollout's end
def test_ctrl_c_inside_a_rollout_then_resume_logs_everything_once(tmp_path, tokenizer, make_model, uninterrupted, stop_at):
    with pytest.raises(TrainingInterrupted):
        run(tmp_path, tokenizer, make_model, _prompts(), callbacks=[At(stop_at, "ctrl-c")])
    run(tmp_path, tokenizer, make_model, _prompts(), resume=True)
    metrics, completions = logs(tmp_path)
    want_metrics, want_completions = uninterrupted
    same_records(metrics, want_metrics)
    assert len(completions) == len(want_completions) == 3 * 16  # 3 rollouts of 16 completions, each once
    assert [(c["step"], c["prompt"], c["completion"]) for c in completions] == [(c["step"], c["prompt"], c["completion"]) for c in want_completions]


@pytest.mark.parametrize("action", ["save", "stop"])
def test_crash_or_callback_stop_after_a_mid_rollout_checkpoint(tmp_path, tokenizer, make_model, uninterrupted, action):
    # "save": a checkpoint at step 5 (inside the second rollout, before its first log); the run goes on to the end,
    # then resumes from checkpoint-5, as after a crash at any later step.
    # "stop": a callback saves and stops training at step 5: the stop logs the window after the checkpoint was written,
    # so resuming from checkpoint-5 must drop that record and log the window once, at its scheduled step.
    run(tmp_path, tokenizer, make_model, _prompts(), callbacks=[At(5, action)], save_strategy="steps", save_steps=100)
    if action == "stop":
        assert [r["step"] for r in logs(tmp_path)[0]] == [3, 5]
    run(tmp_path, tokenizer, make_model, _prompts(), resume=os.path.join(tmp_path, "checkpoint-5"), save_strategy="steps", save_steps=100)
    metrics, completions = logs(tmp_path)
    same_records(metrics, uninterrupted[0])
    assert [(c["step"], c["completion"]) for c in completions] == [(c["step"], c["completion"]) for c in uninterrupted[1]]


@pytest.mark.parametrize("save_steps", [4, 2])
def test_a_checkpoint_of_an_epochs_last_step_resumes_with_that_epochs_record(tmp_path, tokenizer, make_model, save_steps):
    # 4 prompts are one rollout of 4 steps, an epoch; logging_strategy="epoch" logs steps 1–4 at step 4 and 5–6 at the end.
    # Trainer's order writes checkpoint-4 at on_step_end, before on_epoch_end logs the epoch: a run resumed from it (after
    # a crash at step 5, say) must still log steps 1–4 at step 4, not fold them into step 6's record.
    kw = dict(logging_strategy="epoch", max_steps=6, save_strategy="steps", save_steps=save_steps)
    run(tmp_path, tokenizer, make_model, _prompts().select(range(4)), **kw)
    want = logs(tmp_path)[0]
    assert [r["step"] for r in want] == [4, 6]
    resumed = run(tmp_path, tokenizer, make_model, _prompts().select(range(4)), resume=os.path.join(tmp_path, "checkpoint-4"), **kw)
    same_records(logs(tmp_path)[0], want)
    assert [r["step"] for r in resumed.state.log_history] == [4, 6, 6]  # the epochs' records, then train()'s summary
