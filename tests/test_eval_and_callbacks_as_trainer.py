"""Evaluation and callbacks as a transformers Trainer / TRL 1.16 user calls them (session 37's break sweep of the
evaluation and callback paths; docs/reliability.md, "Session 37").

Each run is one or two optimizer steps of the 3 M-parameter model from conftest.py; rewards read the prompts' `n`
column, so each eval set's mean reward is known by hand.
"""

import pytest
from torch.utils.data import DataLoader
from transformers import TrainerCallback

from fastgrpo import GRPOConfig, GRPOTrainer


def reward_n(completions, n, **kwargs):
    """Each completion's reward is its prompt's number: an eval set's mean reward is the mean of its rows' n."""
    return [float(x) for x in n]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=2, max_steps=1, logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="none",
        per_device_eval_batch_size=8,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def test_evaluate_takes_trainers_arguments_and_a_named_set(tmp_path, tokenizer, make_model, prompts):
    """Trainer's signature is evaluate(eval_dataset, ignore_keys, metric_key_prefix), and eval_dataset may name one set
    of a dict eval_dataset (Trainer's recursion calls it so; its metrics keep the bare prefix). fastgrpo's took
    (eval_dataset, metric_key_prefix): `evaluate(ignore_keys=[…])` was a TypeError, `evaluate(ds, None, "test")` too,
    and `evaluate("b")` was refused as "eval dataset has type str"."""
    sets = {"a": prompts.select(range(2)), "b": prompts.select(range(2, 3))}  # mean n: (0 + 1) / 2 and 2
    trainer = GRPOTrainer(make_model(), reward_n, args=config(tmp_path), train_dataset=prompts, eval_dataset=sets,
                          processing_class=tokenizer)
    both = trainer.evaluate(ignore_keys=["past_key_values"])
    assert (both["eval_a_reward"], both["eval_b_reward"]) == (0.5, 2.0)
    named = trainer.evaluate("b")
    assert named["eval_reward"] == 2.0 and not any(k.startswith(("eval_a_", "eval_b_")) for k in named)
    assert trainer.state.log_history[-1]["eval_reward"] == 2.0
    assert trainer.evaluate(eval_dataset="a", metric_key_prefix="test")["test_reward"] == 0.5
    assert trainer.evaluate(prompts.select(range(3, 4)), None, "test")["test_reward"] == 3.0  # Trainer's positional order
    with pytest.raises(KeyError, match=r"eval_dataset='c': the trainer's eval_dataset has no set of that name \(its named sets: \['a', 'b'\]\)"):
        trainer.evaluate("c")


class Loaders(TrainerCallback):
    """The train_dataloader and eval_dataloader each event was given, as lists of the batches' `n` values."""

    def __init__(self):
        self.seen = []

    def _record(self, event, train_dataloader=None, eval_dataloader=None):
        def rows(loader):
            return None if loader is None else [[row["n"] for row in batch] for batch in loader] if isinstance(loader, DataLoader) else loader
        self.seen.append((event, rows(train_dataloader), rows(eval_dataloader)))

    def on_train_begin(self, args, state, control, train_dataloader=None, eval_dataloader=None, **kwargs):
        self._record("on_train_begin", train_dataloader, eval_dataloader)

    def on_prediction_step(self, args, state, control, train_dataloader=None, eval_dataloader=None, **kwargs):
        self._record("on_prediction_step", train_dataloader, eval_dataloader)


def test_callbacks_get_the_train_and_eval_dataloaders_as_trainers(tmp_path, tokenizer, make_model, prompts):
    """Trainer passes every event `train_dataloader` (set before on_train_begin) and `eval_dataloader` (the set being
    evaluated, set before its first batch); fastgrpo passed None for both (a callback reading len(eval_dataloader),
    as transformers' ProgressCallback and TRL's RichProgressCallback do for the eval bar, found no loader). They are
    the trainer's get_train_dataloader() / get_eval_dataloader(): the prompts each batch samples, each G times."""
    train = prompts.select(range(4))
    sets = {"a": prompts.select(range(2)), "b": prompts.select(range(5, 6))}
    seen = Loaders()
    trainer = GRPOTrainer(make_model(), reward_n, args=config(tmp_path, shuffle_dataset=False, eval_strategy="steps", eval_steps=1),
                          train_dataset=train, eval_dataset=sets, processing_class=tokenizer, callbacks=[seen])
    trainer.train()
    one_pass = [[n] * 4 for n in range(4)]  # one prompt (G = 4 completions) per rollout, one step per rollout, in order
    assert seen.seen == [
        ("on_train_begin", one_pass, None),
        ("on_prediction_step", one_pass, [[0] * 4 + [1] * 4]),  # set a: 2 prompts × G in one batch of 8
        ("on_prediction_step", one_pass, [[5] * 4]),  # set b
    ]


