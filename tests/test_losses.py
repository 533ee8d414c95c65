"""Hand-checked tests of fastgrpo.algo.losses: every expected value and gradient is
worked out in the comment next to its assertion (torchtune's test_ppo_loss.py
style). Tiny tensors, CPU, float64 unless the dtype is the point of the test.

Run: python -m pytest tests/test_losses.py -q
"""

import math

import pytest
import torch

from fastgrpo.algo.advantages import group_advantages, normalize_then_sum, weighted_rewards
from fastgrpo.algo.losses import LOSS_TYPES, StepCounts, entropy_from_logits, entropy_threshold, grpo_loss, high_entropy_mask, kl_full, kl_k3, log_importance_weights, selective_log_softmax

F64 = torch.float64
NAN = float("nan")


def close(actual, expected, atol=1e-9):
    """assert_close against a hand value given as a nested list or number."""
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual.detach(), expected.expand_as(actual), atol=atol, rtol=0)


def leaf(values):
    return torch.tensor(values, dtype=F64, requires_grad=True)


# ---------------------------------------------------------------------------
# log-probs and entropy
# ---------------------------------------------------------------------------


def test_selective_log_softmax_equals_log_softmax_gather():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    index = torch.randint(0, 11, (3, 5), generator=g)
    reference = torch.log_softmax(logits, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, index), reference)


def test_selective_log_softmax_bf16_logits_are_computed_in_fp32():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 4, 7, generator=g) * 4).to(torch.bfloat16)
    index = torch.randint(0, 7, (2, 4), generator=g)
    reference = torch.log_softmax(logits.float(), dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    out = selective_log_softmax(logits, index)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference)


def test_entropy_of_uniform_is_log_vocab():
    # Equal logits → p_v = 1/V → H = −Σ (1/V) log(1/V) = log V; log 7 = 1.945910...
    logits = torch.full((2, 3, 7), 0.3)
    close(entropy_from_logits(logits).double(), math.log(7), atol=1e-6)
    # one-hot-ish: logits (10, 0) over V=2: p = (σ(10), σ(−10)); H = −Σ p log p
    p = torch.sigmoid(torch.tensor(10.0, dtype=F64))
    h = -(p * p.log() + (1 - p) * (1 - p).log())
    close(entropy_from_logits(torch.tensor([[[10.0, 0.0]]])).double(), h, atol=1e-6)


# ---------------------------------------------------------------------------
# advantages
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_equal_non_dyadic_rewards_give_exactly_zero(dtype, scale_rewards):
    # 0.1, 0.35, 0.95 have no exact binary form; G=8 copies of them average to
    # a float that is not the value itself in fp32, so a naive (r − mean)/(std + 1e-4)
    # gives ±7e-5 … 6e-4 (checked below for fp32) instead of 0.
    rewards = torch.tensor([[0.1] * 8, [0.35] * 8, [0.95] * 8], dtype=dtype)
    if dtype == torch.float32:
        naive = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
        assert naive.abs().max() > 0  # the residue the guard must remove
    adv = group_advantages(rewards, scale_rewards, batch_std=torch.tensor(0.5, dtype=dtype))
    assert adv.dtype == dtype
    assert torch.equal(adv, torch.zeros_like(adv))


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], dtype=F64)
    # "group", unbiased (n−1) std, eps 1e-4:
    #   group 0: mean 2, deviations (−1, 0, 1), var = (1+0+1)/2 = 1, std 1
    #            → Â = (−1, 0, 1)/1.0001
    #   group 1: mean 2, deviations (−2, −2, 4), var = (4+4+16)/2 = 12, std √12 = 3.4641016
    #            → Â = (−2, −2, 4)/(√12 + 1e-4)
    #   (the population std √8 = 2.83 would give −0.707…, not −0.577…)
    s12 = math.sqrt(12) + 1e-4
    close(group_advantages(rewards, "group"), [[-1 / 1.0001, 0.0, 1 / 1.0001], [-2 / s12, -2 / s12, 4 / s12]])
    # "batch": same deviations over the rollout's std (given, here 2) + eps
    close(
        group_advantages(rewards, "batch", batch_std=torch.tensor(2.0, dtype=F64)),
        [[-1 / 2.0001, 0.0, 1 / 2.0001], [-2 / 2.0001, -2 / 2.0001, 4 / 2.0001]],
    )
    # "none" (Dr. GRPO): deviations only
    close(group_advantages(rewards, "none"), [[-1.0, 0.0, 1.0], [-2.0, -2.0, 4.0]])


