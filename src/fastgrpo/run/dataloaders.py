"""The `torch.utils.data.DataLoader`s that TRL's `get_train_dataloader` / `get_eval_dataloader` return, over fastgrpo's
own draw order: what the trainer's dataloader methods hand to user code.

fastgrpo's loop never iterates a DataLoader: the trainer draws rows itself (`datasets.PromptOrder`, or
`dataset_kinds.StreamOrder` for a stream) and evaluation walks each eval set (`evaluation.mean_rewards`). These
loaders replay those same draws, in TRL's batch shape, so code that inspects a TRL trainer's loader sees the prompts
fastgrpo's trainer samples:

- train: one batch per optimizer step's worth of a rollout, as TRL 1.16's `RepeatSampler` lays it out:
  this process's share of a rollout's prompts (generation_batch_size / G / processes), each prompt G times in a row,
  the same batch yielded μ × steps_per_generation times (TRL's loader repeats it once per step that trains on it);
  one pass over the data per iteration, the next iteration the next pass (as the trainer draws them);
- eval / test: this process's rows (every processes-th), each num_generations_eval times in a row, as many prompts
  per batch as `evaluate()` samples together (per_device_eval_batch_size // G).

Rows pass through `identity`, TRL's data_collator: a batch is a list of the dataset's row dicts.

Not here: when and how the trainer draws (trainer.py), the orders themselves (datasets.py, dataset_kinds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from datasets import IterableDataset
from torch.utils.data import DataLoader

from .dataset_kinds import prompt_order
from .datasets import rollouts_per_pass


def identity(batch):
    """TRL's `data_collator` for GRPO (trl.trainer.utils.identity): the batch as it is, a list of row dicts."""
    return batch


def _shares(order, args, process_index: int, num_processes: int) -> Iterator[list[int]]:
    """One pass of the trainer's draws from a `PromptOrder`: this process's share of each rollout's prompts (row
    indices), drawn as `GRPOTrainer._draw` draws them: whole rollouts only (`datasets.rollouts_per_pass`)."""
    B, share = args.prompts_per_rollout, args.prompts_per_rollout // num_processes
    for _ in range(rollouts_per_pass(order.size, B)):
        yield order.take(B)[process_index * share : (process_index + 1) * share]


def _repeated(draws: Iterator[list], group: int, times: int, copy: Callable) -> Iterator[list]:
    """Each draw's items `group` times in a row (a prompt's G completions), the whole batch `times` times."""
    for drawn in draws:
        batch = [item for item in drawn for _ in range(group)]
        for _ in range(times):
            yield [copy(item) for item in batch]


class _TrainBatches:
    """The batch sampler of a map-style train set: lists of row indices, one pass per iteration (`__len__`: its batches)."""

    def __init__(self, train_dataset, args, process_index: int, num_processes: int):
        self.order, self.args, self.where = prompt_order(train_dataset, args), args, (process_index, num_processes)
        self.repeats = args.num_iterations * args.steps_per_generation

    def __iter__(self):
        return _repeated(_shares(self.order, self.args, *self.where), self.args.num_generations, self.repeats, int)

    def __len__(self) -> int:
        return rollouts_per_pass(self.order.size, self.args.prompts_per_rollout) * self.repeats


class _StreamBatches(torch.utils.data.IterableDataset):
    """A stream's batches (lists of rows), one pass per iteration; no length, as TRL's loader over a stream has none.

    The trainer draws a stream as `dataset_kinds.StreamOrder` reads it: a draw that runs past the stream's end goes on
    into its next pass. Here a pass ends with that draw; a draw wholly of the next pass (the stream's rows filled
    whole draws) starts the next iteration instead.
    """

    def __init__(self, train_dataset, args, process_index: int, num_processes: int):
        super().__init__()
        self.order, self.args, self.where, self.held = prompt_order(train_dataset, args), args, (process_index, num_processes), None

    def _shares(self) -> Iterator[list[dict]]:
        B, (index, processes) = self.args.prompts_per_rollout, self.where
        epoch, share = self.order.epoch, B // processes
        while True:
            drawn, self.held = self.held or self.order.take(B), None
            if self.order.epoch != epoch and self.order.position == len(drawn):  # all of it from the next pass
                self.held = drawn
                return
            yield drawn[index * share : (index + 1) * share]
            if self.order.epoch != epoch:
                return

    def __iter__(self):
        a = self.args
        return _repeated(self._shares(), a.num_generations, a.num_iterations * a.steps_per_generation, dict)


def train_dataloader(train_dataset, args, process_index: int, num_processes: int, collate_fn=identity) -> DataLoader:
    """A DataLoader of the training batches the trainer draws, from the run's start (see the module's docstring).

    Args:
        train_dataset: the trainer's rows (a Dataset or list of dicts) or an IterableDataset.
        args: the GRPOConfig (G, μ, steps_per_generation, the rollout's prompts, the seed and shuffle_dataset).
        process_index, num_processes: this process and how many share each rollout.
        collate_fn: TRL's data_collator (`identity`).
    """
    if isinstance(train_dataset, IterableDataset):
        return DataLoader(_StreamBatches(train_dataset, args, process_index, num_processes), batch_size=None, collate_fn=collate_fn)
    return DataLoader(train_dataset, batch_sampler=_TrainBatches(train_dataset, args, process_index, num_processes), collate_fn=collate_fn)


class _EvalBatches:
    """The batch sampler of an eval set: this process's row indices, `per_call` prompts a batch, each G times."""

    def __init__(self, size: int, per_call: int, num_generations: int, process_index: int, num_processes: int):
        self.rows, self.per_call, self.G = list(range(process_index, size, num_processes)), per_call, num_generations

    def __iter__(self):
        chunks = (self.rows[i : i + self.per_call] for i in range(0, len(self.rows), self.per_call))
        return _repeated(chunks, self.G, 1, int)

    def __len__(self) -> int:
        return -(-len(self.rows) // self.per_call)


def eval_dataloader(eval_dataset, batch_size: int, num_generations: int, process_index: int, num_processes: int,
                    collate_fn=identity) -> DataLoader:
    """A DataLoader of the batches `evaluate()` samples from one eval set: this process's rows (every num_processes-th,
    in the set's order; an IterableDataset read through once, as `evaluation.mean_rewards` reads it), each
    `num_generations` times in a row, per_device_eval_batch_size // G prompts a batch (at least one).

    Args:
        eval_dataset: one eval set (a Dataset, a list of dicts or an IterableDataset).
        batch_size: per_device_eval_batch_size, in completions.
        num_generations: completions per prompt in evaluation (num_generations_eval, else G).
    """
    rows = eval_dataset if not isinstance(eval_dataset, IterableDataset) else list(eval_dataset)
    sampler = _EvalBatches(len(rows), max(batch_size // num_generations, 1), num_generations, process_index, num_processes)
    return DataLoader(rows, batch_sampler=sampler, collate_fn=collate_fn)
