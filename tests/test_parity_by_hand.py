"""The smallest input of each TRL-parity item (issue 11), with its value worked out by hand.

Each test names its item. The same behaviours are checked against TRL's own
code on random tensors in tests/test_trl_parity.py; here every number is in a
comment, so a failure says which rule broke. CPU, float64, milliseconds
(except the two that build a tiny model).
"""

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.update.step import OptimizerStep
from fastgrpo.rollout.prompts import PromptEncoder
from fastgrpo.algo.advantages import batch_normalize, normalize_then_sum, rollout_advantages
from fastgrpo.algo.losses import LOSS_TYPES, StepCounts, entropy_threshold, grpo_loss, high_entropy_mask, kl_k3, step_tokens
from fastgrpo.model.loading import disable_dropout

F64 = torch.float64


def leaf(values):
    return torch.tensor(values, dtype=F64, requires_grad=True)


def counts(tokens=1.0, sequences=1.0, micro_batches=1, max_completion_length=2):
    return StepCounts(tokens, sequences, micro_batches, max_completion_length)


def test_item_1_sapo_is_averaged_per_sequence():
    # Two sequences of 1 and 2 tokens, Â = (1, 1), on policy (ρ = 1, τ_pos = 1).
    # Per token −f(1)·Â = −(2/τ)·1 = −2; mean per sequence −2, −2; mean of 2 sequences: −2.
    # ∂/∂ log π: f'(1)·ρ·(−Â) = −1 per token, / |o_i| / 2 sequences → [−0.5; −0.25, −0.25]
    # (a token mean, dapo-style, would give −1/3 on each of the 3 tokens).
    logps = leaf([[-1.0, 0.0], [-2.0, -3.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=F64)
    out = grpo_loss(logps, logps.detach(), torch.ones(2, dtype=F64), mask, counts(3.0, 2.0), loss_type="sapo")
    torch.testing.assert_close(out.loss, torch.tensor(-2.0, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5, 0.0], [-0.25, -0.25]], dtype=F64))


def test_item_2_normalize_then_sum_normalises_the_sum_over_the_batch():
    # G = 2, one reward function, rewards (0, 1), weight 2.
    # In the group: mean 0.5, unbiased std √0.5 = 0.70711 → ±0.5/(0.70711 + 1e-4) = ±0.70700; × 2 = ±1.41401.
    # Over the batch: mean 0, unbiased std √(2·1.41401²) = 1.99970 → ±1.41401/(1.99970 + 1e-4) = ±0.70707.
    summed = normalize_then_sum(torch.tensor([[[0.0], [1.0]]], dtype=F64), torch.tensor([2.0], dtype=F64)).view(-1)
    in_group = 2 * 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(summed, torch.tensor([-in_group, in_group], dtype=F64))
    adv = batch_normalize(summed, summed)
    expected = in_group / (math.sqrt(2) * in_group + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([-expected, expected], dtype=F64))
    assert abs(expected - 0.70707) < 1e-5
    # every sum equal (no signal anywhere): exactly 0, not 0/1e-4 residue
    assert batch_normalize(torch.full((2,), 0.3, dtype=F64), torch.full((4,), 0.3, dtype=F64)).eq(0).all()


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_unscorable_completion_is_in_no_baseline(aggregation):
    # G = 3, rewards (0, 1, unscorable), scale "none": the baseline is mean(0, 1) = 0.5, not
    # mean(0, 1, 0) = 1/3 (nansum would read "no reward" as 0): Â = (−0.5, 0.5, 0), as TRL 1.16.
    rewards = torch.tensor([[0.0], [1.0], [math.nan]], dtype=F64)
    adv = rollout_advantages(rewards, torch.ones(1, dtype=F64), 3, "none", aggregation, gather=lambda mine: mine)
    if aggregation == "sum_then_normalize":
        assert adv.tolist() == [-0.5, 0.5, 0.0]
    else:  # group-normalised ±0.5/(√0.5 + 1e-4), then over the batch (±x)/(√2·x + 1e-4) ≈ ±0.70707
        x = 0.5 / (math.sqrt(0.5) + 1e-4)
        torch.testing.assert_close(adv, torch.tensor([-1, 1, 0], dtype=F64) * x / (math.sqrt(2) * x + 1e-4))