def test_group_advantages_refuses_bad_arguments():
    rewards = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="batch_std"):
        group_advantages(rewards, "batch")
    with pytest.raises(ValueError, match="'group', 'batch' or 'none'"):
        group_advantages(rewards, "std")


def test_weighted_rewards_skips_nan():
    rewards = torch.tensor([[1.0, NAN], [0.5, 2.0], [NAN, NAN]], dtype=F64)
    weights = torch.tensor([1.0, 0.5], dtype=F64)
    # row 0: 1·1 + (None skipped) = 1; row 1: 0.5 + 0.5·2 = 1.5; row 2: nothing → 0 (TRL's nansum)
    close(weighted_rewards(rewards, weights), [1.0, 1.5, 0.0])


def test_normalize_then_sum_by_hand_with_nan():
    # one prompt, G = 3, R = 2 reward functions, weights (1, 0.5)
    #   r_0 = (1, 2, 3):      mean 2, std 1      → (−1, 0, 1)/1.0001
    #   r_1 = (10, None, 30): over the 2 present: mean 20, std √((100+100)/1) = 14.1421356
    #                          → (−10, ·, 10)/(14.1421356 + 1e-4), the None contributes 0
    rewards = torch.tensor([[[1.0, 10.0], [2.0, NAN], [3.0, 30.0]]], dtype=F64)
    weights = torch.tensor([1.0, 0.5], dtype=F64)
    a = 1 / 1.0001
    b = 10 / (math.sqrt(200) + 1e-4)
    close(normalize_then_sum(rewards, weights), [[-a - 0.5 * b, 0.0, a + 0.5 * b]])


def test_normalize_then_sum_equal_rewards_with_nan_give_exactly_zero():
    # Each reward is constant over its present entries, so no signal: exactly 0.
    # The negative case is the regression: filling None with 0 made max = 0 ≠ −0.1,
    # so the group looked non-constant and the fp32 mean residue /1e-4 leaked out
    # (7.45e-5 per completion for seven −0.1s).
    rewards = torch.tensor([[[-0.1, 0.95]] * 7 + [[NAN, NAN]], [[0.35, -0.35]] * 7 + [[NAN, -0.35]]])
    out = normalize_then_sum(rewards, torch.tensor([1.0, 1.0]))
    assert torch.equal(out, torch.zeros_like(out))


# ---------------------------------------------------------------------------
# importance ratios
# ---------------------------------------------------------------------------

LOGPS = [[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]]
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=F64)


def test_log_importance_weights_token():
    logps = leaf(LOGPS)
    old = torch.tensor([[-1.1, -1.8, -0.5], [-1.0, -0.7, -2.0]], dtype=F64)
    lr = log_importance_weights(logps, old, MASK, "token")
    # log ρ_t = log π_θ − log π_old, token by token; exactly 0 at the masked (1, 1), (1, 2)
    close(lr, [[0.1, -0.2, 0.0], [-0.5, 0.0, 0.0]])
    # ∂ log ρ_t / ∂ log π_θ,t = 1 on every active token, 0 on masked ones
    lr.sum().backward()
    close(logps.grad, MASK)


