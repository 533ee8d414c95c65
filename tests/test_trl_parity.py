"""fastgrpo's maths against TRL 1.16's own code, on identical random tensors (issue 11).

TRL's `GRPOTrainer._compute_loss` and `get_high_entropy_mask` run unchanged on
a stand-in `self` per process (no model: the policy is a (processes, N, T)
parameter θ with log π = −softplus(θ), so π_θ is a Bernoulli per token and has
an exact, differentiable entropy; the stand-in keeps TRL's entropy-controller
state across calls). TRL's advantage block is cut from the source of
`_generate_and_score_completions` and executed as it is. Both systems train
the same θ for whole optimizer steps: every process's micro-batches, DDP's
gradient mean over processes, μ passes over each of two rollouts, plain SGD,
float64. The weights and every micro-batch loss must agree to 1e-6 (they
agree to ~1e-8: TRL's `nanstd` computes Bessel's factor count/(count − 1) in
float32, everything else is float64 on both sides).

Documented differences (README, "Differences from TRL") are asserted as
differences at the end.

The library never imports TRL; this test does, as the oracle.
"""

import dataclasses
import math
import inspect
import textwrap
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import trl
from trl.trainer import grpo_trainer as trl_module

from fastgrpo import GRPOConfig
from fastgrpo.algo.advantages import rollout_advantages
from fastgrpo.algo.entropy_control import EntropyControl
from fastgrpo.algo.losses import StepCounts, entropy_threshold, grpo_loss, high_entropy_mask, kl_k3, masked_sum, step_tokens
from fastgrpo.run.metrics import window_record

F64 = torch.float64
T = 6  # max_completion_length, tokens
LR = 50.0  # large enough that μ = 2 passes leave the trust region (asserted below)


def _trl_advantage_block():
    """TRL's advantage code: from `if self.multi_objective_aggregation == ...` to its `nan_to_num`."""
    source = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    start = source.index('        if self.multi_objective_aggregation == "sum_then_normalize":')
    end = source.index("\n", source.index("advantages = torch.nan_to_num(advantages, nan=0.0)", start))
    return compile(textwrap.dedent(source[start:end]), "trl-advantages", "exec")


TRL_ADVANTAGES = _trl_advantage_block()


def trl_advantages(rewards, weights, G, scale_rewards, aggregation):
    """TRL's advantages for every process's rewards (num_processes·N, R), in process order."""
    this = SimpleNamespace(multi_objective_aggregation=aggregation, reward_weights=weights,
                           scale_rewards=scale_rewards, reward_funcs=[None] * rewards.shape[1])
    names = {"self": this, "rewards_per_func": rewards, "num_generations": G, "device": rewards.device,
             "unscorable_mask": torch.isnan(rewards).all(dim=1), "nanstd": trl_module.nanstd, "torch": torch}
    exec(TRL_ADVANTAGES, names)
    return names["advantages"]


class Processes:
    """Stand-in accelerator: `gather` of the entropy padding TRL sends returns every process's.

    `reduce` of the adaptive entropy controller's window (TRL's first reduce in
    `_compute_loss` on a step's last micro-batch) returns `world`, the step's
    sums over every process, after checking the process sent its own share.
    """

    def __init__(self, num_processes):
        self.num_processes, self.peers, self.sync_gradients, self.window = num_processes, None, True, None

    def pad_across_processes(self, local, dim=0, pad_index=0):
        width = max(len(p) for p in self.peers)
        self.padded = [F.pad(p, (0, width - len(p)), value=pad_index) for p in self.peers]
        return self.padded[0]

    def gather(self, tensor):
        padded, self.padded = getattr(self, "padded", None), None
        return torch.cat(padded) if padded is not None else tensor  # metrics: this process's own values

    def reduce(self, tensor, reduction="sum"):
        if self.window is not None:  # (own share, every process's sum)
            (own, world), self.window = self.window, None
            torch.testing.assert_close(tensor, own, rtol=0, atol=1e-12)
            return world
        return tensor  # metrics: this process's own values


