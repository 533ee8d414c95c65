"""TRL's `log_completions` at each `log()`: the completions buffer, its sample on the console, its parquet table, and the
table sent to W&B and Trackio.

TRL 1.16's `GRPOTrainer` keeps the completions in `_logs` deques of `generation_batch_size` rows, never cleared: each
generation batch (every process's rows, in process order) pushes out the oldest rows, during evaluation too (an
evaluation's completions, with their rewards, advantages and `log_extra` columns, are appended, so its rows replace
the training rows, all of them once it sampled a generation batch's worth). Its `log` does, after `super().log` (the
record to the callbacks), at every call — each training log, each `evaluate()`'s log, train()'s summary log:

1. prints `print_prompt_completions_sample`: a rich panel "Step N" of `num_completions_to_print` rows (None: all)
   with the columns Prompt, Completion, one per reward function (2 decimals), Advantage, the `log_extra` columns;
2. writes `output_dir/completions/completions_<step:05d>.parquet` (a later log at the same step, an evaluation's or
   the summary's, replaces it) with the columns, in order: `step`, `prompt` (the dataset's prompt: text, or chat
   messages), `completion` (text, or the assistant's messages), one column per reward function (NaN where it returned
   None), the `log_extra` columns (sorted by name), `advantage`;
3. sends that table to W&B when "wandb" runs and `wandb.run` is not None, and to Trackio when "trackio" runs, each as
   `<tracker>.log({"completions": <tracker>.Table(dataframe=df)})`; with `log_unique_prompts` only the first row of
   each prompt (TRL compares the prompts as text), the parquet file every row.

`CompletionTables` does the same on the main process (the trainer's `log()` calls `at_log`); completions.jsonl (every
completion, run/metrics.py) is fastgrpo's own. Differences: the sample's rows are drawn with a generator seeded by
the step (TRL draws with Python's global `random`, whose state the user's code shares); nothing is written, printed or
sent by a log before `train()` has begun (as metrics.jsonl: the folder is not yet this run's), though an evaluation's
rows still join the buffer.

Resuming: the buffer rides in the checkpoint (`state_dict`), so a resumed run's first logs hold the rows the run that
never stopped would; the resumed run writes the files of its own steps (same names overwrite), and `remove_after`
removes the files of steps after the checkpoint first (TRL leaves them: a resumed TRL run's folder mixes the
abandoned branch's later files with its own until it overwrites them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re

import torch
from accelerate.utils import gather_object

FOLDER = "completions"  # within output_dir, TRL's
_FILE = re.compile(r"^completions_(\d+)\.parquet$")


def table_path(output_dir: str, step: int) -> str:
    """The file TRL names for `step`: output_dir/completions/completions_<step:05d>.parquet."""
    return os.path.join(output_dir, FOLDER, f"completions_{step:05d}.parquet")


def written_steps(output_dir: str) -> list[int]:
    """The steps whose table is in output_dir/completions, ascending ([] when the folder is missing)."""
    folder = os.path.join(output_dir, FOLDER)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(m.group(1)) for m in map(_FILE.match, names) if m)


def remove_after(output_dir: str, step: int) -> None:
    """Remove the tables of steps after `step` (a resumed checkpoint's): they belong to the branch the resume abandons."""
    for later in (s for s in written_steps(output_dir) if s > step):
        os.remove(table_path(output_dir, later))


def gathered(batches: list, accelerator) -> list:
    """An evaluation's CompletionRows of every process, in TRL's order: each batch's rows gathered, processes in
    order, batch after batch (a process with fewer batches adds nothing to the later ones). Collective: every process
    calls it; each gets the whole list.

    Args:
        batches: this process's CompletionRows, one per sampled eval batch, in order.
    """
    if accelerator.num_processes == 1:
        return list(batches)
    per_process = gather_object([list(batches)])  # (processes,) lists of this process's batches
    return [rows[b] for b in range(max(map(len, per_process))) for rows in per_process if b < len(rows)]


class CompletionTables:
    """TRL's completions buffer (`_logs`: the latest `capacity` completions, every process's, in process order) and what
    each `log()` makes of it (`at_log`).

    Args:
        output_dir: the run's folder; its `completions` folder is made now, as TRL makes it when the trainer is built.
        reward_names: the reward functions' log names, one column each, in order.
        report_to: GRPOConfig's trackers ([] for none); the table goes to W&B and Trackio among those that run (GRPOConfig's list: "all" already read as the installed ones).
        unique_prompts: `log_unique_prompts`: the trackers' table keeps each prompt's first row.
        capacity: rows the buffer keeps, `generation_batch_size` (all processes'), as TRL's deques.
        console: the rich console the sample is printed on (the trainer's).
    """

    def __init__(self, output_dir: str, reward_names: list[str], report_to: list[str], unique_prompts: bool, capacity: int, console):
        self.output_dir, self.reward_names, self.capacity, self.console = output_dir, list(reward_names), capacity, console
        self.trackers, self.unique_prompts = [t for t in report_to if t in ("wandb", "trackio")], unique_prompts
        self.latest: list = []  # CompletionRows (run/metrics.py), oldest first: at most `capacity` rows in all
        os.makedirs(os.path.join(output_dir, FOLDER), exist_ok=True)

    def update(self, rows: list, num_processes: int) -> None:
        """Take the latest rollout of each process from a training window's rows (a generation batch: it fills the
        buffer); no rows (no rollout since the last log) keeps the buffer as it is, evaluation rows included.

        Args:
            rows: the window's CompletionRows of every process, each process's in order, processes in order
                (`gather_object`'s concatenation); every process collects the same number of rollouts.
            num_processes: the processes `rows` came from.
        """
        if rows:
            per_process = len(rows) // num_processes
            self.latest = list(rows[per_process - 1 :: per_process])

    def add(self, rows: list) -> None:
        """Append an evaluation's rows (`gathered`'s order), then keep the latest `capacity` rows, as TRL's deques."""
        self.latest = [*self.latest, *rows]
        excess = sum(len(r) for r in self.latest) - self.capacity
        while excess > 0:
            first = self.latest[0]
            if len(first) <= excess:
                self.latest, excess = self.latest[1:], excess - len(first)
            else:
                self.latest[0], excess = _tail(first, len(first) - excess), 0

    def at_log(self, step: int, num_to_print: int | None) -> str | None:
        """What TRL's `log()` does with the buffer at each call: `print_sample`, then `write` (the parquet file and the
        trackers); → the file's path, None while the buffer is empty."""
        self.print_sample(step, num_to_print)
        return self.write(step)

    def print_sample(self, step: int, num_to_print: int | None) -> None:
        """TRL's `print_prompt_completions_sample`: a panel "Step <step>" of `num_to_print` rows of the buffer drawn
        without replacement, in the order drawn (None, or as many as it holds: every row, in order; 0: nothing)."""
        n = sum(len(r) for r in self.latest)
        if n == 0 or num_to_print == 0:
            return
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text  # names as plain text: a reward named "[b]" is not rich markup

        flat = [(r, i) for r in self.latest for i in range(len(r))]
        if num_to_print is not None and num_to_print < n:  # TRL: random.sample of the rows (here a generator seeded by the step)
            flat = [flat[i] for i in random.Random(step).sample(range(n), num_to_print)]
        extra = sorted({column for r in self.latest for column in (r.extra or {})})
        table = Table(show_header=True, header_style="bold white", expand=True)
        table.add_column("Prompt", style="bright_yellow")
        table.add_column("Completion", style="bright_green")
        for name in self.reward_names:
            table.add_column(Text(name), style="bold cyan", justify="right")
        table.add_column("Advantage", style="bold magenta", justify="right")
        for column in extra:
            table.add_column(Text(column), style="bright_white")
        for rows, i in flat:
            rewards = [f"{v:.2f}" for v in rows.rewards.reshape(len(rows), -1)[i].float().tolist()]  # NaN (None) prints nan, as TRL's
            extras = [_entry(_column(rows, column)[i]) for column in extra]
            table.add_row(_entry(rows.prompts[i]), _entry(rows.completions[i]), *rewards, f"{float(rows.advantages.reshape(-1)[i]):.2f}", *extras)
            table.add_section()
        self.console.print(Panel(table, expand=False, title=f"Step {step}", border_style="bold white"))

    def frame(self, step: int):
        """The table TRL writes at `step`, as a `pandas.DataFrame` (TRL's columns and order); None before any rollout."""
        if not self.latest:
            return None
        import pandas as pd

        n = sum(len(r) for r in self.latest)
        rewards = torch.cat([r.rewards.reshape(len(r), -1).float() for r in self.latest])  # (n, R), NaN where None
        extra = sorted({column for r in self.latest for column in (r.extra or {})})  # TRL gathers them sorted by name
        table = {
            "step": [step] * n,
            "prompt": [_without_images(p) for r in self.latest for p in r.prompts],
            "completion": [_without_images(c) for r in self.latest for c in r.completions],
            **{name: rewards[:, k].tolist() for k, name in enumerate(self.reward_names)},
            **{column: [v for r in self.latest for v in _column(r, column)] for column in extra},
            "advantage": torch.cat([r.advantages.reshape(-1).float() for r in self.latest]).tolist(),
        }
        return pd.DataFrame(table)

    def write(self, step: int) -> str | None:
        """Write `frame(step)` to `table_path` (a file of that step already there is replaced) and log it to W&B and Trackio
        (`send`); → its path, None before any rollout."""
        df = self.frame(step)
        if df is None:
            return None
        path = table_path(self.output_dir, step)
        os.makedirs(os.path.dirname(path), exist_ok=True)  # a replaced previous run's folder went at this run's first write
        df.to_parquet(path)
        self.send(df)
        return path

    def send(self, df) -> None:
        """Log `df` as the table "completions" to W&B (when its run is open) and Trackio, as TRL 1.16's `GRPOTrainer.log` does;
        with `unique_prompts`, only the first row of each prompt (`df["prompt"].astype(str).duplicated()`, TRL's test)."""
        backends = []
        if "wandb" in self.trackers:
            import wandb

            backends += [wandb] if wandb.run is not None else []  # TRL's condition (WandbCallback opens the run at train_begin)
        if "trackio" in self.trackers:
            import trackio

            backends.append(trackio)
        if self.unique_prompts:
            df = df[~df["prompt"].astype(str).duplicated()]
        for backend in backends:
            backend.log({"completions": backend.Table(dataframe=df)})

    def state_dict(self) -> dict:
        """The latest batch, for a checkpoint: a resumed run's logs before its next rollout write it, as the run never stopped."""
        return {"latest": self.latest}

    def load_state_dict(self, state: dict) -> None:
        """Take back `state_dict()`'s batch."""
        self.latest = list(state.get("latest", []))


def _column(rows, column: str) -> list:
    values = list((rows.extra or {}).get(column, []))[: len(rows)]
    return values + [None] * (len(rows) - len(values))  # a process that logged no such column: None, as TRL fills it


def _without_images(messages):
    """TRL's `strip_images_from_messages`: an image block becomes {"type": "image"}; text is returned as is."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [{"type": b["type"]} if isinstance(b, dict) and b.get("type") == "image" else b for b in content]
            message = {**message, "content": content}
        out.append(message)
    return out


def _tail(rows, k: int):
    """The last `k` completions of a CompletionRows."""
    cut = len(rows) - k
    extra = {column: list(values)[cut:] for column, values in (rows.extra or {}).items()}
    return dataclasses.replace(rows, prompts=rows.prompts[cut:], completions=rows.completions[cut:], rewards=rows.rewards[cut:],
                               advantages=rows.advantages[cut:], extra=extra or rows.extra)


def _entry(entry):
    """TRL's `format_entry`: chat messages as "ROLE" headers over their reasoning, text (an image block: "[IMAGE]") and
    tool calls (`name(arg=value, …)`), messages separated by a blank line; anything else as `str`."""
    from rich.text import Text  # plain text: "[/INST]" is not rich markup

    text = Text()
    if not (isinstance(entry, list) and all(isinstance(m, dict) for m in entry)):
        return text.append(str(entry))
    for j, message in enumerate(entry):
        text.append(f"{message.get('role', '').upper()}\n", style="bold red")
        reasoning = message.get("reasoning_content") or message.get("thinking")
        if reasoning:
            text.append(reasoning, style="italic dim white").append("\n")
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "text":
                text.append(block["text"])
            elif block.get("type") == "image":
                text.append("[IMAGE]", style="bold cyan")
        if isinstance(content, str):
            text.append(content)
        for k, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function", {})
            arguments = function.get("arguments", {})
            arguments = arguments if isinstance(arguments, dict) else json.loads(arguments)
            text.append(("\n" if k else "") + f"{function.get('name', '?')}({', '.join(f'{a}={v!r}' for a, v in arguments.items())})")
        if j < len(entry) - 1:
            text.append("\n\n")
    return text
