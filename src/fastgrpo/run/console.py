"""The training console as transformers' `Trainer` prints it: through a callback the trainer adds itself.

transformers' `Trainer.__init__` appends `PrinterCallback` when `args.disable_tqdm`, else `ProgressCallback`, after
the user's callbacks; scripts take it out with `trainer.remove_callback(ProgressCallback)` or
`trainer.pop_callback(PrinterCallback)` (the class matches its subclasses, `isinstance`) or add their own. fastgrpo's
two are those classes' subclasses, so the same calls find them, and print fastgrpo's console:

- `ConsoleProgressCallback` (`ProgressCallback`): a rich progress bar in optimizer steps, and one `step N  key value …`
  line per log;
- `ConsolePrinterCallback` (`PrinterCallback`, `disable_tqdm=True`): the lines alone.

Only the main process prints (`state.is_world_process_zero`); a line is printed once `train()` has begun, as the
trainer wrote metrics.jsonl before (an evaluation before training prints none). Removing them silences the bar and
the lines only: metrics.jsonl, completions.jsonl and the trackers are written by the trainer (metrics.py).

Not here: the `fastgrpo: …` notes and the completions table (the trainer prints them, as TRL prints its table).
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import PrinterCallback, ProgressCallback

LINE_KEYS = ("loss", "reward", "reward_std", "kl_old", "clip_ratio/region_mean", "completions/mean_length", "grad_norm", "learning_rate",
             "dynamic_sampling/reward_before", "dynamic_sampling/keep_rate")  # the last two with filter_groups only
SUMMARY_LOSS = "train_loss"  # Trainer's summary log: the run's mean loss, not a step's, so not on a step line


def step_line(step: int, logs: dict) -> str | None:
    """The console line of one logged record: `step N` and LINE_KEYS' values, then an evaluation's `eval[_<set>]_loss`,
    `_reward`; None for a record with none of them (a `trainer.log` of the user's own keys, Trainer's summary alone)."""
    keys = LINE_KEYS + tuple(k for k in logs if k.endswith(("_loss", "_reward")) and "/" not in k and k != SUMMARY_LOSS)
    shown = "  ".join(f"{k} {logs[k]:.4g}" for k in keys if logs.get(k) is not None)
    return f"step {step:>5}  {shown}" if shown else None


class _StepLines:
    """on_log: the record's `step_line` on the console, on the main process, once training has begun."""

    def __init__(self, console: Console | None = None):
        self.console, self.began = console or Console(), False

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = step_line(state.global_step, logs or {}) if state.is_world_process_zero and self.began else None
        if line is not None:
            self.console.print(line, soft_wrap=True)  # one line at any width: `grep ^step` gets whole lines


class ConsolePrinterCallback(_StepLines, PrinterCallback):
    """transformers' `PrinterCallback` (Trainer's default with `disable_tqdm=True`) printing fastgrpo's step lines.

    Args:
        console: the rich console to print on (the trainer's); default a new one on stdout.
    """


class ConsoleProgressCallback(_StepLines, ProgressCallback):
    """transformers' `ProgressCallback` (Trainer's default) as fastgrpo shows it: a rich bar in optimizer steps
    (done/total, elapsed, ETA) from the first epoch's start to the end of training, and fastgrpo's step lines above it.

    Args:
        console: the rich console to print on (the trainer's); default a new one on stdout.
    """

    def __init__(self, console: Console | None = None):
        ProgressCallback.__init__(self)
        _StepLines.__init__(self, console)
        self.progress: Progress | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control)
        if state.is_world_process_zero:
            columns = (TextColumn("GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"),
                       TimeRemainingColumn())
            self.progress = Progress(*columns, console=self.console)
            self.progress.add_task("train", total=state.max_steps, completed=state.global_step)

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.progress is not None:  # shown from the loop's start, after eval_on_start (a started bar stays as it is)
            self.progress.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.progress.task_ids[0], completed=state.global_step)

    def on_prediction_step(self, args, state, control, **kwargs):
        """No evaluation bar: ProgressCallback's would draw a tqdm bar (sized by the `eval_dataloader` the trainer now
        passes, as Trainer does) under rich's live display; an evaluation shows as its step line."""

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Stop the bar (rich's live display redraws and holds stdout until stopped): at on_train_end, and when training
        ends by an exception (`TrainerEvents.close`)."""
        if self.progress is not None and self.progress.live.is_started:
            self.progress.stop()
        self.progress = None


def default_console_callback(args, console: Console | None = None) -> ConsolePrinterCallback | ConsoleProgressCallback:
    """Trainer's choice of its console callback: a `PrinterCallback` with `args.disable_tqdm`, else a `ProgressCallback`
    (transformers' `NotebookProgressCallback` in a notebook: rich draws its bar in Jupyter itself)."""
    return (ConsolePrinterCallback if args.disable_tqdm else ConsoleProgressCallback)(console)