@dataclasses.dataclass
class Case:
    loss_type: str = "dapo"
    num_processes: int = 2
    GA: int = 2  # gradient_accumulation_steps
    steps_per_generation: int = 4
    num_iterations: int = 2  # μ
    B: int = 4  # per_device_train_batch_size
    G: int = 4
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    level: str = "token"
    beta: float = 0.0
    bias_correction: bool = True
    top_entropy_quantile: float = 1.0
    mask_truncated: bool = False
    scale_rewards: str = "group"
    aggregation: str = "sum_then_normalize"
    vespo: tuple = (2.0, 3.0, 3.0, 2.0)  # k_pos, λ_pos, k_neg, λ_neg (TRL's defaults)
    entropy_coef: float = 0.0
    adaptive: bool = False  # use_adaptive_entropy
    entropy_target: float = 0.2
    entropy_coef_delta: float = 0.005
    entropy_coef_bounds: tuple = (0.0, 1.0)  # entropy_coef_min, entropy_coef_max

    @property
    def N(self):  # completions per process per rollout
        return self.B * self.steps_per_generation


def data(case, rollout):
    """One rollout's fixed tensors for every process, seeded by the rollout index."""
    g = torch.Generator().manual_seed(100 + rollout)
    P, N = case.num_processes, case.N
    lengths = torch.randint(1, T + 1, (P, N), generator=g)
    completion_mask = (torch.arange(T) < lengths.unsqueeze(-1)).long()  # (P, N, T)
    is_truncated = (lengths == T) & (torch.rand(P, N, generator=g) < 0.7)  # no EOS within T
    rewards = torch.rand(P * N, 2, generator=g, dtype=F64).round(decimals=1)  # ties within groups happen
    rewards[3, 1] = float("nan")  # one function not applicable to one completion
    rewards[6] = float("nan")  # an unscorable completion: no function applies
    ref = -torch.rand(P, N, T, generator=g, dtype=F64) * 2
    loss_mask = completion_mask * (~is_truncated).unsqueeze(-1).long() if case.mask_truncated else completion_mask
    return SimpleNamespace(loss_mask=loss_mask, rewards=rewards, ref=ref)


def policy(theta):
    """log π (P, N, T) and the per-token entropy of the Bernoulli π_θ, both differentiable."""
    logps = -F.softplus(theta)  # log σ(−θ)
    return logps, -(logps.exp() * logps + torch.sigmoid(theta) * -F.softplus(-theta))  # −p log p − (1−p) log(1−p)


def trl_stub(case, processes):
    """The `self` TRL's `_compute_loss` reads for one process, with TRL's config semantics and `__init__` state."""
    epsilon_high = case.epsilon_high if case.epsilon_high is not None else case.epsilon
    k_pos, lambda_pos, k_neg, lambda_neg = case.vespo
    this = SimpleNamespace(
        top_entropy_quantile=case.top_entropy_quantile, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level=case.level, beta=case.beta, loss_type=case.loss_type, epsilon_low=case.epsilon,
        epsilon_high=epsilon_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=case.GA, max_completion_length=T,
        accelerator=processes, _metrics={"train": defaultdict(list)},
        entropy_coef=case.entropy_coef, use_adaptive_entropy=case.adaptive,
        _entropy_bonus_enabled=case.entropy_coef != 0.0 or case.adaptive, _last_world_entropy=float("inf"), _entropy_window_stats=None,
        args=SimpleNamespace(use_bias_correction_kl=case.bias_correction, delta=case.delta, sapo_temperature_pos=1.0,
                             sapo_temperature_neg=1.05, steps_per_generation=case.steps_per_generation,
                             vespo_k_pos=k_pos, vespo_lambda_pos=lambda_pos, vespo_k_neg=k_neg, vespo_lambda_neg=lambda_neg,
                             entropy_target=case.entropy_target, entropy_coef_delta=case.entropy_coef_delta,
                             entropy_coef_min=case.entropy_coef_bounds[0], entropy_coef_max=case.entropy_coef_bounds[1]),
    )
    this.get_high_entropy_mask = types.MethodType(trl.GRPOTrainer.get_high_entropy_mask, this)
    this.get_gamma_weights = trl.GRPOTrainer.get_gamma_weights  # a staticmethod
    return this


