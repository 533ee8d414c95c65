"""transformers callbacks and trainer.state on the tiny model: events, control flags, log_history, best metric.

Each run is a few optimizer steps of the 3 M-parameter model from conftest.py.
"""

import json
import os
import re

import pytest
from rich.console import Console
from transformers import EarlyStoppingCallback, PrinterCallback, ProgressCallback, TrainerCallback, TrainerState

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.run.callbacks import scheduled
from fastgrpo.run.console import ConsolePrinterCallback, ConsoleProgressCallback


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=1,
        num_generations=4, max_prompt_length=32, max_completion_length=4, max_steps=4, learning_rate=1e-3,
        logging_steps=2, save_strategy="no", disable_tqdm=True, seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


class Recorder(TrainerCallback):
    """Every event with the state's global_step; optionally stops or saves at a step."""

    def __init__(self, stop_at=None, save_at=None, log_at=None):
        self.events, self.stop_at, self.save_at, self.log_at, self.logs = [], stop_at, save_at, log_at, []

    def on_init_end(self, args, state, control, **kwargs):
        self.events.append(("on_init_end", state.global_step))

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("on_train_begin", state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append(("on_step_begin", state.global_step))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("on_save", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("on_train_end", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("on_step_end", state.global_step))
        if state.global_step == self.stop_at:
            control.should_training_stop = True
        if state.global_step == self.save_at:
            control.should_save = True
        if state.global_step == self.log_at:
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("on_log", state.global_step))
        self.logs.append(dict(logs))


def test_events_in_transformers_order_and_state(tmp_path, tokenizer, make_model, prompts):
    rec = Recorder(save_at=3, log_at=1)
    args = config(tmp_path)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[rec])
    trainer.train()
    names = [n for n, _ in rec.events]
    assert names[:2] == ["on_init_end", "on_train_begin"] and names[-2:] == ["on_log", "on_train_end"]
    assert names.count("on_step_begin") == names.count("on_step_end") == 4
    # save_strategy="no": the only checkpoint is the one the callback asked for at step 3
    assert ("on_save", 3) in rec.events and os.listdir(args.output_dir).count("checkpoint-3") == 1
    assert not [d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-") and d != "checkpoint-3"]
    state = trainer.state
    assert isinstance(state, TrainerState) and state.global_step == 4 and state.max_steps == 4
    # logging_steps=2 over 4 steps: records at steps 2 and 4, one at step 1 asked by the callback, then the run summary
    assert [r["step"] for r in state.log_history] == [1, 2, 4, 4]
    assert "seconds/generate" in rec.logs[0] and "reward" in rec.logs[0]  # phase timings reach on_log
    assert "train_runtime" in state.log_history[-1] and "train_loss" in state.log_history[-1]
    assert state.log_history[0]["epoch"] > 0


def test_a_callback_stops_training(tmp_path, tokenizer, make_model, prompts):
    rec = Recorder(stop_at=1)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    trainer.add_callback(rec)
    out = trainer.train()
    assert out.global_step == 1 and trainer.state.global_step == 1
    # the unlogged window rides on the run's summary, as TRL's log() merges it, and reaches metrics.jsonl
    assert [r["step"] for r in trainer.state.log_history] == [1] and {"loss", "train_loss"} <= set(trainer.state.log_history[0])


def test_early_stopping_callback_on_eval_reward(tmp_path, tokenizer, make_model, prompts, capsys):
    # eval every step; patience 1 and a threshold no change can beat: the second evaluation
    # cannot improve on the first by more than 10 (rewards lie in [0, 1]), so training stops at step 2.
    args = config(tmp_path, max_steps=6, eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_reward")
    trainer = GRPOTrainer(
        make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)),
        processing_class=tokenizer, callbacks=[EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=10.0), PrinterCallback],
    )
    trainer.train()
    assert trainer.state.global_step == 2
    evals = [r for r in trainer.state.log_history if "eval_reward" in r]
    assert [r["step"] for r in evals] == [1, 2]
    best = max(evals, key=lambda r: r["eval_reward"])  # greater_is_better: True for a name not ending in "loss"
    assert trainer.state.best_metric == best["eval_reward"]
    assert trainer.state.best_global_step is None  # transformers' rule: save_strategy="no" names no best step (no checkpoint holds it)
    assert "'eval_reward'" in capsys.readouterr().out  # PrinterCallback printed the logs


