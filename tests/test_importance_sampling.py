"""The sampler–trainer correction (algo/sampling_correction.py): hand-worked values per mode, and TRL 1.16's own code.

TRL computes the vLLM importance-sampling ratio and its `sampling/*` metrics
inline in `_generate_and_score_completions`; those blocks are cut from its
source and executed as they are, on the same float64 tensors as ours.
`get_off_policy_mask` and `_compute_loss` run unchanged on a stand-in `self`
(tests/test_trl_parity.py's). The library never imports TRL; this test does.
"""

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import trl
import trl.trainer.grpo_trainer as trl_module
from test_trl_parity import Case, Processes, trl_stub

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.algo.sampling_correction import SamplingCorrection, importance_sampling_ratio, mismatch_metrics, off_policy_mask
from fastgrpo.algo.losses import StepCounts, grpo_loss

F64 = torch.float64
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

# Two completions of 3 and 2 tokens. log π_old − log μ_s = [[0.5, −1, 0], [0, 0, (−3, masked)]].
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]], dtype=F64)
SAMPLED = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -0.2, -1.0]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
E = math.e


@pytest.mark.parametrize(
    "mode,clip_min,clip_max,expected",
    [
        # per token e^0.5 = 1.6487, e^−1 = 0.3679, e^0 = 1; the masked token's diff counts as 0 → 1.
        ("token_truncate", 0.5, 1.5, [[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]]),  # clamped into [0.5, 1.5]
        ("token_truncate", None, 3.0, [[E**0.5, E**-1, 1.0], [1.0, 1.0, 1.0]]),  # TRL's default bound: nothing clamped
        ("token_mask", 0.5, 1.5, [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),  # outside [0.5, 1.5]: 0
        # per sequence: e^(0.5 − 1 + 0) = e^−0.5 = 0.6065, and e^0 = 1.
        ("sequence_truncate", 0.7, 3.0, [[0.7], [1.0]]),
        ("sequence_mask", 0.7, 3.0, [[0.0], [1.0]]),
        ("sequence_mask", None, 3.0, [[E**-0.5], [1.0]]),  # TRL's default: kept
    ],
)
def test_ratio_by_hand(mode, clip_min, clip_max, expected):
    ratio = importance_sampling_ratio(OLD, SAMPLED, MASK, mode, clip_min, clip_max)
    torch.testing.assert_close(ratio, torch.tensor(expected, dtype=F64))


def test_metrics_by_hand():
    # |Δ| over the 5 real tokens: 0.5, 1, 0, 0, 0 → mean 0.3, max 1; token_mask [0.5, 1.5] zeroes 2 of 5 ratios.
    ratio = importance_sampling_ratio(OLD, SAMPLED, MASK, "token_mask", 0.5, 1.5)
    m = mismatch_metrics(OLD, SAMPLED, ratio, MASK)
    assert float(m["logp_diff_sum"] / m["logp_diff_count"]) == pytest.approx(0.3)
    assert float(m["logp_diff_max"]) == 1.0
    assert (float(m["is_ratio_count"]), float(m["is_masked"]), float(m["is_ratio_min"]), float(m["is_ratio_max"])) == (5, 2, 0, 1)
    assert float(m["is_ratio_sum"]) == 3.0


def test_off_policy_mask_by_hand():
    # Sequence 0: Â = −1, log μ_s − log π_θ = (−1.5+1.2, −1+1.8, −0.5+0.4) = (−0.3, 0.8, −0.1): mean 0.4/3 = 0.1333.
    # δ = 0.1 < 0.1333: dropped; δ = 0.2: kept. Sequence 1 has Â ≥ 0: always kept.
    logps = torch.tensor([[-1.2, -1.8, -0.4], [-9.0, -9.0, -9.0]], dtype=F64)
    adv = torch.tensor([[-1.0], [1.0]], dtype=F64)
    assert off_policy_mask(adv, logps, SAMPLED, MASK, 0.1).flatten().tolist() == [0.0, 1.0]
    assert off_policy_mask(adv, logps, SAMPLED, MASK, 0.2).flatten().tolist() == [1.0, 1.0]


def _trl_block(first: str, last: str, before: int = 0):
    """Lines of TRL's `_generate_and_score_completions` from `before` lines above the one holding `first` up to `last`."""
    lines = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions).splitlines()
    start = next(i for i, line in enumerate(lines) if first in line) - before
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return compile(textwrap.dedent("\n".join(lines[start:end])), "trl-importance-sampling", "exec")