def train(case, system):
    """Two rollouts, μ passes each; returns (final θ, every micro-batch loss, clipped-token count, logged metrics).

    The metrics: TRL's `_metrics["train"]` of process 0 (its `entropy_coef`,
    `vespo/phi_seq_mean`, `policy_loss` lists), or fastgrpo's equivalents.
    """
    P, N, GA = case.num_processes, case.N, case.GA
    theta = (torch.randn(P, N, T, generator=torch.Generator().manual_seed(0), dtype=F64)).requires_grad_()
    weights = torch.tensor([1.0, 0.5], dtype=F64)
    processes, losses, clipped = Processes(P), [], 0
    stubs = [trl_stub(case, processes) for _ in range(P)]
    control = EntropyControl(case.entropy_coef, case.adaptive, case.entropy_target, case.entropy_coef_delta, *case.entropy_coef_bounds)
    ours = defaultdict(list)  # fastgrpo's logged values, as TRL's process 0 logs them
    for rollout in range(2):
        d = data(case, rollout)
        old = policy(theta)[0].detach()  # π_old: the policy that generated the rollout
        if system == "trl":
            adv = trl_advantages(d.rewards, weights, case.G, case.scale_rewards, case.aggregation).view(P, N)
            num_items_in_batch = d.loss_mask.sum()  # TRL: gather(loss_mask.sum()).sum(), the whole rollout
        else:
            adv = our_advantages(d.rewards, weights, case).view(P, N)
            counts_tokens = step_tokens(float(d.loss_mask.sum()), P, case.steps_per_generation // GA)
        for _ in range(case.num_iterations):
            for step in range(case.steps_per_generation // GA):
                theta.grad = None
                entropy_all = policy(theta)[1].detach()
                peers = [[entropy_all[q, r][d.loss_mask[q, r].bool()].float() for q in range(P)] for r in step_rows(case, step)]
                window = bonus_sums(case, entropy_all, d.loss_mask, step, peers)  # (P, 2): each process's Σ H, tokens
                step_sums = torch.zeros(2, dtype=F64)
                for j in range(GA):
                    rows = step_rows(case, step)[j]
                    processes.peers, processes.sync_gradients = peers[j], j == GA - 1
                    for q in range(P):
                        (logps, entropy), mask = policy(theta[q, rows]), d.loss_mask[q, rows]
                        if system == "trl":
                            inputs = {
                                "prompt_ids": torch.zeros(case.B, 1, dtype=torch.long), "prompt_mask": torch.ones(case.B, 1, dtype=torch.long),
                                "completion_ids": torch.zeros(case.B, T, dtype=torch.long), "completion_mask": mask,
                                "advantages": adv[q, rows], "old_per_token_logps": old[q, rows],
                                "ref_per_token_logps": d.ref[q, rows], "num_items_in_batch": num_items_in_batch,
                            }
                            stubs[q]._get_per_token_logps_and_entropies = lambda model, *a, current=(logps, entropy), **k: (*current, None)
                            if case.adaptive and processes.sync_gradients:
                                processes.window = (window[q], window.sum(0))
                            loss = trl_module.GRPOTrainer._compute_loss(stubs[q], None, inputs)
                        else:
                            keep = None
                            if case.top_entropy_quantile < 1:
                                keep = high_entropy_mask(entropy, mask, entropy_threshold(torch.cat(processes.peers), case.top_entropy_quantile))
                            out = grpo_loss(
                                logps, old[q, rows], adv[q, rows], mask.to(F64), StepCounts(counts_tokens, GA * case.B, GA, T),
                                loss_type=case.loss_type, epsilon_low=case.epsilon,
                                epsilon_high=case.epsilon_high or case.epsilon,
                                delta=case.delta, importance_sampling_level=case.level, beta=case.beta,
                                per_token_kl=kl_k3(logps, d.ref[q, rows]) if case.beta > 0 else None,
                                use_bias_correction_kl=case.bias_correction, policy_mask=keep,
                                **dict(zip(("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), case.vespo)),
                                entropy=entropy if bonus(case) else None, entropy_coef=control.applied(),
                            )
                            loss, clipped = out.loss, clipped + int(out.metrics.get("clip_region", 0))
                            if bonus(case):
                                step_sums += torch.stack([out.metrics["bonus_entropy"], out.metrics["bonus_tokens"]])
                                # TRL logs a micro-batch's policy loss before its 1/GA for the per-sequence
                                # types, after it for the token-sum ones; fastgrpo sums shares to the step's (README).
                                share = out.metrics["policy_loss"] * (GA if case.loss_type in PER_SEQUENCE else 1)
                                ours["policy_loss"].append(share) if q == 0 else None
                            if q == 0:  # this micro-batch's metrics as fastgrpo logs them (metrics.window_record), TRL's keys
                                sums = {**out.metrics, "entropy": masked_sum(entropy.detach(), mask)}
                                record = window_record(0, {k: float(v) for k, v in sums.items() if not k.endswith(("_min", "_max"))},
                                                       {k: float(v) for k, v in sums.items() if k.endswith(("_min", "_max"))}, {}, [])
                                for key in LOGGED:
                                    if key in record:
                                        ours[key].append(record[key])
                        loss.backward()
                        losses.append(loss.detach())
                if system == "fastgrpo" and bonus(case):
                    ours["entropy_coef"].append(control.update(*step_sums.tolist()))  # all processes' sums (DDP: all-reduce)
                with torch.no_grad():
                    theta -= LR * theta.grad / P  # DDP: the mean of the processes' gradients
    return theta.detach(), torch.stack(losses), clipped, (stubs[0]._metrics["train"] if system == "trl" else ours)


def bonus(case):
    return case.entropy_coef != 0 or case.adaptive


def step_rows(case, step):
    """The GA micro-batches' row slices of optimizer step `step` (the same on every process)."""
    return [slice((step * case.GA + j) * case.B, (step * case.GA + j + 1) * case.B) for j in range(case.GA)]


def bonus_sums(case, entropy_all, loss_mask, step, peers):
    """(P, 2) each process's Σ H and token count over the tokens the bonus acts on, over the step's micro-batches."""
    sums = torch.zeros(case.num_processes, 2, dtype=F64)
    for j, rows in enumerate(step_rows(case, step)):
        for q in range(case.num_processes):
            mask = loss_mask[q, rows].to(F64)
            if case.top_entropy_quantile < 1:
                mask = high_entropy_mask(entropy_all[q, rows], mask, entropy_threshold(torch.cat(peers[j]), case.top_entropy_quantile))
            sums[q] += torch.stack([(entropy_all[q, rows] * mask).sum(), mask.sum()])
    return sums


def our_advantages(rewards, weights, case):
    """fastgrpo's advantages, each process computing its own share of (num_processes·N, R) rewards.

    A first pass records what each process hands to `gather`; the second pass
    gives every process the concatenation, as accelerate's gather would.
    """
    per_process = rewards.view(case.num_processes, -1, rewards.shape[1])
    sent = []

    def advantages(r, gather):
        return rollout_advantages(r, weights, case.G, case.scale_rewards, case.aggregation, gather)

    for r in per_process:
        advantages(r, lambda mine: sent.append(mine) or mine)
    everyone = torch.cat(sent) if sent else None
    return torch.cat([advantages(r, lambda mine: everyone) for r in per_process])


# Every key TRL's `_compute_loss` logs per micro-batch that fastgrpo logs too (aux_loss: MoE models only).
LOGGED = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
          "clip_ratio/high_max", "cispo_clip_ratio", "vespo/phi_seq_mean")
PER_SEQUENCE = ("grpo", "bnpo", "dr_grpo", "luspo", "sapo")  # TRL divides these by GA after computing policy_loss
ALL = ["grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"]
CLIPPED = ["grpo", "bnpo", "dapo", "dr_grpo", "luspo"]
# The adaptive entropy controller with a target the Bernoulli policy's entropy (≤ ln 2) crosses during the run.
ADAPTIVE = {"adaptive": True, "entropy_coef": 0.1, "entropy_target": 0.6, "entropy_coef_delta": 0.05, "entropy_coef_bounds": (0.0, 0.2)}
CASES = (
    [Case(loss_type=t) for t in ALL]
    + [Case(loss_type=t, num_processes=1, steps_per_generation=2, num_iterations=1) for t in ALL]  # TRL's default shape
    + [Case(loss_type=t, epsilon_high=0.28) for t in CLIPPED]
    + [Case(loss_type="cispo", epsilon_high=1.1)]  # ρ above the bound: TRL's bound is epsilon_high itself, so is fastgrpo's
    + [Case(loss_type=t, delta=1.5, epsilon_high=0.28) for t in CLIPPED]
    + [Case(loss_type=t, level="sequence") for t in CLIPPED + ["cispo", "sapo", "vespo"]]  # TRL warns for cispo and vespo, trains
    + [Case(loss_type=t, beta=0.1, bias_correction=b) for t in ALL for b in (True, False)]
    + [Case(loss_type=t, top_entropy_quantile=0.3) for t in ALL]
    + [Case(loss_type=t, level="sequence", top_entropy_quantile=0.5, beta=0.1) for t in ("grpo", "dapo")]
    + [Case(loss_type=t, mask_truncated=True) for t in ALL]
    + [Case(loss_type=t, scale_rewards=s) for t in ("grpo", "dapo") for s in ("batch", "none")]
    + [Case(loss_type=t, aggregation="normalize_then_sum") for t in ("grpo", "dapo")]
    + [Case(loss_type=t, num_processes=1, GA=3, steps_per_generation=6) for t in ("dapo", "cispo", "vespo")]
    + [Case(loss_type="luspo", level="sequence", top_entropy_quantile=0.5, beta=0.1)]
    + [Case(loss_type="vespo", vespo=(1.5, 2.5, 2.0, 1.0))]
    + [Case(loss_type=t, entropy_coef=0.05) for t in ("grpo", "dapo", "vespo")]
    + [Case(loss_type="luspo", level="sequence", entropy_coef=0.05, top_entropy_quantile=0.3)]
    + [Case(loss_type=t, **ADAPTIVE) for t in ("grpo", "dapo", "luspo")]
    + [Case(loss_type="dapo", top_entropy_quantile=0.5, **{**ADAPTIVE, "entropy_target": 0.67})]  # the top half: higher H
    + [Case(loss_type="dapo", num_processes=1, GA=3, steps_per_generation=6, **ADAPTIVE)]
)


def case_id(case):
    default = Case(loss_type=case.loss_type)
    return "-".join([case.loss_type] + [f"{f.name}={getattr(case, f.name)}" for f in dataclasses.fields(case)
                                        if f.name != "loss_type" and getattr(case, f.name) != getattr(default, f.name)])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_whole_training_equals_trl(case):
    theta_trl, losses_trl, _, logged_trl = train(case, "trl")
    theta_ours, losses_ours, clipped, logged_ours = train(case, "fastgrpo")
    torch.testing.assert_close(losses_ours, losses_trl, rtol=0, atol=1e-6)
    torch.testing.assert_close(theta_ours, theta_trl, rtol=0, atol=1e-6)
    assert set(LOGGED) & set(logged_trl) == set(LOGGED) & set(logged_ours)  # the same keys logged, each as TRL defines it
    for key in ("entropy_coef", "policy_loss", *LOGGED):  # TRL's logged values, step by step
        assert len(logged_ours[key]) == len(logged_trl[key]), key
        torch.testing.assert_close(torch.tensor(logged_ours[key], dtype=F64), torch.tensor(logged_trl[key], dtype=F64), rtol=0, atol=1e-6, msg=key)
    assert not torch.equal(theta_ours, torch.randn(theta_ours.shape, generator=torch.Generator().manual_seed(0), dtype=F64))
    if bonus(case):  # the bonus moved the weights, so its gradient was compared too
        theta_plain = train(dataclasses.replace(case, entropy_coef=0.0, adaptive=False), "fastgrpo")[0]
        assert (theta_ours - theta_plain).abs().max() > 1e-3
    if case.adaptive:  # the coefficient went both ways (the entropy crossed the target)
        moves = torch.tensor(logged_ours["entropy_coef"]).diff()
        assert (moves > 0).any() and (moves < 0).any()
    if case.loss_type in CLIPPED and case.num_iterations > 1:
        assert clipped > 0  # the run left the trust region, so the clip branches were compared too


def test_trl_advantages_equal_ours_and_are_not_trivial():
    # The advantage block alone, for every mode, on 2 processes of 3 groups of 4 with ties and a NaN.
    rewards = torch.rand(24, 2, generator=torch.Generator().manual_seed(1), dtype=F64).round(decimals=1)
    rewards[5, 0] = float("nan")
    rewards[13] = float("nan")  # unscorable: left out of the baselines, Â = 0
    rewards[8:12] = 0.5  # one group with no signal
    weights = torch.tensor([1.0, 2.0], dtype=F64)
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        for scale in ("group", "batch", "none"):
            theirs = trl_advantages(rewards, weights, 4, scale, aggregation)
            ours = our_advantages(rewards, weights, Case(num_processes=2, G=4, aggregation=aggregation, scale_rewards=scale))
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
            assert ours.abs().max() > 0.1


# ---------------------------------------------------------------------------
# documented differences (README, "Differences from TRL"), asserted as differences
# ---------------------------------------------------------------------------


def test_defaults_are_trls_except_the_documented_ones():
    def defaults(cls):
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}

    ours, theirs = defaults(GRPOConfig), defaults(trl.GRPOConfig)
    differ = {name for name in ours if name in theirs and ours[name] != theirs[name]}
    assert differ == {
        "output_dir",  # grpo-output vs TRL's None (→ trainer_output)
        "disable_dropout",  # True: π_old captured from the training forward needs a deterministic policy
        "gradient_checkpointing",  # False: speed first; the default model fits without it
        "num_completions_to_print",  # 4 per log step instead of every completion
        "disable_tqdm",  # False vs None, which transformers resolves to False at the default log level
    }
    assert GRPOConfig().max_completion_length == theirs["max_completion_length"] == 512


def test_disable_dropout_also_turns_off_functional_dropout_unlike_trl():
    # Llama attention applies config.attention_dropout functionally; TRL's helper zeroes
    # nn.Dropout modules only, so two training-mode passes still differ after it.
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import disable_dropout_in_model

    from fastgrpo.model.loading import disable_dropout

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.5)
    ids = torch.arange(12).view(2, 6)
    theirs, ours = LlamaForCausalLM(config).train(), LlamaForCausalLM(config).train()
    disable_dropout_in_model(theirs)
    disable_dropout(ours)
    assert not torch.equal(theirs(ids).logits, theirs(ids).logits)
    assert torch.equal(ours(ids).logits, ours(ids).logits)


def test_rollout_keys_mean_what_trls_mean():
    """reward, reward_std, frac_reward_zero_std, rewards/<fn>/* and completions/* of one rollout against TRL 1.16's own
    formulas (`_generate_and_score_completions`, `nanstd`): an unscorable completion is left out of reward and reward_std,
    reward_std is the batch's std (not a mean of group stds), lengths count the model's tokens, terminated ones apart."""
    from fastgrpo.run.metrics import rollout_metrics
    from fastgrpo.rollout.record import Rollout

    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, float("nan")], [float("nan")] * 2,  # group 0: one unscorable row
                            [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])  # group 1: no spread
    weights = torch.tensor([1.0, 2.0])
    lengths, truncated = [3, 5, 2, 4, 1, 5, 5, 2], [False, True, False, False, False, True, True, False]
    tool = torch.tensor([[1] * n + [0] * (5 - n) for n in lengths])  # model tokens first, then environment tokens
    rollout = Rollout(
        prompt_ids=torch.ones(8, 1, dtype=torch.long), prompt_mask=torch.ones(8, 1, dtype=torch.long),
        completion_ids=torch.ones(8, 5, dtype=torch.long), completion_mask=torch.ones(8, 5, dtype=torch.long),
        is_truncated=torch.tensor(truncated), rewards=rewards, advantages=torch.zeros(8), prompts=[0] * 8, completions=[0] * 8, tool_mask=tool,
    )
    sums = rollout_metrics(rollout, ["a", "b"], weights, 4)
    record = window_record(1, {k: v for k, v in sums.items() if not k.endswith(("_min", "_max"))},
                           {k: v for k, v in sums.items() if k.endswith(("_min", "_max"))}, {}, ["a", "b"])
    # TRL's lines, on the same tensors
    unscorable = torch.isnan(rewards).all(dim=1)
    total = (rewards * weights).nansum(dim=1)
    total[unscorable] = torch.nan
    group_std = trl_module.nanstd(total.view(-1, 4), dim=1).repeat_interleave(4)
    lengths_t, ended = torch.tensor(lengths).float(), ~torch.tensor(truncated)
    trl = {
        "reward": torch.nanmean(total), "reward_std": trl_module.nanstd(total),
        "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean(),
        "rewards/a/mean": torch.nanmean(rewards[:, 0]), "rewards/a/std": trl_module.nanstd(rewards[:, 0]),
        "rewards/b/mean": torch.nanmean(rewards[:, 1]), "rewards/b/std": trl_module.nanstd(rewards[:, 1]),
        "completions/mean_length": lengths_t.mean(), "completions/min_length": lengths_t.min(), "completions/max_length": lengths_t.max(),
        "completions/clipped_ratio": (~ended).float().mean(), "completions/mean_terminated_length": lengths_t[ended].mean(),
        "completions/min_terminated_length": lengths_t[ended].min(), "completions/max_terminated_length": lengths_t[ended].max(),
    }
    for key, value in trl.items():
        assert record[key] == pytest.approx(float(value), abs=1e-6), key
    # by hand: weighted rewards 1, 1, 1 (group 0, one row unscorable) and 1.5 ×4: mean 9/7; Σ (r − 9/7)² = 3·4/49 + 4·9/196 = 3/7,
    # over n − 1 = 6: std √(1/14); both groups without spread; terminated lengths 3, 2, 4, 1, 2: mean 2.4
    assert record["reward"] == pytest.approx(9 / 7) and record["reward_std"] == pytest.approx(math.sqrt(1 / 14))
    assert record["frac_reward_zero_std"] == 1.0 and record["completions/mean_terminated_length"] == pytest.approx(2.4)