@pytest.mark.parametrize("correct,grad", [(True, 1.0), (False, 1 - math.exp(-1))])
def test_item_3_bias_corrected_kl(correct, grad):
    # One token, log π = log π_old = −1, log π_ref = −2, Â = 0, β = 1, dapo over 1 token.
    # k3 = e^(−1) − (−1) − 1 = e^(−1) = 0.36788; ∂k3/∂ log π = 1 − e^(log π_ref − log π) = 1 − e^(−1) = 0.63212.
    # Corrected: ρ·k3 with ρ = e^(log π − log π_old) = 1: value 0.36788,
    # gradient ρ·∂k3 + k3·∂ρ = 0.63212 + 0.36788 = 1.0.
    logps = leaf([[-1.0]])
    kl = kl_k3(logps, torch.tensor([[-2.0]], dtype=F64))
    out = grpo_loss(logps, logps.detach(), torch.zeros(1, dtype=F64), torch.ones(1, 1, dtype=F64), counts(),
                    beta=1.0, per_token_kl=kl, use_bias_correction_kl=correct)
    torch.testing.assert_close(out.loss, torch.tensor(math.exp(-1), dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[grad]], dtype=F64))


def test_item_3_config_field_has_trls_default():
    assert GRPOConfig().use_bias_correction_kl is True


def test_item_4_sequence_ratio_with_top_entropy_tokens():
    # One 2-token sequence, entropies (0, 1), ρ = 0.5 → threshold = median(0, 1) = 0.5: token 1 kept.
    # grpo, Â = 1, on policy: loss = −s·[0, 1] summed / 2 tokens = −s/2 with
    # s = exp(mean_t(log π_t − log π_old,t)) = 1. The gradient goes through the mean
    # to both tokens: ∂(−s/2)/∂ log π_t = −(1/2)·s·(1/2) = −0.25 each
    # (a per-token stop-gradient form would give [0, −0.5]).
    logps = leaf([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=F64)
    entropy = torch.tensor([[0.0, 1.0]], dtype=F64)
    keep = high_entropy_mask(entropy, mask, entropy_threshold(entropy[mask.bool()], 0.5))
    assert keep.tolist() == [[0.0, 1.0]]
    out = grpo_loss(logps, logps.detach(), torch.ones(1, dtype=F64), mask, counts(2.0), loss_type="grpo",
                    importance_sampling_level="sequence", policy_mask=keep)
    torch.testing.assert_close(out.loss, torch.tensor(-0.5, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.25, -0.25]], dtype=F64))


def test_item_5_dapo_normaliser_is_the_rollouts_tokens_per_step():
    # GA = 1, steps_per_generation = 2: completions of 1 and 3 tokens, Â = (1, −1), one per step.
    # The rollout has 4 tokens over 2 steps → every step divides by 4/2 = 2:
    # step 1: −1·1/2 = −0.5; step 2: −(−1)·3/2 = 1.5 (each step's own count would give −1 and 1).
    per_step = step_tokens(4.0, num_processes=1, optimizer_steps=2)
    assert per_step == 2.0
    losses = []
    for length, adv in ((1, 1.0), (3, -1.0)):
        logps = leaf([[-1.0] * length])
        out = grpo_loss(logps, logps.detach(), torch.tensor([adv], dtype=F64), torch.ones(1, length, dtype=F64),
                        counts(per_step), loss_type="dapo")
        losses.append(out.loss.item())
    assert losses == pytest.approx([-0.5, 1.5], abs=1e-12)
    # 2 processes with 8 tokens in all: each process's share per step is 8/2/2 = 2
    assert step_tokens(8.0, num_processes=2, optimizer_steps=2) == 2.0