def test_log_importance_weights_sequence_gspo():
    logps = leaf(LOGPS)
    old = torch.tensor([[-1.1, -1.8, -0.5], [-1.0, -0.7, -2.0]], dtype=F64)
    lr = log_importance_weights(logps, old, MASK, "sequence")
    # GSPO: log s_i = mean of log ρ over the sequence's tokens, at every active token:
    #   row 0: (0.1 − 0.2 + 0.0)/3 = −1/30; row 1: only token 0 counts: −0.5 (masked: 0)
    close(lr, [[-1 / 30] * 3, [-0.5, 0.0, 0.0]])
    # The sequence objective's gradient: ∂ (Σ_t m_t log s_i / |o_i|) / ∂ log π_θ,t = m_t/|o_i|
    #   row 0: 1/3 each; row 1: 1 on token 0, 0 on the masked ones.
    ((lr * MASK).sum(-1) / MASK.sum(-1)).sum().backward()
    close(logps.grad, [[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
    # The gradient flows through the mean (TRL's form): one position's value
    # moves with every token of its sequence, ∂ log s_i / ∂ log π_θ,t' = m_t'/|o_i|.
    logps.grad = None
    lr = log_importance_weights(logps, old, MASK, "sequence")
    lr[0, 1].backward()
    close(logps.grad, [[1 / 3, 1 / 3, 1 / 3], [0.0, 0.0, 0.0]])


def test_log_importance_weights_refuses_unknown_level():
    with pytest.raises(ValueError, match="'token' or 'sequence'"):
        log_importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "seq")


# ---------------------------------------------------------------------------
# grpo_loss on policy (ρ = 1): every loss_type by hand
# ---------------------------------------------------------------------------

# One micro-batch of 2 completions, mask [[1,1,1],[1,0,0]] (4 active tokens),
# Â = (+0.5, −1). It is one of two micro-batches of an optimizer step with
# 10 active tokens and 4 completions in all; max_completion_length L = 4 (this
# micro-batch is padded only to its longest completion, 3).
ADV = torch.tensor([0.5, -1.0], dtype=F64)
STEP = StepCounts(tokens=10.0, sequences=4.0, micro_batches=2, max_completion_length=4)

# At ρ = 1 the clipped surrogate per token is −ρÂ = −Â, and ∂(−ρÂ)/∂ log π = −ρÂ = −Â:
#   row 0 tokens: −0.5 each (3 tokens); row 1 token 0: +1.0.
#   Σ over active tokens = −1.5 + 1.0 = −0.5.
ON_POLICY = {
    # mean per sequence, sum, / step sequences: (−0.5 + 1.0)/4 = 0.125.
    # gradient −Â/(|o_i|·4): row 0: −0.5/12 = −1/24; row 1: +1/4.
    "grpo": (0.125, [[-1 / 24] * 3, [0.25, 0.0, 0.0]]),
    # token mean of the micro-batch, / micro-batches: −0.5/4/2 = −0.0625.
    # gradient −Â/(4·2): row 0: −0.0625; row 1: +0.125.
    "bnpo": (-0.0625, [[-0.0625] * 3, [0.125, 0.0, 0.0]]),
    # Σ / step tokens: −0.5/10 = −0.05; gradient −Â/10: row 0 −0.05, row 1 +0.1.
    "dapo": (-0.05, [[-0.05] * 3, [0.1, 0.0, 0.0]]),
    # Σ / (step sequences · L): −0.5/16; gradient −Â/16: row 0 −1/32, row 1 +1/16.
    "dr_grpo": (-0.5 / 16, [[-1 / 32] * 3, [1 / 16, 0.0, 0.0]]),
    # CISPO: −sg[w]·Â·log π with w = 1: row 0: −0.5·(−1 − 2 − 0.5) = 1.75;
    # row 1: −(−1)·(−1.5) = −1.5; Σ = 0.25, / 10 = 0.025.
    # gradient −w·Â/10 = the plain policy gradient, same as dapo.
    "cispo": (0.025, [[-0.05] * 3, [0.1, 0.0, 0.0]]),
    # SAPO: −(2/τ)·Â with τ_pos = 1 (Â > 0), τ_neg = 1.05 (Â < 0), aggregated per
    # sequence like grpo (as TRL): row 0 mean −2·0.5 = −1; row 1: +2/1.05; / 4 sequences.
    # gradient f'(1)·ρ·(−Â)/(|o_i|·4) = the grpo gradient.
    "sapo": ((-1 + 2 / 1.05) / 4, [[-1 / 24] * 3, [0.25, 0.0, 0.0]]),
    # LUSPO: per-token −Â summed per sequence (= its mean × length), / 4 sequences:
    # (−1.5 + 1.0)/4 = −0.125; gradient −Â/4: row 0 −0.125, row 1 +0.25.
    "luspo": (-0.125, [[-0.125] * 3, [0.25, 0.0, 0.0]]),
    # VESPO: φ(w = 1) = e^(λ + k·0 − λ·1) = 1, so −φ·Â·log π is CISPO's value 0.025, its gradient too.
    "vespo": (0.025, [[-0.05] * 3, [0.1, 0.0, 0.0]]),
}


def test_every_loss_type_has_a_hand_example():
    assert set(ON_POLICY) == set(LOSS_TYPES)


@pytest.mark.parametrize("loss_type", sorted(ON_POLICY))
def test_grpo_loss_on_policy_by_hand(loss_type):
    logps = leaf(LOGPS)
    out = grpo_loss(logps, logps.detach(), ADV, MASK, STEP, loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else 0.2)
    value, grad = ON_POLICY[loss_type]
    close(out.loss, value)
    out.loss.backward()
    close(logps.grad, grad)
    # on policy nothing is clipped and KL(π_θ‖π_old) is 0
    m = out.metrics
    assert m.get("clip_low", 0) == 0 and m.get("clip_high", 0) == 0 and m.get("clip_region", 0) == 0 and m.get("cispo_clipped", 0) == 0
    assert m["kl_old"] == 0 and m["tokens"] == 4


def test_grpo_loss_refuses_unknown_loss_type_and_missing_kl():
    logps = leaf(LOGPS)
    with pytest.raises(ValueError, match="use one of grpo, bnpo, dapo"):
        grpo_loss(logps, logps.detach(), ADV, MASK, STEP, loss_type="ppo")
    with pytest.raises(ValueError, match="per_token_kl"):
        grpo_loss(logps, logps.detach(), ADV, MASK, STEP, beta=0.1)


def test_grpo_loss_beta_adds_kl_on_every_active_token():
    logps = leaf(LOGPS)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, 9.0]], dtype=F64)  # 9.0: masked, ignored
    out = grpo_loss(logps, logps.detach(), ADV, MASK, STEP, loss_type="dapo", beta=0.5, per_token_kl=kl)
    # dapo value −0.05 (above) + 0.5·(0.1 + 0.2 + 0.3 + 0.4)/10 = −0.05 + 0.05 = 0
    close(out.loss, 0.0)
    close(out.metrics["kl"], 1.0)


