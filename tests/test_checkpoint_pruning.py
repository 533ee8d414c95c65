"""save_total_limit as transformers prunes: the newest and the best checkpoint are never deleted
(`transformers.trainer_utils.rotate_checkpoints`), and with a limit of 1 the best alone remains after training."""

import os

import pytest

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.run import checkpoint_files as ckpt


def folders(path):
    return sorted((n for n in os.listdir(path) if n.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1]))


def make_run(tmp_path, steps, run="a"):
    for step in steps:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        ckpt.write_manifest(str(folder), step, run)


@pytest.mark.parametrize(
    "steps, limit, best, at_end, kept",
    [
        ([1, 2, 3], 2, 1, False, [1, 3]),  # the best (oldest) survives; the middle one goes
        ([1, 2, 3], 1, 1, False, [1, 3]),  # limit 1 keeps two: the best and the newest, for resuming
        ([1, 2, 3], 1, 1, True, [1]),  # after training, limit 1 keeps the best alone
        ([1, 2, 3], 2, 3, False, [2, 3]),  # the best is the newest: plain oldest-first pruning
        ([1, 2, 3, 4], 3, 2, False, [2, 3, 4]),
        ([1, 2, 3], 2, None, False, [2, 3]),
        ([1, 2, 3], 2, 7, False, [2, 3]),  # a best that is not a folder here protects nothing
        ([1, 2, 3], 0, 1, False, [1, 2, 3]),  # ≤ 0: keep all (transformers)
    ],
)
def test_prune_by_hand(tmp_path, steps, limit, best, at_end, kept):
    make_run(tmp_path, steps)
    ckpt.prune(str(tmp_path) + "/", limit, "a", best=None if best is None else str(tmp_path / f"checkpoint-{best}"), at_end=at_end)
    assert folders(tmp_path) == [f"checkpoint-{s}" for s in kept]


def eval_reward_falls(prompts, completions, trainer_state, **kwargs):
    """10 − global_step: evaluations after steps 1, 2, 3 score 9, 8, 7."""
    return [10.0 - trainer_state.global_step] * len(completions)


@pytest.mark.parametrize("limit, greater, kept, best", [(2, True, [1, 3], 1), (1, True, [1], 1), (2, False, [2, 3], 3)])
def test_best_checkpoint_survives_pruning(tmp_path, tokenizer, make_model, prompts, limit, greater, kept, best):
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=2, max_steps=3, save_steps=1, eval_strategy="steps", eval_steps=1, save_total_limit=limit,
        metric_for_best_model="eval_reward", greater_is_better=greater, disable_tqdm=True, report_to="none",
    )
    trainer = GRPOTrainer(
        make_model(), eval_reward_falls, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(1)), processing_class=tokenizer,
    )
    trainer.train()
    assert [r["eval_reward"] for r in trainer.state.log_history if "eval_reward" in r] == [9.0, 8.0, 7.0]
    assert folders(args.output_dir) == [f"checkpoint-{s}" for s in kept]
    assert trainer.state.best_model_checkpoint == os.path.join(args.output_dir, f"checkpoint-{best}")
    assert os.path.isdir(trainer.state.best_model_checkpoint)
