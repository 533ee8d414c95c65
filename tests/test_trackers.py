"""report_to="tensorboard" writes what TRL 1.16's GRPOTrainer writes (transformers' `TensorBoardCallback`): one event
file under output_dir/runs/<date>_<host>/, every logged record's numbers under `train/<key>`, evaluations under
`eval/<key>`, train()'s summary too, and the config as the `args` text."""

import os
import warnings

import pytest

from fastgrpo import GRPOConfig, GRPOTrainer

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def reward_even(completion_ids, **kw):
    """Fraction of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def event_files(output_dir):
    return [os.path.join(root, f) for root, _, files in os.walk(output_dir) for f in files if f.startswith("events.out.tfevents")]


def scalars(path):
    events = EventAccumulator(path)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}, events.Tags()["tensors"]


def test_tensorboard_writes_trls_tags_where_trl_writes_them(tmp_path, tokenizer, make_model, prompts):
    common = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=4, max_completion_length=4, max_steps=2,
                  logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="no", report_to="tensorboard", disable_tqdm=True, bf16=False)
    data = dict(train_dataset=prompts.select(range(8)), eval_dataset=prompts.select(range(1)), processing_class=tokenizer)
    ours = GRPOTrainer(make_model(), reward_even, args=GRPOConfig(str(tmp_path / "fg"), **common), **data)
    ours.train()
    [path] = event_files(ours.args.output_dir)
    assert os.path.relpath(path, ours.args.output_dir).startswith("runs" + os.sep)  # transformers' default_logdir()
    got, texts = scalars(path)
    history = ours.state.log_history
    train, evals, summary = [r for r in history if "reward" in r], [r for r in history if "eval_reward" in r], history[-1]
    assert got["train/reward"] == [(r["step"], pytest.approx(r["reward"])) for r in train] and [r["step"] for r in train] == [1, 2]
    assert got["eval/reward"] == [(2, pytest.approx(evals[0]["eval_reward"]))]
    assert got["train/train_runtime"] == [(2, pytest.approx(summary["train_runtime"]))]
    assert "args" in " ".join(texts) and "train/step" not in got  # the config as text; the step is the x axis, not a scalar

    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own warnings about this tiny setup
        theirs = trl.GRPOTrainer(model=make_model(), reward_funcs=reward_even, args=trl.GRPOConfig(str(tmp_path / "trl"), use_cpu=True, **common), **data)
        theirs.train()
    [trl_path] = event_files(theirs.args.output_dir)
    assert set(scalars(trl_path)[0]) - set(got) == set()  # every tag TRL writes (fastgrpo adds its own: train/kl_old, …)