TRL_RATIO = _trl_block("per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                       "# Compute the per-token log probabilities for the reference", before=1)  # from its `mask = …` line
TRL_METRICS = _trl_block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {")


def trl_ratio_and_metrics(old, sampled, mask, mode, clip_min, clip_max):
    """TRL's ratio block and metric block, executed on a stand-in `self` with one process."""
    this = SimpleNamespace(
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max,
        accelerator=SimpleNamespace(gather=lambda t: t.reshape(1)), _metrics={"train": defaultdict(list)},
    )
    names = {"self": this, "completion_mask": mask, "tool_mask": None, "old_per_token_logps": old, "sampling_per_token_logps": sampled,
             "torch": torch, "math": math, "mode": "train", "device": old.device, "nanmin": trl_module.nanmin, "nanmax": trl_module.nanmax}
    exec(TRL_RATIO, names)
    exec(TRL_METRICS, names)
    return names["vllm_importance_sampling_ratio"], {k: v[0] for k, v in this._metrics["train"].items()}


def random_rollout(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)).to(F64)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    sampled = old + torch.randn(B, T, generator=g, dtype=F64) * 0.4  # a bf16-sized mismatch, some ratios beyond the bounds
    return old, sampled, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip_min,clip_max", [(None, 3.0), (0.5, 2.0), (0.8, None)])
def test_ratio_and_metrics_equal_trl(mode, clip_min, clip_max):
    old, sampled, mask = random_rollout(1)
    sampled[0, 0] = float("nan")  # a token the sampler could not score: ratio 1 there, left out of the Δ metrics
    theirs, trl_metrics = trl_ratio_and_metrics(old, sampled, mask, mode, clip_min, clip_max)
    ours = importance_sampling_ratio(old, sampled, mask, mode, clip_min, clip_max)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    m = mismatch_metrics(old, sampled, ours, mask)
    mine = {
        "sampling/sampling_logp_difference/mean": m["logp_diff_sum"] / m["logp_diff_count"],
        "sampling/sampling_logp_difference/max": m["logp_diff_max"],
        "sampling/importance_sampling_ratio/min": m["is_ratio_min"],
        "sampling/importance_sampling_ratio/mean": m["is_ratio_sum"] / m["is_ratio_count"],
        "sampling/importance_sampling_ratio/max": m["is_ratio_max"],
    }
    assert set(mine) == set(trl_metrics)
    for key, value in trl_metrics.items():
        assert float(mine[key]) == pytest.approx(value, rel=1e-12, abs=1e-12), key
    if clip_min is not None and clip_max is not None:
        assert float(m["is_ratio_min"]) < 1 < float(m["is_ratio_max"])  # the mismatch is large enough to exercise both sides


def test_off_policy_mask_is_trls_static_method():
    old, sampled, mask = random_rollout(2)
    logps = sampled - 0.2 + torch.randn(old.shape, generator=torch.Generator().manual_seed(3), dtype=F64) * 0.1  # mean KL ≈ 0.2
    adv = torch.tensor([[-1.0], [1.0], [-0.5], [0.0], [-2.0], [2.0]], dtype=F64)
    for threshold in (0.0, 0.05, 0.5):
        theirs = trl.GRPOTrainer.get_off_policy_mask(adv, logps, sampled, mask, threshold)
        ours = GRPOTrainer.get_off_policy_mask(advantages=adv, per_token_logps=logps, sampling_per_token_logps=sampled, mask=mask,
                                               off_policy_threshold=threshold)
        assert torch.equal(ours, theirs)
    assert GRPOTrainer.get_off_policy_mask(adv, logps, sampled, mask, 0.05).flatten().tolist() == [0, 1, 0, 1, 0, 1]  # Â < 0 dropped


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo", "vespo"])
def test_loss_with_correction_and_off_policy_mask_equals_trl(mode, loss_type):
    # One micro-batch, π_θ moved from π_old, sampled by a mismatched μ_s, δ = 0.05: TRL's _compute_loss vs grpo_loss.
    old, sampled, mask = random_rollout(4)
    theta = (old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(5), dtype=F64)).requires_grad_()
    adv = torch.randn(len(old), generator=torch.Generator().manual_seed(6), dtype=F64)
    clip_min, clip_max, delta = 0.5, 2.0, 0.05
    trl_ratio, _ = trl_ratio_and_metrics(old, sampled, mask, mode, clip_min, clip_max)
    entropy = torch.zeros_like(old)

    this = trl_stub(Case(loss_type=loss_type, num_processes=1, GA=1, steps_per_generation=1), Processes(1))
    this._get_per_token_logps_and_entropies = lambda model, *args, **kwargs: (theta, entropy, None)
    this.use_vllm, this.vllm_importance_sampling_correction, this.off_policy_mask_threshold = True, True, delta
    this.get_off_policy_mask = trl.GRPOTrainer.get_off_policy_mask
    this.epsilon_high = 5.0 if loss_type == "cispo" else 0.2  # cispo: the bound itself (GRPOConfig's default 5.0), as TRL
    tokens = mask.sum()
    inputs = {
        "prompt_ids": torch.zeros(len(old), 1, dtype=torch.long), "prompt_mask": torch.ones(len(old), 1, dtype=torch.long),
        "completion_ids": torch.zeros(old.shape, dtype=torch.long), "completion_mask": mask, "advantages": adv,
        "old_per_token_logps": old, "num_items_in_batch": tokens, "importance_sampling_ratio": trl_ratio, "sampling_per_token_logps": sampled,
    }
    trl_loss = trl_module.GRPOTrainer._compute_loss(this, None, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, theta)

    # vespo: TRL folds the ratio into φ(w) (get_gamma_weights) and does not weight the loss by it; so does fastgrpo
    weight, _, vespo_ratio = SamplingCorrection(True, mode, clip_min, clip_max, delta, loss_type == "vespo")(adv, theta.detach(), old, sampled, mask)
    out = grpo_loss(theta, old, adv, mask, StepCounts(float(tokens), len(old), 1, old.shape[1]), loss_type=loss_type,
                    epsilon_high=5.0 if loss_type == "cispo" else 0.2, policy_weight=weight, vespo_ratio=vespo_ratio)
    (grad,) = torch.autograd.grad(out.loss, theta)
    torch.testing.assert_close(out.loss, trl_loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, trl_grad, rtol=0, atol=1e-12)
    if loss_type == "vespo":  # TRL's logged φ(w) too, and the ratio changed it (it is not the φ of π_θ/π_old alone)
        phi = this._metrics["train"]["vespo/phi_seq_mean"][-1]
        assert float(out.metrics["vespo/phi_seq"] / out.metrics["sequences"]) == pytest.approx(phi, abs=1e-12)
        plain = grpo_loss(theta, old, adv, mask, StepCounts(float(tokens), len(old), 1, old.shape[1]), loss_type="vespo", policy_weight=weight)
        assert abs(float(plain.metrics["vespo/phi_seq"] - out.metrics["vespo/phi_seq"])) > 1e-3
    dropped = weight.flatten() == 0 if weight.shape[-1] == 1 else (weight * mask == 0).all(-1)
    assert dropped.any() and not dropped.all()  # the mask or ratio removed some sequences' loss, not all