def test_grpo_loss_policy_mask_drops_policy_term_only():
    logps = leaf(LOGPS)
    keep = torch.tensor([[1, 0, 0], [1, 0, 0]], dtype=F64)  # e.g. the high-entropy tokens
    kl = torch.full((2, 3), 0.2, dtype=F64)
    out = grpo_loss(logps, logps.detach(), ADV, MASK, STEP, beta=1.0, per_token_kl=kl, use_bias_correction_kl=False, policy_mask=keep)
    # policy term on 2 tokens: −0.5 + 1.0 = 0.5; KL on all 4 active tokens: 0.8; (0.5 + 0.8)/10
    close(out.loss, 0.13)
    out.loss.backward()
    # ∂/∂ log π: −Â/10 on kept tokens, 0 elsewhere (per_token_kl is a given tensor here)
    close(logps.grad, [[-0.05, 0.0, 0.0], [0.1, 0.0, 0.0]])


# ---------------------------------------------------------------------------
# grpo_loss off policy: clipping
# ---------------------------------------------------------------------------

# Ratios chosen by hand; old = logps − log ρ so that exp(logps − old) = ρ.
# ε_low = 0.2 → lower bound 0.8; ε_high = 0.28 → upper bound 1.28; δ = 1.5.
RATIOS = [[1.25, 1.3, 0.5], [0.5, 1.4, 2.0]]
OFF_ADV = torch.tensor([1.0, -1.0], dtype=F64)
FULL = torch.ones(2, 3, dtype=F64)
SIX = StepCounts(tokens=6.0, sequences=2.0, micro_batches=1, max_completion_length=3)


def off_policy(loss_type="dapo", mask=FULL, **kw):
    logps = leaf(LOGPS)
    old = logps.detach() - torch.tensor(RATIOS, dtype=F64).log()
    out = grpo_loss(logps, old, OFF_ADV, mask, SIX, loss_type=loss_type, **kw)
    out.loss.backward()
    return out, logps.grad


