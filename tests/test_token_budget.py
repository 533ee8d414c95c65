"""update_token_budget: an optimizer step's micro-batches merged into fewer forward/backward passes.

The grouping is checked by hand; a merged step must give the weights an unmerged one gives (the loss is a sum of
per-token terms over the step's normaliser) while running fewer passes, and loss types normalised per micro-batch
must not merge.
"""

from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerCallback

import fastgrpo.update.step as step_module
from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.update.step import merged_passes


def rows_of(prompt_tokens, completion_tokens, prompts=None):
    """A stand-in rollout whose row i has prompt_tokens[i] and completion_tokens[i] real tokens (all merged_passes reads).

    prompts[i] names row i's prompt (equal names, equal tokens); default: every row its own prompt.
    """
    P, T = max(prompt_tokens), max(completion_tokens)
    prompts = prompts or list(range(len(prompt_tokens)))
    prompt_mask = torch.tensor([[0] * (P - p) + [1] * p for p in prompt_tokens])  # left-padded
    prompt_ids = torch.tensor([[0] * (P - p) + [100 + name] * p for p, name in zip(prompt_tokens, prompts)])
    completion_mask = torch.tensor([[1] * c + [0] * (T - c) for c in completion_tokens])
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_mask=completion_mask)


def test_micro_batches_merge_in_order_while_they_fit():
    # 4 micro-batches of 2 rows: 10+5 + 10+3 = 28, 10+8 + 10+2 = 30, 4+1 + 4+1 = 10, 20+20 + 20+20 = 80 tokens
    rollout = rows_of([10, 10, 10, 10, 4, 4, 20, 20], [5, 3, 8, 2, 1, 1, 20, 20])
    rows = [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert merged_passes(rollout, rows, None) == [[0], [1], [2], [3]]
    assert merged_passes(rollout, rows, 10_000) == [[0, 1, 2, 3]]
    assert merged_passes(rollout, rows, 68) == [[0, 1, 2], [3]]  # 28 + 30 + 10 = 68 fits exactly
    assert merged_passes(rollout, rows, 67) == [[0, 1], [2], [3]]
    assert merged_passes(rollout, rows, 5) == [[0], [1], [2], [3]]  # each above the budget: a pass of its own


def test_a_shared_prompt_counts_once_per_pass():
    # Prompt A (10 tokens) for rows 0-3, B (4) for rows 4-5; micro-batches of 2 rows. Packed sizes with sharing:
    # [A 5 3] = 18, then rows 2-3 add only 8 + 2 = 10 to a pass holding A (alone: 20), [B 1 1] = 6.
    rollout = rows_of([10, 10, 10, 10, 4, 4], [5, 3, 8, 2, 1, 1], prompts=[0, 0, 0, 0, 1, 1])
    rows = [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert merged_passes(rollout, rows, 34) == [[0, 1, 2]]  # 18 + 10 + 6
    assert merged_passes(rollout, rows, 33) == [[0, 1], [2]]
    assert merged_passes(rollout, rows, 27) == [[0], [1, 2]]  # 18 + 10 > 27; [A 8 2] alone is 20, + 6 = 26
    # Unshared (every row packs its prompt): 28, 30 and 10 tokens.
    assert merged_passes(rollout, rows, 34, layout="packed") == [[0], [1], [2]]
    assert merged_passes(rollout, rows, 58, layout="packed") == [[0, 1], [2]]  # 28 + 30 = 58; + 10 > 58


def test_padded_rows_count_every_row_at_the_longest_prompt_and_completion():
    # A model that cannot pack runs rows × (longest prompt + longest completion): one long row among short ones
    # makes every row of its pass long. Rows 0-1: 2 × (4 + 2) = 12; with rows 2-3 (a 40-token prompt) 4 × (40 + 2) = 168.
    rollout = rows_of([4, 4, 40, 4, 4, 4], [2, 1, 2, 1, 2, 2])
    rows = [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert merged_passes(rollout, rows, 167, layout="padded") == [[0], [1], [2]]  # rows 2-5 are 4 × 42 = 168 too
    assert merged_passes(rollout, rows, 168, layout="padded") == [[0, 1], [2]]  # rows 0-5 would be 6 × 42 = 252
    assert merged_passes(rollout, rows, 168, layout="packed") == [[0, 1, 2]]  # packed: 6 + 5 + 42 + 5 + 6 + 6 = 70


def test_budget_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="update_token_budget=-1: use a token count, 0 for one pass per micro-batch"):
        GRPOConfig(output_dir=str(tmp_path), update_token_budget=-1)


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


class Substeps(TrainerCallback):
    def __init__(self):
        self.count = 0

    def on_substep_end(self, args, state, control, **kwargs):
        self.count += 1


def run(tmp_path, name, tokenizer, make_model, prompts, monkeypatch, **overrides):
    """Two optimizer steps (GA 4 micro-batches of 2) from one rollout; → (weights, passes per step, substep events)."""
    passes = []
    real = step_module.grpo_loss
    monkeypatch.setattr(step_module, "grpo_loss", lambda *a, **k: passes.append(1) or real(*a, **k))
    args = GRPOConfig(**{
        "output_dir": str(tmp_path / name), "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "steps_per_generation": 8,
        "num_generations": 4, "max_prompt_length": 32, "max_completion_length": 8, "max_steps": 2, "learning_rate": 1e-3,
        "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True, "seed": 0, **overrides,
    })
    events = Substeps()
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[events])
    trainer.train()
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, len(passes) / 2, events.count


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_a_merged_step_trains_the_weights_an_unmerged_one_does(tmp_path, tokenizer, make_model, prompts, monkeypatch, loss_type):
    # SGD: the weights move by lr × the gradient, so they compare the two gradients themselves (AdamW's first step,
    # g / √v ≈ sign(g), would turn the rounding of a near-zero gradient into a move of up to lr).
    sgd = {"loss_type": loss_type, "optim": "sgd", "learning_rate": 0.1}
    apart, apart_passes, apart_events = run(tmp_path, "apart", tokenizer, make_model, prompts, monkeypatch, **sgd, update_token_budget=0)
    merged, merged_passes_, merged_events = run(tmp_path, "merged", tokenizer, make_model, prompts, monkeypatch, **sgd,
                                                update_token_budget=100_000)
    assert (apart_passes, merged_passes_) == (4, 1)  # the 4 micro-batches ran as one pass
    assert apart_events == merged_events == 2 * 3  # TRL's on_substep_end: GA − 1 per optimizer step either way
    moved = 0.0
    for name, value in apart.items():
        torch.testing.assert_close(merged[name], value, rtol=1e-5, atol=1e-7)  # summation order only
        moved = max(moved, float((value - make_model().state_dict()[name]).abs().max()))
    assert moved > 1e-3  # the steps did train, by far more than the tolerance


def test_loss_normalised_per_micro_batch_is_not_merged(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    # bnpo divides each micro-batch by its own token count: merging would change the loss, so the budget is not applied
    _, passes, _ = run(tmp_path, "bnpo", tokenizer, make_model, prompts, monkeypatch, loss_type="bnpo", update_token_budget=100_000)
    assert passes == 4


def test_default_budget_is_a_full_length_micro_batch(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    # None: per_device_train_batch_size × (max_prompt_length + max_completion_length) = 2 × (32 + 8) = 80 packed tokens
    default, default_passes, _ = run(tmp_path, "default", tokenizer, make_model, prompts, monkeypatch)
    explicit, explicit_passes, _ = run(tmp_path, "explicit", tokenizer, make_model, prompts, monkeypatch, update_token_budget=80)
    _, smaller_passes, _ = run(tmp_path, "smaller", tokenizer, make_model, prompts, monkeypatch, update_token_budget=40)
    assert default_passes == explicit_passes == 2  # the test's micro-batches merge two by two under 80 tokens
    assert smaller_passes == 4  # no two fit in 40
    for name, value in explicit.items():
        assert torch.equal(default[name], value), name


def test_default_budget_under_gradient_checkpointing_is_four_micro_batches(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    # A checkpointed pass keeps each layer's input, not its activations: None is then 4 × 2 × (32 + 8) = 320 tokens,
    # which holds the step's 4 micro-batches (each ≤ 80). Checkpointing recomputes the same products: the weights
    # equal the uncheckpointed run's with the same passes, bit for bit.
    default, default_passes, _ = run(tmp_path, "default", tokenizer, make_model, prompts, monkeypatch, gradient_checkpointing=True)
    _, one_micro_batch_passes, _ = run(tmp_path, "one", tokenizer, make_model, prompts, monkeypatch, gradient_checkpointing=True,
                                       update_token_budget=80)
    plain, plain_passes, _ = run(tmp_path, "plain", tokenizer, make_model, prompts, monkeypatch, update_token_budget=320)
    assert default_passes == plain_passes == 1 and one_micro_batch_passes == 2
    for name, value in plain.items():
        assert torch.equal(default[name], value), name
