"""`transformers.TrainerCallback` support and `trainer.state`, kept as transformers' `Trainer` keeps them.

`TrainerEvents` owns the `TrainerState` (global_step, epoch, log_history with
every logged record, best_metric / best_global_step / best_model_checkpoint)
and the `TrainerControl`, and calls the user's callbacks at every event
transformers' Trainer calls during training, in its order:

    on_init_end
    on_train_begin, [evaluate if eval_on_start]
    per epoch (a pass over the training prompts): on_epoch_begin
        per optimizer step: on_step_begin,
            on_substep_end after each micro-batch but the last,
            on_pre_optimizer_step (gradients clipped), on_optimizer_step,
            on_step_end, then log / evaluate / save as the control says
        on_epoch_end, then log / evaluate / save as the control says
        (also for the last, partial epoch when max_steps or a callback ends training)
    on_train_end
    (on_log, on_evaluate with on_prediction_step per eval batch, on_save where they happen)

`scheduled` says whether the trainer's own schedule logs, evaluates or saves
at a step or an epoch's end, and `step_end` / `epoch_end` set those control
flags before the callbacks run, as transformers' `DefaultFlowCallback` does,
so a callback can add a save, a log or an evaluation, or stop training
(`control.should_training_stop`), and the trainer honours it.

Every logged record reaches `on_log` with the step's phase seconds
(`seconds/generate`, `seconds/update`, …), so timing and monitoring code
needs no private hook.

The console (the progress bar, a line per log) is a callback as well, added after the user's as Trainer adds its
`ProgressCallback` or `PrinterCallback`, so `remove_callback` / `pop_callback` of either class silences it (console.py).

Not here: what a record holds (metrics.py), doing the logging, evaluation or save (trainer.py).
"""

from __future__ import annotations

import math
import os
import sys
import time

from transformers import EarlyStoppingCallback, TrainerCallback, TrainerControl, TrainerState
from transformers.integrations import get_reporting_integration_callbacks
from transformers.trainer_callback import CallbackHandler, ExportableState

from .console import ConsolePrinterCallback, ConsoleProgressCallback, default_console_callback
from .datasets import rollouts_per_pass


STATE_FILE = "trainer_state.json"  # transformers' name for the saved TrainerState


class _Handler(CallbackHandler):
    """transformers' CallbackHandler without its warning about a missing DefaultFlowCallback (fastgrpo schedules itself)."""

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self.callbacks = []
        for cb in callbacks:
            self.add_callback(cb)
        self.model, self.processing_class, self.optimizer, self.lr_scheduler = model, processing_class, optimizer, lr_scheduler
        self.train_dataloader = self.eval_dataloader = None


