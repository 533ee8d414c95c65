"""`evaluate()` reports TRL's eval loss beside the rewards (issue 30, kind 9).

TRL's `prediction_step` runs `_compute_loss` on each eval batch in eval mode: π_old is the policy's own
log-probs detached, so ρ = 1 and (dapo) the loss is Σ mask·(−Â + β·k3) / Σ mask, with
k3 = e^{log π_ref − log π} − (log π_ref − log π) − 1; transformers' evaluation loop averages the batch
losses over samples. The test records each eval batch, recomputes that by hand from the model's own
padded forward, and compares it with `eval_loss`.
"""

import math

import torch

from fastgrpo import GRPOConfig, GRPOTrainer


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def token_logps(model, rollout):
    """(N, T) log π of each completion token from the model's padded forward (TRL's layout), temperature 1."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    T = rollout.completion_ids.shape[1]
    return torch.log_softmax(logits[:, -T - 1 : -1].float(), -1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1)


def test_eval_loss_is_trls_eval_mode_loss(tmp_path, tokenizer, make_model, prompts):
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
        max_prompt_length=32, max_completion_length=8, max_steps=2, learning_rate=1e-2, logging_steps=1, save_steps=1000,
        disable_tqdm=True, loss_type="dapo", beta=0.5, per_device_eval_batch_size=8,
    )
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()  # π_θ moves away from π_ref: the KL term is not 0
    batches, real = [], trainer.update.eval_loss
    trainer.update.eval_loss = lambda rollout: batches.append(rollout) or real(rollout)
    metrics = trainer.evaluate(prompts.select(range(4)))  # 4 prompts × G 4, 8 completions per batch: 2 batches
    assert len(batches) == 2
    losses, sizes = [], []
    for rollout in batches:
        mask = rollout.completion_mask.float()
        logps, ref = token_logps(trainer.model, rollout), token_logps(trainer.ref_model, rollout)
        k3 = torch.exp(ref - logps) - (ref - logps) - 1
        per_token = -rollout.advantages[:, None] + 0.5 * k3  # ρ = 1: min(ρÂ, clip(ρ)Â) = Â
        losses.append(float((per_token * mask).sum() / mask.sum()))
        sizes.append(len(rollout))
        assert float((k3 * mask).sum()) > 1e-4  # the KL term is really there
    expected = sum(l * n for l, n in zip(losses, sizes)) / sum(sizes)
    assert math.isclose(metrics["eval_loss"], expected, abs_tol=1e-5)
    assert "eval_reward" in metrics


def test_each_named_eval_set_has_its_loss(tmp_path, tokenizer, make_model, prompts):
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
        max_prompt_length=32, max_completion_length=8, max_steps=1, logging_steps=1, save_steps=1000, disable_tqdm=True,
        loss_type="grpo", eval_strategy="steps", eval_steps=1,
    )
    eval_sets = {"short": prompts.select(range(2)), "long": prompts.select(range(2, 4))}
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=eval_sets, processing_class=tokenizer)
    trainer.train()
    logged = [r for r in trainer.state.log_history if "eval_short_loss" in r or "eval_long_loss" in r]
    assert {k for r in logged for k in r if k.endswith("_loss")} == {"eval_short_loss", "eval_long_loss"}
    # grpo, β = 0, ρ = 1: each sequence's loss is −Â, and Â sums to 0 over each group, so the mean is 0
    assert all(abs(r[k]) < 1e-6 for r in logged for k in r if k.endswith("_loss"))


def test_eval_kl_is_exactly_zero_before_training(tmp_path, tokenizer, make_model, prompts):
    # A constant reward (Â = 0) and an untrained policy (π_θ = π_ref): the eval loss is β · mean k3, exactly 0, since
    # π_ref's log-probs come from the eval pass's own packed rows (one pass per eval batch) in the policy's precision.
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
        max_prompt_length=32, max_completion_length=8, max_steps=1, logging_steps=1, save_steps=1000, disable_tqdm=True,
        loss_type="dapo", beta=0.5, per_device_eval_batch_size=8, bf16=True,  # bf16 products: a row's values depend on its pass
    )
    trainer = GRPOTrainer(make_model(), lambda completions, **kw: [1.0] * len(completions), args=args, train_dataset=prompts,
                          processing_class=tokenizer)
    metrics = trainer.evaluate(prompts.select(range(4)))
    assert metrics["eval_loss"] == 0.0