def test_logging_first_step_and_save_epoch(tmp_path, tokenizer, make_model, prompts):
    # A rollout is 4 completions = 1 prompt (G = 4) and feeds 1 optimizer step, so 3 prompts make an
    # epoch of 3 steps: with max_steps 4 the only epoch end is at step 3.
    n = 3
    args = config(tmp_path, max_steps=n + 1, logging_steps=100, logging_first_step=True, save_strategy="epoch", eval_strategy="epoch")
    trainer = GRPOTrainer(
        make_model(), reward_even_tokens, args=args, train_dataset=prompts.select(range(n)), eval_dataset=prompts.select(range(1)),
        processing_class=tokenizer,
    )
    trainer.train()
    history = trainer.state.log_history
    assert [r["step"] for r in history if "loss" in r] == [1, n + 1]  # first step, then the end's summary with the rest
    # the epoch's end, then the end of the last, partial epoch (Trainer calls on_epoch_end when max_steps stops it)
    assert [r["step"] for r in history if "eval_reward" in r] == [n, n + 1]
    assert sorted(d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")) == [f"checkpoint-{n}", f"checkpoint-{n + 1}"]


def test_bad_callback_is_refused_before_training(tmp_path, tokenizer, make_model, prompts):
    with pytest.raises(TypeError, match="transformers.TrainerCallback"):
        GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer, callbacks=[print])


def test_state_survives_a_resume(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    first = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    first.train()
    assert os.path.isfile(os.path.join(args.output_dir, "checkpoint-2", "trainer_state.json"))
    args = config(tmp_path, max_steps=4, save_strategy="no")
    second = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    second.train(resume_from_checkpoint=True)
    # step 2's record from the first run (its train summary was logged after the save), then steps 4 and the summary
    assert [r["step"] for r in second.state.log_history] == [2, 4, 4]


def test_schedule_by_hand(tmp_path):
    args = config(tmp_path, max_steps=8, logging_steps=0.25, logging_first_step=True, eval_strategy="steps", eval_steps=3, save_strategy="epoch")
    # logging_steps 0.25 of 8 steps = every 2; eval every 3 (only with an eval dataset); save at an epoch's end only.
    assert scheduled(args, 1, 8, epoch_end=False, can_evaluate=True) == (True, False, False)  # logging_first_step
    assert scheduled(args, 2, 8, epoch_end=False, can_evaluate=True) == (True, False, False)
    assert scheduled(args, 3, 8, epoch_end=False, can_evaluate=True) == (False, True, False)
    assert scheduled(args, 3, 8, epoch_end=False, can_evaluate=False) == (False, False, False)
    assert scheduled(args, 7, 8, epoch_end=True, can_evaluate=True) == (False, False, True)
    assert scheduled(args, 8, 8, epoch_end=False, can_evaluate=True) == (True, True, False)  # the last step evaluates (Trainer)
    last = config(tmp_path, max_steps=9, save_strategy="steps", save_steps=4)  # logging_steps 2: the last step 9 saves, logs not
    assert scheduled(last, 9, 9, epoch_end=False, can_evaluate=False) == (False, False, True)
    steps = config(tmp_path, max_steps=8, save_strategy="steps", save_steps=3)
    assert [scheduled(steps, s, 8, epoch_end=False, can_evaluate=False)[2] for s in range(1, 9)] == [False, False, True, False, False, True, False, True]


def test_eval_delay_and_logging_strategy_by_hand(tmp_path):
    # DefaultFlowCallback's rules: logging_first_step logs step 1 whatever logging_strategy; "epoch" logs at an epoch's
    # end only, "no" never; no evaluation before eval_delay steps ("steps", the last step's too) or epochs ("epoch").
    args = config(tmp_path, max_steps=8, logging_strategy="epoch", logging_first_step=True, eval_strategy="steps", eval_steps=1, eval_delay=3)
    assert [scheduled(args, s, 8, epoch_end=False, can_evaluate=True)[:2] for s in (1, 2, 3, 4)] == [
        (True, False), (False, False), (False, True), (False, True)]
    assert scheduled(args, 4, 8, epoch_end=True, can_evaluate=True, epoch=1.0) == (True, False, False)
    late = config(tmp_path, max_steps=8, eval_strategy="steps", eval_steps=3, eval_delay=9)
    assert not any(scheduled(late, s, 8, epoch_end=False, can_evaluate=True)[1] for s in range(1, 9))  # the last step's too
    off = config(tmp_path, max_steps=8, logging_strategy="no", logging_steps=1, eval_strategy="epoch", eval_delay=2)
    assert not any(scheduled(off, s, 8, epoch_end=False, can_evaluate=True)[0] for s in range(1, 9))
    assert [scheduled(off, 4, 8, epoch_end=True, can_evaluate=True, epoch=e) for e in (1.0, 2.0)] == [(False, False, False), (False, True, False)]


def test_eval_delay_skips_the_evaluations_before_it(tmp_path, tokenizer, make_model, prompts):
    def evaluated(name, **overrides):
        args = config(tmp_path / name, **overrides)
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts.select(range(2)),
                              eval_dataset=prompts.select(range(1)), processing_class=tokenizer)
        trainer.train()
        return [r["step"] for r in trainer.state.log_history if "eval_reward" in r]

    assert evaluated("steps", max_steps=5, eval_strategy="steps", eval_steps=1, eval_delay=3) == [3, 4, 5]
    # 2 prompts, one per rollout: epochs end at steps 2, 4, 6 (epoch 1.0, 2.0, 3.0); eval_delay=2 skips the first
    assert evaluated("epoch", max_steps=6, eval_strategy="epoch", eval_delay=2) == [4, 6]