class TrainerEvents:
    """The state, the control and the callbacks of one trainer.

    Args:
        args: the GRPOConfig (passed to every callback as `args`).
        callbacks: `TrainerCallback` instances, as `check_callbacks` returns them (a class given is built there, as
            transformers builds it).
        model, processing_class, optimizer, lr_scheduler: passed to callbacks as keyword arguments.
        is_main_process: whether this process is the main one (state.is_world_process_zero).
        console: the rich console the default console callback prints on (console.py); as Trainer's `__init__`, it is
            added after `callbacks`: a `ProgressCallback`, or with `args.disable_tqdm` a `PrinterCallback` (the other one
            in its place at train_begin when disable_tqdm changed since, where Trainer would keep the first).

    `report_to`'s trackers (GRPOConfig's list, "all" already read as the installed ones: config/report_to.resolve) are transformers' own integration
    callbacks (`TensorBoardCallback`, `WandbCallback`, `MLflowCallback`, …), placed before `callbacks` as Trainer places
    them: they write what TRL's runs write (TensorBoard under output_dir/runs/<date>_<host>/, `train/<key>` and
    `eval/<key>`; MLflow each record's keys at its step), train()'s summary included.
    """

    def __init__(self, args, callbacks: list, model, processing_class, optimizer, lr_scheduler, is_main_process: bool, console=None):
        self.args = args
        trackers = get_reporting_integration_callbacks(args.report_to)
        self.handler = _Handler([*trackers, *callbacks], model, processing_class, optimizer, lr_scheduler)
        self.console, self.console_callback = console, default_console_callback(args, console)
        self.handler.add_callback(self.console_callback)  # Trainer's add_callback(PrinterCallback or ProgressCallback)
        self.state = TrainerState(is_local_process_zero=is_main_process, is_world_process_zero=is_main_process)
        self.control = TrainerControl()
        self.started, self.in_train = 0.0, False  # in_train: Trainer's is_in_train, True from train_begin until train_end's end
        self.initial_step = 0  # state.global_step at train()'s start, a resume's checkpoint step (Trainer's _initial_global_step)
        self.handler.on_init_end(args, self.state, self.control)

    def new_state(self) -> None:
        """A new `TrainerState`, as Trainer's train() starts one (a resume then loads the checkpoint's fields into it): a
        record logged before train() (an `evaluate()`, a script's `log()`) is not in its log_history."""
        main = self.state.is_world_process_zero
        self.state = TrainerState(is_local_process_zero=main, is_world_process_zero=main)

    def close(self) -> None:
        """Stop the console bars training left running (`ConsoleProgressCallback.close`): the trainer closes the events
        when its loop ends, by an exception too, where on_train_end is never called."""
        for callback in self.handler.callbacks:
            if isinstance(callback, ConsoleProgressCallback):
                callback.close()

    def add(self, callback) -> None:
        """Add a callback instance or class (transformers' `Trainer.add_callback`).

        Raises:
            TypeError, ValueError: `check_callback`'s and `check_early_stopping`'s errors, before training starts.
        """
        check_callback(callback)
        check_early_stopping([callback], self.args.metric_for_best_model, self.args.eval_strategy)
        self.handler.add_callback(callback)

    def train_begin(self, max_steps: int, global_step: int, epoch: float, prompts: int | None, train_dataloader=None) -> None:
        """Fill the state's run constants (as Trainer does) and call on_train_begin; with `args.disable_tqdm` changed since
        the trainer was built, the console callback it now means in place of the built one (Trainer keeps the one its
        __init__ added, so a notebook's change there is silently ignored).

        `prompts`: the training prompts in one epoch (`PromptOrder.per_pass`; None for a stream, whose length is unknown).
        `train_dataloader`: what every event from here on passes callbacks as `train_dataloader` (Trainer's, set before its
        on_train_begin; the trainer's `get_train_dataloader()`, its draws replayed).
        state.num_train_epochs follows Trainer: the passes `max_steps` reaches (each `datasets.rollouts_per_pass` rollouts
        of steps_per_rollout steps; a stream's: sys.maxsize) when max_steps is set, else ⌈num_train_epochs⌉.
        """
        a, s = self.args, self.state
        callbacks = self.handler.callbacks  # disable_tqdm changed since: the other console callback, unless it was removed
        if self.console_callback in callbacks and isinstance(self.console_callback, ConsolePrinterCallback) != bool(a.disable_tqdm):
            at = callbacks.index(self.console_callback)
            self.console_callback = callbacks[at] = default_console_callback(a, self.console)
        s.max_steps, s.global_step, s.epoch = max_steps, global_step, epoch
        s.logging_steps, s.save_steps = _absolute(a.logging_steps, max_steps), _absolute(a.save_steps, max_steps)
        if a.eval_steps is not None:  # else TrainerState's default stays, as Trainer's compute_steps leaves it
            s.eval_steps = _absolute(a.eval_steps, max_steps)
        s.train_batch_size = a.per_device_train_batch_size
        if a.max_steps <= 0:
            s.num_train_epochs = math.ceil(a.num_train_epochs)
        else:
            steps_per_epoch = None if prompts is None else rollouts_per_pass(prompts, a.prompts_per_rollout) * a.steps_per_rollout
            s.num_train_epochs = sys.maxsize if steps_per_epoch is None else math.ceil(max_steps / steps_per_epoch)
        self.started, self.in_train, self.initial_step = time.perf_counter(), True, global_step
        self.handler.train_dataloader = train_dataloader
        self.control = self.handler.on_train_begin(a, s, self.control)

    def step_begin(self) -> None:
        """on_step_begin (the log/evaluate/save flags start cleared)."""
        self.control = self.handler.on_step_begin(self.args, self.state, self.control)

    def epoch_begin(self) -> None:
        """on_epoch_begin (clears control.should_epoch_stop); none at max_steps (a resume of a finished run: Trainer's loop over no epochs)."""
        if self.state.global_step >= self.state.max_steps:
            return
        self.control = self.handler.on_epoch_begin(self.args, self.state, self.control)

    def substep_end(self) -> None:
        """on_substep_end: after a micro-batch's backward that is not the step's last."""
        self.control = self.handler.on_substep_end(self.args, self.state, self.control)

    def pre_optimizer_step(self) -> None:
        """on_pre_optimizer_step: gradients accumulated and clipped, weights not yet updated."""
        self.control = self.handler.on_pre_optimizer_step(self.args, self.state, self.control)

    def optimizer_step(self) -> None:
        """on_optimizer_step: right after optimizer.step(), before the scheduler step and zero_grad."""
        self.control = self.handler.on_optimizer_step(self.args, self.state, self.control)

    def step_end(self, global_step: int, epoch: float, log: bool, evaluate: bool, save: bool) -> TrainerControl:
        """Record the step, set the trainer's own flags, call on_step_end; returns the control callbacks may have changed.
        At max_steps `should_training_stop` is set first, as DefaultFlowCallback sets it (callbacks and the saved state see it)."""
        self.state.global_step, self.state.epoch = global_step, epoch
        self.control.should_training_stop = self.control.should_training_stop or global_step >= self.state.max_steps
        return self._flags_then("on_step_end", log, evaluate, save)

    def epoch_end(self, epoch: float, log: bool, evaluate: bool, save: bool) -> TrainerControl:
        """Set the epoch schedule's flags, call on_epoch_end; returns the control callbacks may have changed."""
        self.state.epoch = epoch
        return self._flags_then("on_epoch_end", log, evaluate, save)

    def eval_loader(self, eval_dataloader) -> None:
        """What on_prediction_step and every later event pass callbacks as `eval_dataloader`: the batches of the set being
        evaluated (Trainer's evaluation_loop sets it before its first batch and leaves it there)."""
        self.handler.eval_dataloader = eval_dataloader

    def prediction_step(self) -> None:
        """on_prediction_step: after each batch of an evaluation (Trainer's evaluation_loop)."""
        self.control = self.handler.on_prediction_step(self.args, self.state, self.control)

    def _flags_then(self, event: str, log: bool, evaluate: bool, save: bool) -> TrainerControl:
        c = self.control
        c.should_log, c.should_evaluate, c.should_save = c.should_log or log, c.should_evaluate or evaluate, c.should_save or save
        self.control = getattr(self.handler, event)(self.args, self.state, c)
        return self.control

    def log(self, record: dict) -> None:
        """Append a logged record to state.log_history (with epoch and step, as Trainer does) and call on_log."""
        logs = {**record, "epoch": self.state.epoch}
        logs.pop("step", None)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.handler.on_log(self.args, self.state, self.control, logs)

    def evaluate(self, metrics: dict) -> None:
        """After the eval metrics are logged (the trainer's `log`): call on_evaluate. Every evaluation, `eval_on_start`'s and a
        script's `evaluate()` included; only the schedule's are candidates for the best (`track_best`), as in Trainer."""
        self.control = self.handler.on_evaluate(self.args, self.state, self.control, metrics)

    def track_best(self, metrics: dict, should_save: bool) -> bool:
        """After a scheduled evaluation (on_step_end's or on_epoch_end's, after its on_evaluate: a callback sees the previous
        best): update best_metric and best_global_step when `metric_for_best_model` improved, as transformers'
        `Trainer._determine_best_metric`, which only `_maybe_log_save_evaluate` calls (not eval_on_start's evaluation, not a
        script's `evaluate()`); → whether to save: with save_strategy="best" whether the metric improved (Trainer sets
        `control.should_save` so), else `should_save` as it was.

        Raises:
            ValueError: the evaluation does not report metric_for_best_model (`eval_` prefixed, transformers' rule), naming
                what it reports.
        """
        name = self.args.metric_for_best_model
        if name is None:
            return should_save
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in metrics:
            raise ValueError(f"metric_for_best_model={name!r}: evaluation reports {', '.join(sorted(metrics))}; use one of them.")
        better = (lambda x, y: x > y) if self.args.greater_is_better else (lambda x, y: x < y)
        improved = metrics[key] is not None and not math.isnan(metrics[key])  # e.g. a reward that applied to no eval completion: never the best
        improved = improved and (self.state.best_metric is None or better(metrics[key], self.state.best_metric))
        if improved:  # transformers names the step only where a checkpoint may hold it (save_strategy "no": None)
            self.state.best_metric = metrics[key]
            if self.args.save_strategy != "no":
                self.state.best_global_step = self.state.global_step
        return improved if self.args.save_strategy == "best" else should_save

    def predict(self, metrics: dict) -> None:
        """on_predict, with the metrics `predict()` returns (Trainer's predict calls it last; nothing is logged)."""
        self.control = self.handler.on_predict(self.args, self.state, self.control, metrics)

    def save(self, checkpoint: str) -> None:
        """After a checkpoint is written: name the best step's checkpoint, when it exists, the best one
        (Trainer._save_checkpoint's rule), write trainer_state.json into it (as Trainer does, with the states of the
        `ExportableState` callbacks and of the control), call on_save."""
        best = os.path.join(os.path.dirname(checkpoint), f"checkpoint-{self.state.best_global_step}")
        if self.state.best_global_step and os.path.isdir(best):
            self.state.best_model_checkpoint = best
        if self.state.is_world_process_zero:  # with the stateful callbacks' states (TrainerControl's, …), as Trainer saves them
            exportable = [cb for cb in [*self.handler.callbacks, self.control] if isinstance(cb, ExportableState)]
            self.state.stateful_callbacks = TrainerState(stateful_callbacks=exportable).stateful_callbacks
            self.state.save_to_json(os.path.join(checkpoint, STATE_FILE))
        self.control = self.handler.on_save(self.args, self.state, self.control)

    def resume(self, checkpoint: str) -> None:
        """Restore log_history, the tokens seen, total_flos and the best metric from a checkpoint's trainer_state.json, when it has one."""
        path = os.path.join(checkpoint, STATE_FILE)
        if os.path.isfile(path):
            saved = TrainerState.load_from_json(path)
            s = self.state
            s.log_history, s.best_metric, s.best_global_step = saved.log_history, saved.best_metric, saved.best_global_step
            s.num_input_tokens_seen, s.total_flos = saved.num_input_tokens_seen, saved.total_flos
            kept = saved.best_model_checkpoint is not None and os.path.isdir(saved.best_model_checkpoint)
            s.best_model_checkpoint = saved.best_model_checkpoint if kept else None  # pruned since: Trainer forgets it too

    def train_end(self, training_loss: float, pending: dict | None = None, after_log=None, log=None) -> dict:
        """Log the run's summary (train_runtime, train_loss, as Trainer does) with the metrics of the steps since the
        last log (`pending`, as TRL's `log` merges them into it), and call on_train_end; → the summary (Trainer's
        `TrainOutput.metrics` keys: train_runtime in seconds, train_samples_per_second (completions: this call's optimizer
        steps × per_device_train_batch_size × gradient_accumulation_steps × processes, as Trainer counts its batches; a
        resume's from its checkpoint on, as transformers 5 counts them: 0 for a finished run's), train_steps_per_second,
        total_flos (state.total_flos: see the trainer's `_log`), train_loss, epoch). `after_log`: called after the summary's
        log, before on_train_end (where Trainer loads the best model and prunes: the trainer's `checkpoints.finish`), if given.
        `log`: what logs the summary (the trainer's `log`, as Trainer's train() logs it through a subclass's override);
        default `self.log`."""
        a, runtime = self.args, time.perf_counter() - self.started
        steps = self.state.global_step - self.initial_step  # this call's (a resume ran only these in `runtime`)
        samples = steps * a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size
        summary = {"train_runtime": round(runtime, 4), "train_samples_per_second": round(samples / max(runtime, 1e-9), 3),
                   "train_steps_per_second": round(steps / max(runtime, 1e-9), 3), "total_flos": self.state.total_flos,
                   "train_loss": training_loss}
        (log or self.log)({**(pending or {}), **summary})
        if after_log:
            after_log()
        self.control = self.handler.on_train_end(self.args, self.state, self.control)
        self.in_train = False  # after on_train_end, as Trainer clears is_in_train
        return {**summary, "epoch": self.state.epoch}