def test_clip_higher_and_delta_by_hand():
    out, grad = off_policy(epsilon_low=0.2, epsilon_high=0.28, delta=1.5)
    # per token −min(min(ρ, δ)·Â, clip(ρ, 0.8, 1.28)·Â); gradient (when the
    # unclipped branch is taken) ∂(−ρÂ)/∂ log π = −ρÂ, else 0.
    # Row 0, Â = +1:
    #   ρ = 1.25: inside [0.8, 1.28] → loss −1.25, grad −1.25 (clip-higher: with a
    #             symmetric ε = 0.2 it would be clipped, see the next test)
    #   ρ = 1.3 : > 1.28 → clipped branch: loss −1.28, grad 0, clip_high
    #   ρ = 0.5 : Â > 0 and ρ < 0.8: min(0.5, 0.8) = 0.5 unclipped → loss −0.5, grad −0.5
    # Row 1, Â = −1:
    #   ρ = 0.5 : min(−0.5, −0.8) = −0.8 clipped → loss 0.8, grad 0, clip_low
    #   ρ = 1.4 : in (1.28, δ): min(−1.4, −1.28) = −1.4 unclipped → loss 1.4, grad +1.4
    #   ρ = 2.0 : > δ: min(−1.5, −1.28) = −1.5, constant → loss 1.5, grad 0 (not in TRL's clip_ratio: Â < 0)
    # dapo: Σ = (−1.25 − 1.28 − 0.5) + (0.8 + 1.4 + 1.5) = 0.67, / 6 tokens
    close(out.loss, 0.67 / 6)
    close(grad, [[-1.25 / 6, 0.0, -0.5 / 6], [0.0, 1.4 / 6, 0.0]])
    m = out.metrics
    assert (m["clip_low"], m["clip_high"], m["clip_region"], m["clip_units"], m["tokens"]) == (1, 1, 2, 6, 6)
    # TRL's clip_ratio/low_min and /high_max: the least low-clipped and the most high-clipped row (1/3 of row 1, of row 0)
    close(m["clip_low_min"], 0.0)
    close(m["clip_high_max"], 1 / 3)
    # k3 KL(π_θ‖π_old) = Σ (1/ρ − 1 + log ρ) over the 6 tokens
    k3 = sum(1 / r - 1 + math.log(r) for row in RATIOS for r in row)
    close(m["kl_old"], k3)


def test_symmetric_clip_clips_more():
    out, grad = off_policy(epsilon_low=0.2, epsilon_high=0.2, delta=1.5)
    # upper bound now 1.2: ρ = 1.25 (Â > 0) is clipped too → loss −1.2, grad 0.
    # Row 1 ρ = 1.4 (Â < 0) stays unclipped: the min picks −1.4 over −1.2.
    # Σ = (−1.2 − 1.2 − 0.5) + (0.8 + 1.4 + 1.5) = 0.8, / 6
    close(out.loss, 0.8 / 6)
    close(grad, [[0.0, 0.0, -0.5 / 6], [0.0, 1.4 / 6, 0.0]])
    assert (out.metrics["clip_low"], out.metrics["clip_high"], out.metrics["clip_region"]) == (1, 2, 3)


def test_without_delta_negative_advantage_is_unbounded():
    out, grad = off_policy(epsilon_low=0.2, epsilon_high=0.28)
    # Row 1 ρ = 2.0, Â = −1: min(−2.0, −1.28) = −2.0 unclipped → loss 2.0, grad +2.0, not clipped.
    # Σ = −3.03 + (0.8 + 1.4 + 2.0) = 1.17, / 6
    close(out.loss, 1.17 / 6)
    close(grad, [[-1.25 / 6, 0.0, -0.5 / 6], [0.0, 1.4 / 6, 2.0 / 6]])
    assert (out.metrics["clip_low"], out.metrics["clip_high"], out.metrics["clip_region"]) == (1, 1, 2)


def test_clip_metrics_count_active_tokens_only():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)  # the δ-clipped token (ρ = 2.0) is padding
    out, grad = off_policy(mask=mask, epsilon_low=0.2, epsilon_high=0.28, delta=1.5)
    assert (out.metrics["clip_low"], out.metrics["clip_high"], out.metrics["clip_region"], out.metrics["tokens"]) == (1, 1, 2, 5)
    # SIX still says 6 tokens (the step's count, not this micro-batch's): Σ = −3.03 + 0.8 + 1.4 = −0.83
    close(out.loss, -0.83 / 6)


def test_gspo_sequence_level_clips_whole_sequences():
    # Row 0 log-ratios (0.1, 0.2, 0.3): log s = 0.2, s = e^0.2 = 1.2214 > 1.2, Â = +1 → every
    # token of the sequence takes the clipped branch: loss −1.2 each, gradient 0.
    # Row 1 log-ratios (−0.1, 0, 0.1): s = 1, Â = −1 → loss +1 each, gradient −Â·s/|o|
    # per token under "grpo" aggregation: (1/3)/2 sequences = 1/6.
    logps = leaf(LOGPS)
    old = logps.detach() - torch.tensor([[0.1, 0.2, 0.3], [-0.1, 0.0, 0.1]], dtype=F64)
    out = grpo_loss(logps, old, OFF_ADV, FULL, SIX, loss_type="grpo", importance_sampling_level="sequence")
    # grpo: (mean row 0 = −1.2) + (mean row 1 = 1.0), / 2 sequences = −0.1
    close(out.loss, -0.1)
    out.loss.backward()
    close(logps.grad, [[0.0] * 3, [1 / 6] * 3])
    # TRL counts sequences at the sequence level (one ratio each): 1 of 2 sequences clipped high
    assert (out.metrics["clip_high"], out.metrics["clip_low"], out.metrics["clip_units"]) == (1, 0, 2)
    assert (out.metrics["clip_low_min"], out.metrics["clip_high_max"]) == (0, 1)


