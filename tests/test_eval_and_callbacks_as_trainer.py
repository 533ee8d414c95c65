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