def test_config_fields_are_trls():
    args = GRPOConfig(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.5)
    assert (args.vllm_importance_sampling_correction, args.vllm_importance_sampling_clip_max, args.off_policy_mask_threshold) == (True, 3.0, None)
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_cap"):
        assert GRPOConfig(vllm_importance_sampling_cap=2.0).vllm_importance_sampling_clip_max == 2.0
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode='token'"):
        GRPOConfig(vllm_importance_sampling_mode="token")
    with pytest.raises(ValueError, match=r"clip_min \(3.0\) must be less than"):
        GRPOConfig(vllm_importance_sampling_clip_min=3.0)
    with pytest.raises(ValueError, match="needs vllm_importance_sampling_clip_min or _clip_max"):
        GRPOConfig(vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=None)


def test_vespo_with_the_correction_is_accepted_as_trl_does():
    # TRL 1.16 trains vespo with the sampler–trainer correction on (bf16's default), folding the ratio into φ(w).
    args = GRPOConfig(loss_type="vespo", per_device_train_batch_size=4, num_generations=4)
    correction = SamplingCorrection.from_config(args)
    assert correction.correction and correction.into_vespo
    assert not SamplingCorrection.from_config(GRPOConfig(per_device_train_batch_size=4, num_generations=4)).into_vespo
    # … in TRL's token modes; a sequence mode (the default) with a sampler of its own weights is refused, as TRL refuses it with vLLM
    with pytest.raises(ValueError, match="VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or 'token_mask'"):
        SamplingCorrection.from_config(args, own_weights=True)
    token = GRPOConfig(loss_type="vespo", per_device_train_batch_size=4, num_generations=4, vllm_importance_sampling_mode="token_mask")
    assert SamplingCorrection.from_config(token, own_weights=True).into_vespo