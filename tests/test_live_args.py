"""`trainer.args.<field> = …` after the trainer was built (a notebook), for the fields transformers' Trainer reads where
it uses them (runs.LIVE_FIELDS): the change applies, and a value that cannot is refused at train()'s start, before a
step runs or anything is written. fastgrpo had refused every one of these fields (runs.ArgsAtBuild), where Trainer's
DefaultFlowCallback, train() and _save_checkpoint read eval_strategy, save_strategy, eval_on_start, save_total_limit,
metric_for_best_model, load_best_model_at_end and max_grad_norm at use.
"""

import copy
import os
import warnings

import pytest
import torch
from transformers import EarlyStoppingCallback, ProgressCallback, TrainerCallback

from test_trainer import config, reward_even_tokens

from fastgrpo import GRPOTrainer
from fastgrpo.run.console import ConsolePrinterCallback, ConsoleProgressCallback


def build(tmp_path, tokenizer, make_model, prompts, eval_dataset=None, callbacks=None, **overrides):
    return GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, **overrides), train_dataset=prompts,
                       eval_dataset=eval_dataset, processing_class=tokenizer, callbacks=callbacks)


def checkpoint_folders(tmp_path):
    return sorted(n for n in os.listdir(tmp_path / "out") if n.startswith("checkpoint-"))


def refused_before_a_step(trainer, tmp_path, match):
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert trainer.state.global_step == 0 and not os.path.exists(tmp_path / "out" / "metrics.jsonl")


def test_save_strategy_and_save_total_limit_changed_after_build_apply(tmp_path, tokenizer, make_model, prompts):
    # Built to save every step: save_strategy="no" after build → no checkpoint folder (the default also saves at the last step).
    trainer = build(tmp_path / "a", tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    trainer.args.save_strategy = "no"
    assert trainer.train().global_step == 2 and checkpoint_folders(tmp_path / "a") == []
    # save_total_limit=1 after build: steps 1, 2, 3 saved, the two older pruned as each newer one is written
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, max_steps=3, save_steps=1)
    trainer.args.save_total_limit = 1
    trainer.train()
    assert checkpoint_folders(tmp_path / "b") == ["checkpoint-3"]
    # a config put in trainer.args's place is the one read (the callbacks and the optimizer step included)
    trainer = build(tmp_path / "c", tokenizer, make_model, prompts, max_steps=2, save_steps=1)
    trainer.args = copy.copy(trainer.args)
    trainer.args.save_strategy = "no"
    trainer.train()
    assert checkpoint_folders(tmp_path / "c") == [] and trainer.events.args is trainer.args
    # values GRPOConfig refuses at build are refused at train()'s start, before a step
    trainer = build(tmp_path / "d", tokenizer, make_model, prompts, max_steps=2)
    trainer.args.save_strategy = "best"
    refused_before_a_step(trainer, tmp_path / "d", r"^save_strategy='best' saves when an evaluation improves on metric_for_best_model, which is None")
    trainer.args.save_strategy, trainer.args.save_total_limit = "steps", 0
    refused_before_a_step(trainer, tmp_path / "d", r"^save_total_limit=0: keep at least 1, or None\.")
    trainer.args.save_total_limit, trainer.args.save_strategy = None, "Steps"
    refused_before_a_step(trainer, tmp_path / "d", r"^save_strategy='Steps': use one of no, steps, epoch, best")
    trainer.args.save_strategy, trainer.args.logging_steps = "steps", 0  # live before, unchecked: ZeroDivisionError after step 1
    refused_before_a_step(trainer, tmp_path / "d", r"^logging_steps=0: use a positive number of steps\.$")


def test_eval_strategy_and_eval_on_start_changed_after_build_apply(tmp_path, tokenizer, make_model, prompts):
    # Built with eval_strategy="no": eval_on_start and eval_strategy="steps" set after → an evaluation at step 0 and, with
    # eval_steps left None, every logging_steps=1 step (GRPOConfig's default for it, filled at train() as at build).
    trainer = build(tmp_path, tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=2, per_device_eval_batch_size=4)
    trainer.args.eval_on_start, trainer.args.eval_strategy = True, "steps"
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "eval_reward" in h] == [0, 1, 2] and trainer.args.eval_steps == 1
    # without an eval_dataset, either is refused before a step (transformers' error at build), naming the fix
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, max_steps=2)
    trainer.args.eval_strategy = "epoch"
    refused_before_a_step(trainer, tmp_path / "b", r"^args.eval_strategy='epoch', but this trainer has no eval_dataset to evaluate; set "
                                                   r"trainer.eval_dataset = rows, or set eval_strategy='no' and eval_on_start=False\.$")
    trainer.args.eval_strategy, trainer.args.eval_on_start = "no", True
    refused_before_a_step(trainer, tmp_path / "b", r"^args.eval_strategy='no' with eval_on_start, but this trainer has no eval_dataset")