# ---------------------------------------------------------------------------
# CISPO and SAPO off policy
# ---------------------------------------------------------------------------


def test_cispo_weight_is_clamped_and_detached():
    out, grad = off_policy("cispo", epsilon_high=1.28)  # TRL's meaning: the weight's bound itself
    # w = sg[min(ρ, 1.28)], no lower bound:
    #   row 0 (Â = +1): ρ (1.25, 1.3, 0.5) → w (1.25, 1.28, 0.5)
    #   row 1 (Â = −1): ρ (0.5, 1.4, 2.0)  → w (0.5, 1.28, 1.28)
    # loss per token −w·Â·log π:
    #   row 0: 1.25·1 + 1.28·2 + 0.5·0.5 = 4.06
    #   row 1: w·log π = −0.75 − 0.896 − 3.84 = −5.486
    # Σ = −1.426, / 6
    close(out.loss, -1.426 / 6)
    # gradient −w·Â/6 on every token: the weight is a constant (detached), so ρ's
    # own dependence on log π adds nothing, and a truncated token (ρ = 1.3, 1.4,
    # 2.0) keeps a gradient instead of the PPO clip's 0.
    close(grad, [[-1.25 / 6, -1.28 / 6, -0.5 / 6], [0.5 / 6, 1.28 / 6, 1.28 / 6]])
    # TRL's cispo_clip_ratio: truncated weights of Â > 0 tokens (ρ = 1.3 only) over the 6 tokens
    assert (out.metrics["cispo_clipped"], out.metrics["clip_units"]) == (1, 6) and "clip_high" not in out.metrics


@pytest.mark.parametrize("adv,tau_pos,tau_neg,tau", [(2.0, 1.5, 3.0, 1.5), (-2.0, 1.5, 3.0, 3.0)])
def test_sapo_on_policy_gate(adv, tau_pos, tau_neg, tau):
    # f_τ(ρ) = 4σ(τ(ρ − 1))/τ; f_τ(1) = 4·½/τ = 2/τ → loss −2Â/τ (τ_pos if Â > 0 else τ_neg).
    # ∂f/∂ρ = 4τσ(1 − σ)/τ = 1 at ρ = 1 and ∂ρ/∂ log π = ρ = 1 → gradient −Â.
    logps = leaf([[-0.7]])
    one = StepCounts(tokens=1.0, sequences=1.0, micro_batches=1, max_completion_length=1)
    out = grpo_loss(logps, logps.detach(), torch.tensor([adv], dtype=F64), torch.ones(1, 1, dtype=F64), one,
                    loss_type="sapo", temperature_pos=tau_pos, temperature_neg=tau_neg)
    close(out.loss, -2 * adv / tau)
    out.loss.backward()
    close(logps.grad, [[-adv]])


def test_sapo_off_policy_is_soft():
    # ρ = 2, Â = +1, τ = 1: σ(1) = 0.7310586; loss −4σ(1) = −2.9242344
    # gradient −Â·4σ(1)(1 − σ(1))·ρ = −4·0.7310586·0.2689414·2 = −1.5728954:
    # the hard clip would give 0; SAPO keeps a smaller-than-ρ weight (0.786·ρ).
    logps = leaf([[-0.7]])
    old = logps.detach() - math.log(2.0)
    one = StepCounts(tokens=1.0, sequences=1.0, micro_batches=1, max_completion_length=1)
    out = grpo_loss(logps, old, torch.tensor([1.0], dtype=F64), torch.ones(1, 1, dtype=F64), one,
                    loss_type="sapo", temperature_pos=1.0)
    s = 1 / (1 + math.exp(-1))
    close(out.loss, -4 * s)
    out.loss.backward()
    close(logps.grad, [[-4 * s * (1 - s) * 2]])
    assert "clip_region" not in out.metrics and "cispo_clipped" not in out.metrics  # no hard clip: TRL logs no clip metric


# ---------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------