def test_item_6_entropy_threshold_over_all_processes():
    # Process 0 holds entropies (0, 1), process 1 holds (2, 3); ρ = 0.5.
    # Gathered: median(0, 1, 2, 3) = 1.5 → process 0 keeps nothing; alone it would keep the 1.
    mine = torch.tensor([[0.0, 1.0]])
    gathered = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert high_entropy_mask(mine, torch.ones(1, 2), entropy_threshold(gathered, 0.5)).tolist() == [[0.0, 0.0]]
    assert high_entropy_mask(mine, torch.ones(1, 2), entropy_threshold(mine.flatten(), 0.5)).tolist() == [[0.0, 1.0]]


def test_item_6_trainer_gathers_every_processs_entropies():
    # The trainer's glue: pad this process's active entropies with −1, all-gather, drop the padding.
    # Process 0 (this one) has active (0, 1) and a padded 9.0; process 1 has (2, 3, 4).
    # Gathered active: 0, 1, 2, 3, 4; ρ = 0.5 → threshold = median = 2 → process 0 keeps nothing.
    other = torch.tensor([2.0, 3.0, 4.0])

    class TwoProcesses:
        num_processes = 2

        def pad_across_processes(self, local, dim, pad_index):
            return torch.nn.functional.pad(local, (0, 3 - len(local)), value=pad_index)

        def gather(self, padded):
            return torch.cat([padded, other])

    trainer = object.__new__(GRPOTrainer)  # only the accelerator get_high_entropy_mask reads
    trainer.accelerator = TwoProcesses()
    step = object.__new__(OptimizerStep)  # only the two attributes policy_mask reads
    step.args, step.entropy_mask = GRPOConfig(top_entropy_quantile=0.5), trainer.get_high_entropy_mask
    keep = step.policy_mask(torch.tensor([[0.0, 1.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert keep.tolist() == [[0.0, 0.0, 0.0]]
    # ρ = 1: no filter at all (every active token carries the policy term)
    step.args = GRPOConfig()
    assert step.policy_mask(torch.tensor([[0.0, 1.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]])) is None


def test_item_7_every_dropout_is_off(tokenizer):
    # Llama attention applies config.attention_dropout functionally in training mode
    # (there is no nn.Dropout module): two training-mode passes differ until it is off.
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.5)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    ids = torch.arange(12).view(2, 6)
    assert not torch.equal(model(ids).logits, model(ids).logits)
    disable_dropout(model)
    assert torch.equal(model(ids).logits, model(ids).logits)
    assert model.config.attention_dropout == 0.0
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)


def test_item_8_text_prompts_get_what_the_tokenizer_adds(tokenizer):
    bos_tokenizer = copy.deepcopy(tokenizer)
    bos_tokenizer.add_bos_token = True  # e.g. Llama-style tokenizers
    bos = bos_tokenizer.bos_token_id
    encode = PromptEncoder(bos_tokenizer, None)
    ids, mask, _ = encode(["Count to 3."])
    assert ids[0].tolist() == bos_tokenizer("Count to 3.")["input_ids"]
    assert ids[0, 0] == bos
    # a chat prompt keeps the template's single BOS (not one from the template and one from the tokenizer)
    ids, mask, _ = encode([[{"role": "user", "content": "Count to 3."}]])
    rendered = bos_tokenizer.apply_chat_template([{"role": "user", "content": "Count to 3."}], tokenize=False, add_generation_prompt=True)
    assert ids[0].tolist() == bos_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0, :2].tolist() != [bos, bos]


@pytest.mark.parametrize(
    "fields,max_steps,expected",
    [
        ({"warmup_steps": 0.1}, 100, 10),  # a fraction: ceil(0.1·100)
        ({"warmup_steps": 0.25}, 10, 3),  # ceil(2.5)
        ({"warmup_steps": 5}, 100, 5),  # a count
        ({"warmup_ratio": 0.1}, 100, 10),  # older scripts' field
        ({"warmup_steps": 2, "warmup_ratio": 0.5}, 100, 2),  # warmup_steps wins
        ({}, 100, 0),
    ],
)
def test_item_9_warmup(fields, max_steps, expected):
    assert GRPOConfig(**fields).num_warmup_steps(max_steps) == expected


def test_item_10_max_grad_norm_zero_means_no_clipping(tmp_path, tokenizer, make_model, prompts):
    # transformers: max_grad_norm = 0 turns clipping off. So one step with 0 must equal
    # one step with a norm no gradient reaches (1e9), and must move the weights
    # (clipping *to* 0 would scale every gradient to 0 and leave them unchanged).
    def even_tokens(completion_ids, **kwargs):
        return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]

    def run(max_grad_norm):
        model = make_model()
        before = model.lm_head.weight.detach().clone()
        args = GRPOConfig(output_dir=str(tmp_path / str(max_grad_norm)), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=1, learning_rate=1e-2, save_steps=1000, disable_tqdm=True,
                          logging_steps=1, max_grad_norm=max_grad_norm, seed=0)
        trainer = GRPOTrainer(model, even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
        trainer.train()
        return model.lm_head.weight.detach() - before, trainer.last_metrics["grad_norm"]

    moved, grad_norm = run(0.0)
    unclipped, unclipped_norm = run(1e9)
    assert moved.abs().max() > 1e-3 and grad_norm > 0
    torch.testing.assert_close(moved, unclipped, rtol=0, atol=0)
    assert grad_norm == unclipped_norm
    with pytest.raises(ValueError, match="0 for no clipping"):
        GRPOConfig(max_grad_norm=-1.0)


@pytest.mark.parametrize(
    "loss_type,level",
    [(t, "token") for t in sorted(LOSS_TYPES)] + [(t, "sequence") for t in ("bnpo", "dapo", "dr_grpo", "grpo", "luspo")],
)
def test_item_11_non_finite_values_at_masked_positions_do_not_contribute(loss_type, level):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    step = counts(3.0, 2.0, 1, 3)

    def run(junk):
        # masked positions hold `junk` in log π, log π_old and the KL
        logps = leaf([[-1.0, -2.0, junk], [-0.5, junk, junk]])
        old = torch.tensor([[-1.2, -1.9, junk], [-0.4, junk, junk]], dtype=F64)
        kl = torch.tensor([[0.1, 0.2, junk], [0.3, junk, junk]], dtype=F64)
        out = grpo_loss(logps, old, adv, mask, step, loss_type=loss_type, importance_sampling_level=level,
                        beta=0.5, per_token_kl=kl)
        out.loss.backward()
        return out, logps.grad

    clean, clean_grad = run(-1.0)
    for junk in (math.nan, math.inf, -math.inf):
        out, grad = run(junk)
        # identical to finite junk: the masked positions contribute nothing, not even a NaN
        torch.testing.assert_close(out.loss, clean.loss, rtol=0, atol=0)
        torch.testing.assert_close(grad, clean_grad, rtol=0, atol=0)
        assert grad[~mask.bool()].eq(0).all()
        for key, value in out.metrics.items():
            torch.testing.assert_close(value, clean.metrics[key], rtol=0, atol=0, msg=key)


def test_item_12_luspo_scales_gspos_sequence_loss_by_its_length():
    # Sequences of 2 and 1 tokens, Â = (1, −1), on policy, sequence ratio s = 1: per token −s·Â.
    # LUSPO sums per sequence: −2 and +1; mean over 2 sequences: −0.5 (GSPO's per-sequence mean gives 0).
    # ∂/∂ log π_t: s = exp(mean_t log ρ_t), so ∂(−2s)/∂ log π_t = −2·(1/2) = −1 per token of sequence 0, / 2 → −0.5;
    # sequence 1: ∂(+s)/∂ log π = 1, / 2 → 0.5.
    logps = leaf([[-1.0, -2.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    out = grpo_loss(logps, logps.detach(), torch.tensor([1.0, -1.0], dtype=F64), mask, counts(3.0, 2.0), loss_type="luspo",
                    importance_sampling_level="sequence")
    torch.testing.assert_close(out.loss, torch.tensor(-0.5, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5, -0.5], [0.5, 0.0]], dtype=F64))


@pytest.mark.parametrize("adv,phi", [(1.0, 4 * math.exp(-3)), (-1.0, 8 * math.exp(-2))])
def test_item_13_vespo_weights_the_whole_sequences_ratio(adv, phi):
    # One 2-token sequence with ρ = (2, 1): w = Π ρ_t = 2 (no length normalisation).
    # Â ≥ 0 (k = 2, λ = 3): φ = w^k·e^(λ(1 − w)) = 4e^(−3) = 0.19915; Â < 0 (k = 3, λ = 2): 8e^(−2) = 1.08268.
    # loss = −φ·Â·Σ log π / 2 tokens (dapo's normaliser) with Σ log π = −3; ∂/∂ log π_t = −φ·Â/2 (φ detached).
    logps = leaf([[-1.0, -2.0]])
    old = logps.detach() - torch.tensor([[math.log(2.0), 0.0]], dtype=F64)
    out = grpo_loss(logps, old, torch.tensor([adv], dtype=F64), torch.ones(1, 2, dtype=F64), counts(2.0), loss_type="vespo")
    torch.testing.assert_close(out.loss, torch.tensor(1.5 * phi * adv, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.full((1, 2), -phi * adv / 2, dtype=F64))
    torch.testing.assert_close(out.metrics["vespo/phi_seq"], torch.tensor(phi, dtype=F64))


def test_item_14_entropy_bonus_is_the_mean_entropy_whatever_the_loss_type():
    # H = (1, 3 | 2, masked 9) over 3 active tokens: mean 2; one of 2 micro-batches → bonus 2/2 = 1.
    # loss = policy − c·1 with c = 0.1, for dapo and grpo alike; ∂loss/∂H_t = −0.1/(3·2) = −1/60 per active token.
    logps = leaf([[-1.0, -2.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    for loss_type in ("dapo", "grpo"):
        entropy = leaf([[1.0, 3.0], [2.0, 9.0]])
        plain = grpo_loss(logps, logps.detach(), torch.tensor([1.0, -1.0], dtype=F64), mask, counts(3.0, 2.0, 2), loss_type=loss_type)
        out = grpo_loss(logps, logps.detach(), torch.tensor([1.0, -1.0], dtype=F64), mask, counts(3.0, 2.0, 2), loss_type=loss_type,
                        entropy=entropy, entropy_coef=0.1)
        torch.testing.assert_close(out.loss, plain.loss - 0.1)
        torch.testing.assert_close(out.metrics["policy_loss"], plain.loss.detach())
        assert (float(out.metrics["bonus_entropy"]), float(out.metrics["bonus_tokens"])) == (6.0, 3.0)
        out.loss.backward()
        torch.testing.assert_close(entropy.grad, torch.tensor([[-1 / 60, -1 / 60], [-1 / 60, 0.0]], dtype=F64))


def test_item_15_adaptive_entropy_coefficient():
    # Skywork-OR1 with target 0.2, Δ = 0.05, c ∈ [0.08, 0.12]: from c = 0.1,
    # H = 0.15 ≤ 0.2 → min(0.15, 0.12) = 0.12; H = 0.3 → max(0.05, 0.08) = 0.08.
    from fastgrpo.algo.entropy_control import EntropyControl, adaptive_entropy_coef

    bounds = dict(target=0.2, delta=0.05, coef_min=0.08, coef_max=0.12)
    assert adaptive_entropy_coef(0.1, 0.15, **bounds) == 0.12
    assert adaptive_entropy_coef(0.1, 0.3, **bounds) == 0.08
    # The controller applies 0 until an entropy ≤ target is measured (TRL starts from H = inf), then c.
    control = EntropyControl(0.1, True, 0.2, 0.05, 0.08, 0.12)
    assert control.applied() == 0.0
    assert control.update(entropy_sum=0.6, tokens=4) == 0.12 and control.applied() == 0.12  # H = 0.15
    assert control.update(entropy_sum=1.2, tokens=4) == 0.08 and control.applied() == 0.0  # H = 0.3
    assert EntropyControl(0.1, False, 0.2, 0.05, 0.0, 1.0).applied() == 0.1  # fixed: always c