def test_best_model_fields_changed_after_build_apply(tmp_path, tokenizer, make_model, prompts):
    # metric_for_best_model, evaluation and load_best_model_at_end all set after build: the best eval_reward of the two
    # scheduled evaluations is tracked (greater_is_better derived from the name, as at build) and its checkpoint named.
    trainer = build(tmp_path, tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=2, save_steps=1,
                    per_device_eval_batch_size=4)
    a = trainer.args
    a.eval_strategy, a.eval_steps, a.metric_for_best_model, a.load_best_model_at_end = "steps", 1, "reward", True
    trainer.train()
    rewards = {h["step"]: h["eval_reward"] for h in trainer.state.log_history if "eval_reward" in h}
    best = max(rewards, key=lambda s: (rewards[s], -s))  # the first of equal rewards stays the best
    assert a.greater_is_better is True and trainer.state.best_metric == rewards[best]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "out" / f"checkpoint-{best}")
    # combinations refused at build are refused at train()'s start
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=2)
    trainer.args.metric_for_best_model = "rewrd"
    refused_before_a_step(trainer, tmp_path / "b", r"^metric_for_best_model='rewrd': did you mean 'eval_reward'\?")
    trainer.args.metric_for_best_model, trainer.args.greater_is_better = None, None
    trainer.args.load_best_model_at_end, trainer.args.eval_strategy = True, "epoch"  # and save_strategy "steps"
    refused_before_a_step(trainer, tmp_path / "b", r"^load_best_model_at_end=True needs eval_strategy and save_strategy to match .* "
                                                   r"but eval_strategy='epoch', save_strategy='steps'")
    trainer = build(tmp_path / "c", tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=2,
                    eval_strategy="steps", metric_for_best_model="reward", callbacks=[EarlyStoppingCallback(early_stopping_patience=1)])
    trainer.args.eval_strategy = "no"
    refused_before_a_step(trainer, tmp_path / "c", r"^EarlyStoppingCallback compares 'reward' across evaluations, and eval_strategy='no'")


def test_disable_tqdm_changed_after_build_applies(tmp_path, tokenizer, make_model, prompts, capsys):
    # Trainer adds PrinterCallback or ProgressCallback in __init__ and keeps it; fastgrpo puts the one disable_tqdm means now in its place.
    trainer = build(tmp_path, tokenizer, make_model, prompts, max_steps=1, disable_tqdm=False)
    trainer.args.disable_tqdm = True
    trainer.train()
    consoles = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, (ConsolePrinterCallback, ConsoleProgressCallback))]
    assert [type(cb) for cb in consoles] == [ConsolePrinterCallback] and isinstance(trainer.callback_handler.callbacks[-1], ConsolePrinterCallback)
    out = capsys.readouterr().out
    assert "step     1" in out and "GRPO" not in out  # the step lines, no bar
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, max_steps=1, disable_tqdm=True)
    trainer.args.disable_tqdm = False
    trainer.train()
    assert isinstance(trainer.callback_handler.callbacks[-1], ConsoleProgressCallback) and "GRPO" in capsys.readouterr().out
    # a console callback the script removed stays removed
    trainer = build(tmp_path / "c", tokenizer, make_model, prompts, max_steps=1, disable_tqdm=False)
    trainer.remove_callback(ProgressCallback)
    trainer.args.disable_tqdm = True
    trainer.train()
    assert not any(isinstance(cb, (ConsolePrinterCallback, ConsoleProgressCallback)) for cb in trainer.callback_handler.callbacks)


class ClippedNorms(TrainerCallback):
    """The gradient norm at on_pre_optimizer_step (gradients clipped, weights not yet updated)."""

    def __init__(self):
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
        self.norms.append(float(torch.cat(grads).norm()))