def test_kl_k3_zero_when_equal_and_hand_value():
    logps = torch.tensor([[-1.0, -2.0]], dtype=F64)
    assert torch.equal(kl_k3(logps, logps), torch.zeros_like(logps))
    # π_θ = 0.5, π_ref = 0.25: r = log(0.25/0.5) = −ln 2; e^r − r − 1 = 0.5 + ln 2 − 1 = 0.1931472
    close(kl_k3(torch.tensor([math.log(0.5)], dtype=F64), torch.tensor([math.log(0.25)], dtype=F64)), 0.5 + math.log(2) - 1)


def test_kl_full_two_token_vocab_and_k3_expectation():
    # π_θ = (½, ½) (logits 0, 0); π_ref = (¾, ¼) (logits ln 3, 0)
    # KL = ½ ln(½/¾) + ½ ln(½/¼) = ½ ln(4/3) = 0.1438410
    logits = torch.zeros(1, 1, 2, dtype=F64, requires_grad=True)
    ref = torch.tensor([[[math.log(3.0), 0.0]]], dtype=F64)
    kl = kl_full(logits, ref)
    close(kl.double(), [[0.5 * math.log(4 / 3)]], atol=1e-6)
    # k3 is unbiased: E_{v~π_θ}[k3(v)] = Σ_v π_θ(v)(q/p − 1 − ln q/p) = 1 − 1 + KL = KL
    p, q = torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([0.75, 0.25], dtype=F64)
    close((p * kl_k3(p.log(), q.log())).sum(), 0.5 * math.log(4 / 3))
    # gradient flows through the policy logits: ∂KL/∂z_0 = p_0 p_1 (ln(p_0/q_0) − ln(p_1/q_1))
    #   = ¼ (ln(2/3) − ln 2) = ¼ ln(1/3) = −0.2746531; z_1 gets the opposite
    kl.sum().backward()
    close(logits.grad.double(), [[[0.25 * math.log(1 / 3), -0.25 * math.log(1 / 3)]]], atol=1e-6)


# ---------------------------------------------------------------------------
# token filter
# ---------------------------------------------------------------------------


def test_high_entropy_mask_keeps_top_fraction():
    entropy = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.3, 2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    active = entropy[mask.bool()]  # the 2.0 is padding: never in the quantile, never kept

    def keep(q):
        return high_entropy_mask(entropy, mask, entropy_threshold(active, q)).tolist()

    # 5 active entropies sorted (0.1, 0.3, 0.5, 0.7, 0.9); keep the top 40 %:
    # threshold = 0.6-quantile = 0.5 + 0.4·(0.7 − 0.5) = 0.58 → keep 0.9 and 0.7.
    close(entropy_threshold(active, 0.4), 0.58, atol=1e-6)
    assert keep(0.4) == [[0, 1, 0], [1, 0, 0]]
    # top 20 % of 5 tokens: only the 0.9
    assert keep(0.2) == [[0, 1, 0], [0, 0, 0]]
    # top 50 %: threshold = median of the active tokens = 0.5 exactly; ties are kept
    # (≥, as TRL) → 0.5, 0.7, 0.9. Taking the quantile over the padding too would
    # give 0.6 and keep only two.
    assert keep(0.5) == [[0, 1, 1], [1, 0, 0]]
    # nothing active anywhere: no threshold, no token kept (TRL's all-False mask)
    assert entropy_threshold(torch.zeros(0), 0.2) is None
    assert high_entropy_mask(entropy, torch.zeros(2, 3), None).sum() == 0


def test_entropy_threshold_is_over_all_processes():
    # Item 6: process 0 holds entropies (0, 1), process 1 holds (2, 3); quantile 0.5.
    # One process holding all four: threshold = median(0, 1, 2, 3) = 1.5 → process 0
    # keeps none of its tokens. Its own micro-batch alone would give 0.5 and keep the 1.
    mask = torch.ones(1, 2)
    process_0 = torch.tensor([[0.0, 1.0]])
    everyone = torch.tensor([0.0, 1.0, 2.0, 3.0])
    close(entropy_threshold(everyone, 0.5), 1.5)
    assert high_entropy_mask(process_0, mask, entropy_threshold(everyone, 0.5)).tolist() == [[0, 0]]
    assert high_entropy_mask(process_0, mask, entropy_threshold(process_0.flatten(), 0.5)).tolist() == [[0, 1]]


# ---------------------------------------------------------------------------
# aggregation across micro-batches
# ---------------------------------------------------------------------------


