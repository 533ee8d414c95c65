"""TRL's completions tables: `output_dir/completions/completions_<step:05d>.parquet`, written at each log with `log_completions`.

TRL 1.16's `GRPOTrainer.log` writes, at every log, a pandas table of the completions in its `_logs` deques, which hold
`generation_batch_size` rows: the latest generation batch, every process's, in process order. A log that follows no
new generation (μ > 1, steps_per_generation > 1) writes that same batch again under its own step. Its columns, in
order: `step`, `prompt` (the dataset's prompt: text, or chat messages), `completion` (text, or the assistant's
messages), one column per reward function (its values, NaN where it returned None), the columns reward functions
added with `log_extra` (sorted by name), `advantage`. `CompletionTables` writes that file, with the same columns,
order, dtypes and rows, beside completions.jsonl (every completion, run/metrics.py), on the main process only.

The same table goes to the trackers TRL sends it to, after the log's record (TRL's `log`: `super().log` first):
W&B when "wandb" runs (report_to names it, or "all" finds it) and `wandb.run` is not None, Trackio when "trackio"
runs, each as `<tracker>.log({"completions": <tracker>.Table(dataframe=df)})`; with `log_unique_prompts` that
table keeps the first row of each prompt (TRL compares the prompts as text), the parquet file every row.

Resuming: the latest batch rides in the checkpoint (`state_dict`), so a resumed run's first logs hold the rows
the run that never stopped would; the resumed run writes the files of its own steps (same names overwrite), and
`remove_after` removes the files of steps after the checkpoint first (TRL leaves them: a resumed TRL run's folder
mixes the abandoned branch's later files with its own until it overwrites them).

Not written here, unlike TRL: an evaluation's completions (TRL appends them to the same deques, so the file of an
evaluation's step holds some of them).
"""

from __future__ import annotations

import os
import re

import torch

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


class CompletionTables:
    """The latest generation batch (every process's rows, in process order) and the parquet table written from it at each log.

    Args:
        output_dir: the run's folder; its `completions` folder is made now, as TRL makes it when the trainer is built.
        reward_names: the reward functions' log names, one column each, in order.
        report_to: GRPOConfig's trackers ([] for none); the table goes to W&B and Trackio among those that run (GRPOConfig's list: "all" already read as the installed ones).
        unique_prompts: `log_unique_prompts`: the trackers' table keeps each prompt's first row.
    """

    def __init__(self, output_dir: str, reward_names: list[str], report_to: list[str], unique_prompts: bool):
        self.output_dir, self.reward_names = output_dir, list(reward_names)
        self.trackers, self.unique_prompts = [t for t in report_to if t in ("wandb", "trackio")], unique_prompts
        self.latest: list = []  # one CompletionRows (run/metrics.py) per process: the latest rollout's
        os.makedirs(os.path.join(output_dir, FOLDER), exist_ok=True)

    def update(self, rows: list, num_processes: int) -> None:
        """Take the latest rollout of each process from a window's rows; no rows (no rollout since the last log) keeps the last.

        Args:
            rows: the window's CompletionRows of every process, each process's in order, processes in order
                (`gather_object`'s concatenation); every process collects the same number of rollouts.
            num_processes: the processes `rows` came from.
        """
        if rows:
            per_process = len(rows) // num_processes
            self.latest = list(rows[per_process - 1 :: per_process])

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