def test_max_grad_norm_changed_after_build_applies(tmp_path, tokenizer, make_model, prompts):
    # Trainer reads args.max_grad_norm at each step; fastgrpo had read it once in __init__ (1.0 here).
    norms = ClippedNorms()
    trainer = build(tmp_path, tokenizer, make_model, prompts, max_steps=2, callbacks=[norms])
    trainer.args.max_grad_norm = 1e-4
    trainer.train()
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]  # the norm before clipping, as Trainer logs it
    assert len(norms.norms) == 2 and all(n > 1e-4 for n in logged)
    assert all(n == pytest.approx(1e-4, rel=1e-3) for n in norms.norms)  # scaled to max_grad_norm
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, max_steps=2)
    trainer.args.max_grad_norm = -1.0
    refused_before_a_step(trainer, tmp_path / "b", r"^max_grad_norm=-1.0: use a positive norm, or 0 for no clipping\.")


def test_num_completions_to_print_changed_after_build_applies(tmp_path, tokenizer, make_model, prompts, capsys):
    # read at each log: 0 prints no table (completions.jsonl still holds every completion); built with 4, a table each log.
    trainer = build(tmp_path, tokenizer, make_model, prompts, max_steps=1, log_completions=True, num_completions_to_print=4)
    trainer.args.num_completions_to_print = 0
    trainer.train()
    assert " Step 1 " not in capsys.readouterr().out  # TRL's panel title
    with open(tmp_path / "out" / "completions.jsonl") as f:
        assert len(f.readlines()) == 8  # per_device_train_batch_size 4 × gradient_accumulation_steps 2
    # found by the break sweep: -1 printed an empty table at each log (min(-1, rows) rows); TRL's random.sample raises at the
    # first log. Refused at build and, set after build, at train()'s start
    with pytest.raises(ValueError, match=r"^num_completions_to_print=-1: use 0 \(no table\), a count, or None \(every completion\)"):
        config(tmp_path, num_completions_to_print=-1)
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, max_steps=1, log_completions=True)
    trainer.args.num_completions_to_print = -1
    refused_before_a_step(trainer, tmp_path / "b", r"^num_completions_to_print=-1: use 0")


def test_a_metric_changed_after_build_warns_when_greater_is_better_kept_the_old_names_direction(tmp_path, tokenizer, make_model, prompts):
    # Found by the break sweep. load_best_model_at_end filled metric_for_best_model="loss" and greater_is_better=False at
    # build (TrainingArguments fills it once, from the name); "reward" set after build kept False, so the lowest eval
    # reward was the best (seen: rewards 0.49, 0.46 → checkpoint-2 best). transformers' Trainer keeps it silently too.
    trainer = build(tmp_path, tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=2, save_steps=1,
                    per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1, load_best_model_at_end=True)
    assert (trainer.args.metric_for_best_model, trainer.args.greater_is_better) == ("loss", False)
    trainer.args.metric_for_best_model = "reward"
    with pytest.warns(UserWarning, match=r"^metric_for_best_model changed from 'loss' to 'reward' after the trainer was built, but "
                                         r"greater_is_better=False was kept .* the one with the lowest reward\. Set "
                                         r"trainer.args.greater_is_better = True if higher is better"):
        trainer.train()
    # greater_is_better set too: the user's choice, no warning
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=1,
                    per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1, load_best_model_at_end=True, save_steps=1)
    trainer.args.metric_for_best_model, trainer.args.greater_is_better = "reward", True
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="metric_for_best_model changed")
        trainer.train()


def test_args_replaced_by_no_config_or_eval_dataset_removed_is_refused_naming_the_fix(tmp_path, tokenizer, make_model, prompts):
    # Found by the break sweep: trainer.args = {…} was an AttributeError ("'dict' object has no attribute 'max_steps'"); the
    # eval_dataset refusal told the user to build a new trainer, where eval_strategy now applies live.
    trainer = build(tmp_path, tokenizer, make_model, prompts, max_steps=1)
    trainer.args = {"save_strategy": "no"}
    with pytest.raises(TypeError, match=r"^trainer.args is \{'save_strategy': 'no'\} \(dict\), not a GRPOConfig: put a config in its "
                                        r"place, e.g. trainer.args = copy.copy\(trainer.args\)"):
        trainer.train()
    trainer = build(tmp_path / "b", tokenizer, make_model, prompts, eval_dataset=prompts.select(range(4)), max_steps=1,
                    per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError, match=r"give rows, or first set trainer.args.eval_strategy = 'no' and trainer.args.eval_on_start = False"):
        trainer.eval_dataset = None
    trainer.args.eval_strategy = "no"
    trainer.eval_dataset = None
    trainer.train()
    assert trainer.state.global_step == 1 and not any("eval_reward" in h for h in trainer.state.log_history)