def _step_gradient(loss_type, splits, counts_for=None, **kw):
    """Accumulate one optimizer step over `splits` micro-batches of 8 completions.

    Lengths 1…8 so every micro-batch has a different token count; off policy so
    the clip is exercised. `counts_for(mask_micro)` overrides the step counts
    (to emulate a wrong, per-micro-batch normaliser).
    """
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 8, 2, 7, 3, 6, 4])
    mask = (torch.arange(8).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)  # (8, 8)
    logps = (-torch.rand(8, 8, generator=g, dtype=F64) * 3).requires_grad_()
    old = logps.detach() + torch.randn(8, 8, generator=g, dtype=F64) * 0.3
    adv = torch.randn(8, generator=g, dtype=F64)
    step = StepCounts(tokens=float(mask.sum()), sequences=8.0, micro_batches=splits, max_completion_length=8)
    total = 0.0
    for rows in torch.arange(8).chunk(splits):
        counts = step if counts_for is None else counts_for(mask[rows], splits)
        out = grpo_loss(logps[rows], old[rows], adv[rows], mask[rows], counts, loss_type=loss_type, **kw)
        out.loss.backward()
        total = total + out.loss.detach()
    return total, logps.grad


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo", "grpo", "cispo", "sapo"])
def test_step_gradient_does_not_depend_on_micro_batch_split(loss_type):
    # dapo/cispo: each token's gradient is (its per-token term)/step tokens, with
    # the token count fixed in StepCounts, so 1×8, 4×2 and 8×1 agree.
    # dr_grpo divides by step sequences × L, grpo and sapo by |o_i| × step sequences: also fixed.
    loss_1, grad_1 = _step_gradient(loss_type, 1, epsilon_high=0.28)
    for splits in (4, 8):
        loss_k, grad_k = _step_gradient(loss_type, splits, epsilon_high=0.28)
        torch.testing.assert_close(grad_k, grad_1, rtol=0, atol=1e-15)
        torch.testing.assert_close(loss_k, loss_1, rtol=0, atol=1e-12)


def test_micro_batch_normalisers_do_depend_on_the_split():
    # bnpo divides each micro-batch by its own token count: with unequal lengths
    # the step gradient changes with the split (TRL's documented bnpo behaviour).
    _, grad_1 = _step_gradient("bnpo", 1)
    _, grad_4 = _step_gradient("bnpo", 4)
    assert not torch.allclose(grad_4, grad_1)
    # and dapo with a micro-batch token count (the bug StepCounts prevents) would
    # fail the invariance test above.
    def micro(mask_micro, splits):
        return StepCounts(tokens=float(mask_micro.sum()), sequences=8.0, micro_batches=splits, max_completion_length=8)

    _, grad_1 = _step_gradient("dapo", 1, micro)
    _, grad_4 = _step_gradient("dapo", 4, micro)
    assert not torch.allclose(grad_4, grad_1)


def test_dr_grpo_length_bias():
    # Two completions with the same Â = −1: a long one (3 tokens) and a short one (1 token), ρ = 1.
    # Per-token gradient −Â·(aggregation weight):
    #   grpo   : 1/(|o_i|·2): long 1/6, short 1/2 → the long wrong answer is penalised
    #            3× less per token (Dr. GRPO's length bias, arXiv 2503.20783 §3.1)
    #   dapo   : 1/4 tokens on every token
    #   dr_grpo: 1/(2·L) = 1/6 on every token (L = 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=F64)
    adv = torch.tensor([-1.0, -1.0], dtype=F64)
    counts = StepCounts(tokens=4.0, sequences=2.0, micro_batches=1, max_completion_length=3)
    grads = {}
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        logps = leaf(LOGPS)
        grpo_loss(logps, logps.detach(), adv, mask, counts, loss_type=loss_type).loss.backward()
        grads[loss_type] = logps.grad
    close(grads["grpo"], [[1 / 6] * 3, [0.5, 0.0, 0.0]])
    assert grads["grpo"][0, 0] < grads["grpo"][1, 0]  # long tokens: smaller penalty
    close(grads["dapo"], [[0.25] * 3, [0.25, 0.0, 0.0]])
    close(grads["dr_grpo"], [[1 / 6] * 3, [1 / 6, 0.0, 0.0]])
    for loss_type in ("dapo", "dr_grpo"):
        g = grads[loss_type]
        assert torch.equal(g[0], g[0, :1].expand(3)) and g[0, 0] == g[1, 0]  # equal per-token weight