def test_eval_sets_given_after_build_are_checked_as_at_build(tmp_path, tokenizer, make_model, prompts):
    """The build refuses an eval set a reward function cannot score (a parameter no column fills, a reserved column);
    a set given later was not checked: `trainer.eval_dataset = rows` then train() ran its steps and stopped at the first
    evaluation with the reward's "missing 1 required positional argument: 'n'"; evaluate(rows) / predict(rows)
    sampled a batch first. Now each is refused at once, naming the set, as at build."""
    from datasets import Dataset  # noqa: PLC0415

    no_n = Dataset.from_list([{"prompt": [{"role": "user", "content": "Hi."}]}])
    reserved = Dataset.from_list([{"prompt": [{"role": "user", "content": "Hi."}], "n": 1, "completions": "x"}])
    seen = Loaders()
    trainer = GRPOTrainer(make_model(), reward_n, args=config(tmp_path, eval_strategy="steps", eval_steps=1), train_dataset=prompts,
                          eval_dataset=prompts.select(range(2)), processing_class=tokenizer, callbacks=[seen])
    missing = r"reward function 'reward_n' needs 'n', which {} does not have \(columns: prompt\)"
    with pytest.raises(ValueError, match=missing.format("eval dataset")):
        trainer.eval_dataset = no_n
    with pytest.raises(ValueError, match=missing.format("eval dataset")):
        trainer.evaluate(no_n)
    with pytest.raises(ValueError, match=missing.format("eval_held_out dataset")):
        trainer.predict({"held_out": no_n})
    with pytest.raises(ValueError, match="eval dataset has a column named 'completions', which reward functions already receive"):
        trainer.evaluate(reserved)
    assert seen.seen == [] and trainer.eval_dataset is not no_n  # nothing sampled; the trainer's eval set kept
    assert trainer.train().global_step == 1


def test_a_callback_class_that_cannot_be_built_without_arguments_is_refused_before_the_model_loads(tmp_path, tokenizer, prompts, monkeypatch):
    """Trainer builds a callback class with no arguments (`callbacks=[MyCallback]` for `MyCallback(x)`), a bare
    TypeError once the model had loaded (TRL loads a model name first); fastgrpo built it after loading too. Now
    `check_callbacks` builds each class before the model loads and names the fix; a class that builds is kept as an
    instance, as Trainer's handler holds it."""
    import fastgrpo.trainer  # noqa: PLC0415

    class NeedsThreshold(TrainerCallback):
        def __init__(self, threshold):
            self.threshold = threshold

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(fastgrpo.trainer, "load_policy", never)
    with pytest.raises(TypeError, match=r"callbacks entry NeedsThreshold is a class, which transformers' Trainer builds with no arguments, "
                       r"and NeedsThreshold\(\) raised TypeError: .*threshold.*; give an instance: callbacks=\[NeedsThreshold\(…\)\]"):
        GRPOTrainer("smollm2-135m-instruct", reward_n, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer,
                    callbacks=[NeedsThreshold])


class Evaluations(TrainerCallback):
    """Each on_evaluate's metrics."""

    def __init__(self):
        self.seen = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.seen.append(metrics)


def test_a_dict_eval_set_is_evaluated_logged_and_reported_set_by_set(tmp_path, tokenizer, make_model, prompts):
    """Trainer's evaluate() of a dict calls itself per set: one record in log_history and one on_evaluate per set, its
    metrics under its own prefix; it returns them all. fastgrpo made one record and one on_evaluate for both sets."""
    sets = {"a": prompts.select(range(2)), "b": prompts.select(range(2, 3))}  # mean n: (0 + 1) / 2 and 2
    seen = Evaluations()
    trainer = GRPOTrainer(make_model(), reward_n, args=config(tmp_path), train_dataset=prompts, eval_dataset=sets,
                          processing_class=tokenizer, callbacks=[seen])
    both = trainer.evaluate()
    assert (both["eval_a_reward"], both["eval_b_reward"]) == (0.5, 2.0)
    prefixes = [{key.split("_")[1] for key in record if key.startswith("eval_")} for record in trainer.state.log_history]
    assert prefixes == [{"a"}, {"b"}]
    assert [(m.get("eval_a_reward"), m.get("eval_b_reward")) for m in seen.seen] == [(0.5, None), (None, 2.0)]
    given = trainer.evaluate({"c": prompts.select(range(3, 4)), "d": prompts.select(range(4, 6))}, metric_key_prefix="test")
    assert (given["test_c_reward"], given["test_d_reward"]) == (3.0, 4.5)
    assert [sorted(k for k in r if k.endswith("_reward")) for r in trainer.state.log_history[2:]] == [["test_c_reward"], ["test_d_reward"]]


def test_a_record_logged_before_train_is_not_in_the_runs_log_history(tmp_path, tokenizer, make_model, prompts):
    """Trainer's train() starts a new TrainerState: an evaluate() (or a log()) before it is not in its log_history.
    fastgrpo kept the pre-train evaluation's record in front of the run's."""
    from test_trainer_events import Regression  # noqa: PLC0415
    from datasets import Dataset  # noqa: PLC0415
    from transformers import Trainer, TrainingArguments  # noqa: PLC0415

    rows = Dataset.from_list([{"x": [float(i), 1.0], "labels": float(i)} for i in range(2)])
    hf = Trainer(Regression(), TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, max_steps=1, logging_steps=1,
                                                 use_cpu=True, report_to=[], disable_tqdm=True, save_strategy="no"),
                 train_dataset=rows, eval_dataset=rows)
    trainer = GRPOTrainer(make_model(), reward_n, args=config(tmp_path), train_dataset=prompts, eval_dataset=prompts.select(range(2)),
                          processing_class=tokenizer)
    for t in (hf, trainer):
        t.evaluate()
        t.log({"note": 1.0})
        assert [sorted(k for k in r if k in ("eval_runtime", "note")) for r in t.state.log_history] == [["eval_runtime"], ["note"]]
        t.train()
        assert not any("eval_runtime" in r or "note" in r for r in t.state.log_history)
    assert [r["step"] for r in trainer.state.log_history] == [r["step"] for r in hf.state.log_history] == [1, 1]  # the step's log, the summary