def scheduled(args, step: int, max_steps: int, epoch_end: bool, can_evaluate: bool, epoch: float = 0.0) -> tuple[bool, bool, bool]:
    """(log, evaluate, save) by the config's schedule, before callbacks add theirs (transformers' `DefaultFlowCallback`).

    At a step (`epoch_end` False): log every `logging_steps` (`logging_strategy="steps"`) and after step 1 with
    `logging_first_step`, whatever `logging_strategy` (transformers' rule, "no" included; the steps after the last log
    reach the run's summary log); evaluate (with an eval dataset) every `eval_steps` and at the last step
    (`eval_strategy="steps"`), from step `eval_delay` on; save every `save_steps` and at the last step
    (`save_strategy="steps"`). At an epoch's end (`epoch_end` True, after on_epoch_end's step, `epoch` the state's
    epoch): log for `logging_strategy="epoch"` (a record of the steps since the last log), evaluate for
    `eval_strategy="epoch"` once `epoch` ≥ `eval_delay`, and save for `save_strategy="epoch"`. Intervals below 1 are
    fractions of `max_steps` (`_absolute`, transformers' rule).

    Args:
        args: the GRPOConfig (the fields named above).
        step: optimizer steps done, 1 … max_steps.
        epoch_end: the flags of an epoch's end instead of a step's.
        can_evaluate: the trainer has an eval dataset.
        epoch: state.epoch at the epoch's end (read with `epoch_end`).
    """
    a = args
    if epoch_end:
        evaluate = can_evaluate and a.eval_strategy == "epoch" and a.eval_delay <= epoch
        return a.logging_strategy == "epoch", evaluate, a.save_strategy == "epoch"
    last = step == max_steps
    log = (a.logging_strategy == "steps" and step % _absolute(a.logging_steps, max_steps) == 0) or (a.logging_first_step and step == 1)
    evaluate = can_evaluate and a.eval_strategy == "steps" and (step % _absolute(a.eval_steps, max_steps) == 0 or last) and a.eval_delay <= step
    save = a.save_strategy == "steps" and (step % _absolute(a.save_steps, max_steps) == 0 or last)
    return log, evaluate, save