def training_records(history):
    return [r for r in history if "reward" in r]


def test_logging_strategy_epoch_logs_each_epochs_mean_and_no_logs_the_summary_alone(tmp_path, tokenizer, make_model, prompts):
    # 3 prompts, one per rollout and optimizer step: epochs of 3 steps; 6 steps. TRL averages its metrics over the steps
    # since the last log: an epoch's record is the mean of its steps' records (a run logging every step, same seed).
    def run(name, **overrides):
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path / name, max_steps=6, **overrides),
                              train_dataset=prompts.select(range(3)), processing_class=tokenizer)
        trainer.train()
        return trainer

    each = training_records(run("each", logging_steps=1).state.log_history)
    assert [r["step"] for r in each] == [1, 2, 3, 4, 5, 6]
    epoch = run("epoch", logging_strategy="epoch")
    assert [r["step"] for r in epoch.state.log_history] == [3, 6, 6]  # two epochs, then the summary with no step left to add
    assert "train_runtime" in epoch.state.log_history[-1] and "reward" not in epoch.state.log_history[-1]
    for record, steps in zip(training_records(epoch.state.log_history), (each[:3], each[3:])):
        for key in ("loss", "reward", "completions/mean_length", "entropy"):  # means (reward_std is over the window's rewards)
            assert record[key] == pytest.approx(sum(r[key] for r in steps) / 3, rel=1e-6, abs=1e-9), key
    assert logged_steps(epoch.args.output_dir) == [3, 6]

    none = run("none", logging_strategy="no")
    (summary,) = none.state.log_history  # Trainer's closing record alone, with the run's metrics merged in (TRL's log())
    assert summary["step"] == 6 and "train_runtime" in summary
    assert summary["reward"] == pytest.approx(sum(r["reward"] for r in each) / 6, rel=1e-6)
    first = run("first", logging_strategy="no", logging_first_step=True)
    assert [r["step"] for r in first.state.log_history] == [1, 6]


class EpochEnds(TrainerCallback):
    """The steps on_epoch_end came at, and the epoch each step ended with."""

    def __init__(self):
        self.ends, self.epochs = [], {}

    def on_step_end(self, args, state, control, **kwargs):
        self.epochs[state.global_step] = state.epoch

    def on_epoch_end(self, args, state, control, **kwargs):
        self.ends.append(state.global_step)


def test_a_run_resumed_in_a_later_pass_ends_its_passes_where_the_whole_run_did(tmp_path, tokenizer, make_model, prompts):
    # 3 prompts, one per rollout (G = 4), μ = 2: a pass is 6 optimizer steps, each a sixth of an epoch. A resume from
    # step 8 (the second pass) counted the passes from 0 again, so its first finished rollout (step 10) ended a pass.
    def run(resume, max_steps=13):
        args = config(tmp_path, max_steps=max_steps, num_iterations=2, save_strategy="steps", save_steps=8, overwrite_output_dir=resume)
        ends = EpochEnds()
        trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts.select(range(3)),
                              processing_class=tokenizer, callbacks=[ends])
        trainer.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-8") if resume else None)
        return ends

    whole = run(False)
    assert whole.ends == [6, 12, 13]  # two passes, then the end of the last, partial one (Trainer's on_epoch_end at max_steps)
    assert [round(whole.epochs[s], 4) for s in (1, 2, 6, 7, 8, 13)] == [round(x, 4) for x in (1 / 6, 2 / 6, 1, 7 / 6, 8 / 6, 13 / 6)]
    resumed = run(True)
    assert resumed.ends == [12, 13]
    assert {s: round(e, 6) for s, e in resumed.epochs.items()} == {s: round(whole.epochs[s], 6) for s in range(9, 14)}