def check_callbacks(callbacks) -> list:
    """`callbacks` as transformers' Trainer takes it: None, or a list of TrainerCallback instances or classes.

    Returns:
        The callbacks as a list ([] for None), each class instantiated with no arguments, as Trainer's CallbackHandler
        does, but here, before the model loads.
    Raises:
        TypeError: not a list (a single callback: naming it and the fix, `callbacks=[…]`), an entry `check_callback`
            refuses, or a class whose no-argument construction raises (`MyCallback` for `MyCallback(…)`: Trainer's bare
            TypeError came after the model loaded), naming it, its error and the fix.
    """
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        name = callbacks.__name__ if isinstance(callbacks, type) else f"{type(callbacks).__name__}()"
        raise TypeError(f"callbacks is {callbacks!r:.80} ({'a class' if isinstance(callbacks, type) else type(callbacks).__name__}), "
                        f"not a list; give a list: callbacks=[{name}] (transformers' Trainer takes a list).")
    for cb in callbacks:
        check_callback(cb)
    return [_instance(cb) for cb in callbacks]


def _instance(callback):
    """A callback instance: `callback` itself, or a class built with no arguments (CallbackHandler.add_callback's rule)."""
    if not isinstance(callback, type):
        return callback
    try:
        return callback()
    except TypeError as e:
        raise TypeError(f"callbacks entry {callback.__name__} is a class, which transformers' Trainer builds with no arguments, and "
                        f"{callback.__name__}() raised TypeError: {e}; give an instance: callbacks=[{callback.__name__}(…)].") from e