# ---------------------------------------------------------------- the console is a callback, as Trainer's

STEP_LINE = re.compile(r"^step +\d+  ", re.MULTILINE)  # run/console.py's line: `step N  loss …`


def logged_steps(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def test_the_console_is_a_progress_callback_and_removing_it_silences_bar_and_lines_not_the_logs(tmp_path, tokenizer, make_model, prompts, capsys):
    # Trainer appends ProgressCallback after the user's callbacks (PrinterCallback with disable_tqdm); TRL scripts remove it by class.
    def trainer(name, **overrides):
        args = config(tmp_path / name, max_steps=2, logging_steps=1, disable_tqdm=False, **overrides)
        return GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(1)),
                           processing_class=tokenizer, callbacks=[Recorder])

    shown = trainer("shown")
    assert [type(cb) for cb in shown.callback_handler.callbacks][:1] == [Recorder]
    assert isinstance(shown.callback_handler.callbacks[-1], ProgressCallback) and len(shown.callback_handler.callbacks) == 2
    shown.train()
    out = capsys.readouterr().out
    assert len(STEP_LINE.findall(out)) == 2 and "GRPO" in out and "2/2 steps" in out  # the bar, and a line per log

    silent = trainer("silent")
    silent.remove_callback(ProgressCallback)
    assert [type(cb) for cb in silent.callback_handler.callbacks] == [Recorder]
    silent.train()
    silent.evaluate()
    out = capsys.readouterr().out
    assert not STEP_LINE.findall(out) and "GRPO" not in out and "steps" not in out
    assert logged_steps(silent.args.output_dir) == [1, 2, 2]  # metrics.jsonl: both steps, then the evaluation
    assert "eval_reward" in silent.state.log_history[-1]


def test_with_disable_tqdm_the_console_is_a_printer_callback_that_pop_callback_returns(tmp_path, tokenizer, make_model, prompts, capsys):
    rec = Recorder()
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=2, logging_steps=1), train_dataset=prompts,
                          processing_class=tokenizer, callbacks=[rec])
    printer = trainer.callback_handler.callbacks[-1]
    assert trainer.callback_handler.callbacks == [rec, printer] and isinstance(printer, PrinterCallback)
    assert not isinstance(printer, ProgressCallback) and trainer.pop_callback(ProgressCallback) is None
    assert trainer.pop_callback(PrinterCallback) is printer and trainer.callback_handler.callbacks == [rec]
    trainer.train()
    assert not STEP_LINE.findall(capsys.readouterr().out) and logged_steps(trainer.args.output_dir) == [1, 2]
    assert len(rec.logs) == 3  # the other callbacks still see every log (two steps, the summary)


def test_a_run_that_raises_stops_the_progress_bar(tmp_path, tokenizer, make_model, prompts):
    # rich's live bar redraws from a thread (and holds stdout in a terminal) until stopped: an exception must stop it too.
    calls = []

    def fails_second(completion_ids, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("reward server down")
        return reward_even_tokens(completion_ids)

    trainer = GRPOTrainer(make_model(), fails_second, args=config(tmp_path, max_steps=3, disable_tqdm=False), train_dataset=prompts,
                          processing_class=tokenizer)
    bar = trainer.callback_handler.callbacks[-1]
    started = []
    trainer.add_callback(type("Seen", (TrainerCallback,), {"on_step_end": lambda self, *a, **k: started.append(bar.progress.live.is_started)}))
    with pytest.raises(RuntimeError, match="reward server down"):
        trainer.train()
    assert started == [True] and bar.progress is None


def test_only_the_main_process_prints(tmp_path):
    # Trainer's callbacks run on every process and print on process zero (state.is_world_process_zero).
    out = Console(record=True, width=200)
    for main in (False, True):
        state = TrainerState(global_step=3, max_steps=4, is_world_process_zero=main, is_local_process_zero=main)
        for callback in (ConsolePrinterCallback(out), ConsoleProgressCallback(out)):
            callback.on_train_begin(None, state, None)
            callback.on_epoch_begin(None, state, None)
            assert (callback.progress is not None) is main if isinstance(callback, ConsoleProgressCallback) else True
            callback.on_log(None, state, None, logs={"loss": 0.5, "train_loss": 0.25, "epoch": 1.0})
            callback.on_train_end(None, state, None)
    assert re.findall(r"step +3 .*", out.export_text()) == ["step     3  loss 0.5"] * 2  # not Trainer's summary train_loss