def check_early_stopping(callbacks: list, metric_for_best_model: str | None, eval_strategy: str) -> None:
    """Refuse an `EarlyStoppingCallback` that cannot work, before the model loads.

    transformers' callback asserts both at `on_train_begin` (after loading, with a bare AssertionError).
    Args:
        callbacks: what `check_callbacks` returned (instances or classes; subclasses count).
        metric_for_best_model, eval_strategy: the run's config values.
    Raises:
        ValueError: no `metric_for_best_model` (the callback compares it across evaluations), or
            eval_strategy="no" (nothing is evaluated, so it never compares), naming the fix.
    """
    if not any(issubclass(cb, EarlyStoppingCallback) if isinstance(cb, type) else isinstance(cb, EarlyStoppingCallback) for cb in callbacks):
        return
    if metric_for_best_model is None:
        raise ValueError("EarlyStoppingCallback stops on a metric that no longer improves, and metric_for_best_model is None; "
                         "set it, e.g. metric_for_best_model='reward' (eval_reward, higher is better).")
    if eval_strategy == "no":
        raise ValueError(f"EarlyStoppingCallback compares {metric_for_best_model!r} across evaluations, and eval_strategy='no' "
                         "runs none; set eval_strategy='steps' (every eval_steps) or 'epoch', with an eval_dataset.")


def check_callback(callback) -> None:
    """Raise TypeError unless `callback` is a TrainerCallback instance or subclass."""
    is_class = isinstance(callback, type) and issubclass(callback, TrainerCallback)
    if not (is_class or isinstance(callback, TrainerCallback)):
        raise TypeError(f"callback {callback!r} has type {type(callback).__name__}; pass a transformers.TrainerCallback instance or class.")


def _absolute(steps: float, max_steps: int) -> int:
    """A logging/eval/save interval in steps; below 1 it is a fraction of max_steps (transformers' rule)."""
    return int(steps) if steps >= 1 else max(1, math.ceil(steps * max_steps))
