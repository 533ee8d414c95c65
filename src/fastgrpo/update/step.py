"""One optimizer step: `gradient_accumulation_steps` micro-batches of a rollout through the loss, then clip and step.

Consecutive micro-batches run as one forward/backward while their packed rows fit `update_token_budget`
(`merged_passes`; by default a full-length micro-batch's tokens); micro-batches stay the unit of the batch
semantics and of the callbacks.

`OptimizerStep` is built once per run: the loss parameters are bound from the config then (`LossSettings`,
TRL's field names → `grpo_loss`'s keywords), as are the correction, the entropy bonus and the π_ref
context. A call takes the rollout and which step of the pass it is, and returns what the loop needs:
the mean KL(π_θ‖π_old) (target_kl), π_old as recorded at the rollout's first step (a new tensor; the
frozen rollout is never written), and the step's metric sums.

Not here: the log-prob pass itself (logprobs.py), the loss maths (algo/losses.py), routing the metrics
into the logging window (run/metrics.Window.record, by algo/reductions.EXTREMES).
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import nullcontext
from typing import NamedTuple

import torch

from ..algo.losses import StepCounts, grpo_loss, kl_k3, masked_sum, step_tokens
from ..algo.reductions import accumulate
from ..algo.sampling_correction import behaviour_metrics
from ..model.flops import flops_per_token, mfu, peak_flops
from ..model.loading import decoder_of
from ..model.sharding import full_value
from ..rollout.record import Rollout, micro_batch_rows
from .logprobs import TokenStats


# The default update_token_budget under gradient checkpointing, in full-length micro-batches. A checkpointed pass
# keeps each layer's input (H fp32 values per token) and, in backward, one layer's activations: for SmolLM2 ≈ 74 KB
# per token plus ≈ 29 KB for the layer in backward, against ≈ 940 KB without checkpointing (saved-tensor hooks, an
# 881-token pass), so a pass of four micro-batches keeps less than half of one micro-batch's uncheckpointed.
# Measured on the seed configuration (docs/benchmarks.md, session 12): one micro-batch's budget made checkpointing
# cost ≈ +20 % per step; four, ≈ +4 %, at a peak ≈ 0.5 GiB below the uncheckpointed default's.
CHECKPOINTED_MICRO_BATCHES = 4


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """`grpo_loss`'s keyword arguments from a GRPOConfig, bound once per run (TRL's field → the loss's name)."""

    loss_type: str
    epsilon_low: float
    epsilon_high: float
    delta: float | None
    importance_sampling_level: str
    temperature_pos: float
    temperature_neg: float
    beta: float
    use_bias_correction_kl: bool
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float

    @classmethod
    def from_config(cls, a) -> LossSettings:
        return cls(
            loss_type=a.loss_type, epsilon_low=a.epsilon, epsilon_high=a.epsilon_high, delta=a.delta,
            importance_sampling_level=a.importance_sampling_level, temperature_pos=a.sapo_temperature_pos,
            temperature_neg=a.sapo_temperature_neg, beta=a.beta, use_bias_correction_kl=a.use_bias_correction_kl,
            vespo_k_pos=a.vespo_k_pos, vespo_lambda_pos=a.vespo_lambda_pos, vespo_k_neg=a.vespo_k_neg, vespo_lambda_neg=a.vespo_lambda_neg,
        )


def merged_passes(rollout: Rollout, rows: list[slice], budget: int | None, layout: str = "shared") -> list[list[int]]:
    """An optimizer step's micro-batches grouped into forward/backward passes: consecutive ones merged while they fit.

    Fewer, larger passes do the per-pass work once per pass instead of once per micro-batch (the
    tied embedding's (V, H) gradient, the weight gradients' fp32 accumulation, the LM head's set-up,
    each weight's reorder for the matrix units) and feed the matrix units longer rows (docs/benchmarks.md,
    "Micro-batches merged under a token budget"). The loss is a sum of per-token terms over a normaliser
    fixed for the step (`StepCounts`), so a merged pass gives the gradient of its micro-batches, to float
    summation order.

    Args:
        rollout: the rollout.
        rows: the step's micro-batches, consecutive slices of `rollout`.
        budget: tokens per pass, or None: every micro-batch its own pass.
        layout: how a pass lays its rows out (`LogProbs.layout`), which says what it computes: "shared", a packed
            row with every completion's tokens and each run of identical consecutive prompts once; "packed", each
            row's prompt and completion; "padded", TRL's padded rows, rows × (longest prompt + longest completion).
    Returns:
        Lists of indices into `rows`, in order, each micro-batch once; one above the budget alone is a pass of its own.
    """
    if budget is None:
        return [[j] for j in range(len(rows))]
    prompt_tokens, completion_tokens = rollout.prompt_mask.sum(-1), rollout.completion_mask.sum(-1)  # (B,) each
    opens = torch.ones_like(prompt_tokens, dtype=torch.bool)  # row b's prompt is packed (not the previous row's again)
    if layout == "shared":  # pack()'s test: the same real prompt tokens as the row before (pad positions ignored)
        real = rollout.prompt_ids * rollout.prompt_mask
        opens[1:] = ((real[1:] != real[:-1]) | (rollout.prompt_mask[1:] != rollout.prompt_mask[:-1])).any(-1)

    def tokens(start: int, stop: int) -> int:
        """What a pass over rows start:stop computes (Rollout.select trims its padding columns)."""
        if layout == "padded":
            return (stop - start) * (int(prompt_tokens[start:stop].max()) + max(int(completion_tokens[start:stop].max()), 1))
        opened = opens[start:stop].clone()
        opened[0] = True  # a pass packs its first row's prompt whatever the row before it held
        return int(completion_tokens[start:stop].sum() + (prompt_tokens[start:stop] * opened).sum())

    passes: list[list[int]] = []
    for j, r in enumerate(rows):
        if passes and tokens(rows[passes[-1][0]].start, r.stop) <= budget:
            passes[-1].append(j)
        else:
            passes.append([j])
    return passes


class StepResult(NamedTuple):
    """What one optimizer step gives the loop."""

    kl_old: float  # mean KL(π_θ‖π_old) over this step's tokens on all processes (target_kl's measure)
    old_logps: torch.Tensor | None  # (N, T) the rollout's π_old with this step's rows recorded (capture steps); None: unchanged
    sums: dict  # metric sums of the step's micro-batches (EXTREMES' keys: min/max), tensors; its time and work, floats (`step_budget`)
    grad_norm: torch.Tensor  # the gradient norm before clipping (0-d)


class OptimizerStep:
    """One optimizer step over `gradient_accumulation_steps` micro-batches (module docstring).

    Args:
        args: the GRPOConfig (read once here; max_grad_norm at each step, as Trainer reads it, so a change before train() applies).
        accelerator, model, optimizer, scheduler: as prepared (accelerate's no_sync, backward, clipping).
        log_probs: the policy pass (logprobs.LogProbs).
        router: the router's load-balancing loss (model/experts.RouterAuxLoss): when enabled, each micro-batch's
            loss gains coef · aux_loss / gradient_accumulation_steps and `aux_loss` is logged (TRL 1.16's
            `_compute_loss`: its policy loss is scaled for accumulation, so is the aux loss).
        correction: the sampler–trainer correction (algo/sampling_correction.SamplingCorrection).
        entropy_control: the entropy bonus's coefficient, or None (no bonus).
        reference: () → context yielding π_ref (exact KL only).
        entropy_mask: (entropy (B, T), mask (B, T), threshold) → (B, T) bool, top_entropy_quantile's tokens (TRL's get_high_entropy_mask).
        events: the callbacks (substep_end, pre_optimizer_step, optimizer_step) and their control (should_training_stop).
        timer: phase timer; phase "update".
        bf16: whether the passes' products run in bf16 (else in the model's dtype): the peak FLOP/s `peak_flops` looks up.
    """

    def __init__(self, args, accelerator, model, optimizer, scheduler, *, log_probs, correction, router, entropy_control, reference, entropy_mask, events, timer,
                 bf16: bool):
        self.args, self.accelerator, self.model, self.optimizer, self.scheduler = args, accelerator, model, optimizer, scheduler
        self.log_probs, self.correction, self.entropy_control, self.events, self.timer = log_probs, correction, entropy_control, events, timer
        self.router = router
        self.learning_rate = scheduler.get_last_lr()[0]  # the rate the last optimizer step used: what Trainer logs
        self.loss = LossSettings.from_config(args)
        self.reference = reference if args.beta > 0 and args.kl_estimator == "full" else None
        self.entropy_mask = entropy_mask
        # Merging micro-batches is exact only where no term is normalised per micro-batch: bnpo's token mean, the
        # entropy bonus's mean, top_entropy_quantile's per-micro-batch threshold and the router's mean aux loss are.
        # Several processes would merge differently (their tokens differ) and so run different numbers of
        # forwards, whose FSDP collectives must match: one pass per micro-batch there.
        per_micro_batch = (args.loss_type == "bnpo" or entropy_control is not None or args.top_entropy_quantile < 1 or router.enabled
                           or accelerator.num_processes > 1)
        self.merges = not per_micro_batch  # whether this run's loss and processes allow merged passes
        self.last_end: float | None = None  # when the last optimizer step ended (perf_counter seconds)
        self.layout = log_probs.layout(model)  # what a pass computes, for merged_passes: the model's for the run
        policy = decoder_of(accelerator.unwrap_model(model))
        self.text_config = policy.config.get_text_config()  # its FLOPs per token (TRL's perf/mfu_*)
        dtype = "bfloat16" if bf16 else str(next(policy.parameters()).dtype).removeprefix("torch.")  # TRL's: the mixed precision, else the model's
        self.peak_flops = peak_flops(accelerator.device, dtype)  # None (a CPU, fp32): no MFU, as TRL

    def token_budget(self, rollout: Rollout) -> int | None:
        """Packed tokens per forward/backward pass over `rollout`, or None: one pass per micro-batch (module docstring).

        `update_token_budget`, or by default (None) a full-length micro-batch's tokens, per_device_train_batch_size ×
        (max_prompt_length + max_completion_length), the rollout's longest prompt standing in for an unlimited
        max_prompt_length: a merged pass never holds more tokens than one micro-batch may. Under gradient
        checkpointing four times that (`CHECKPOINTED_MICRO_BATCHES`).
        """
        a = self.args
        if not self.merges or a.update_token_budget == 0:  # 0: one pass per micro-batch
            return None
        if a.update_token_budget is not None:
            return a.update_token_budget
        prompt = a.max_prompt_length if a.max_prompt_length is not None else int(rollout.prompt_mask.sum(-1).max())
        micro_batch = a.per_device_train_batch_size * (prompt + a.max_completion_length)
        return micro_batch * (CHECKPOINTED_MICRO_BATCHES if a.gradient_checkpointing else 1)

    def passes(self, rollout: Rollout, step_in_pass: int) -> list[tuple[slice, int]]:
        """Step `step_in_pass`'s forward/backward passes over `rollout`, in order: (the rollout's rows, how many micro-batches they are).

        The π_old and π_ref passes (passes.py) run these same rows, so every token's log-prob comes from the same
        packed row in each pass: ρ is exactly 1 and the k3 KL exactly 0 where the weights are equal.
        """
        GA = self.args.gradient_accumulation_steps
        rows = micro_batch_rows(len(rollout), self.args.steps_per_generation)[step_in_pass * GA : (step_in_pass + 1) * GA]  # smaller at the cap
        grouped = merged_passes(rollout, rows, self.token_budget(rollout), self.layout)
        return [(slice(rows[g[0]].start, rows[g[-1]].stop), len(g)) for g in grouped]

    def rollout_passes(self, rollout: Rollout) -> list[list[slice]]:
        """The rows of each forward/backward pass of each optimizer step of a pass over `rollout` (`passes`), step by step."""
        steps = self.args.steps_per_generation // self.args.gradient_accumulation_steps
        return [[span for span, _ in self.passes(rollout, s)] for s in range(steps)]

    def __call__(self, rollout: Rollout, step_in_pass: int, capture_old: bool, step: int) -> StepResult | None:
        """Step `step_in_pass` of a pass over `rollout`; `capture_old`: record π_old where unset (the rollout's first step).

        Returns None where `control.should_training_stop` is set at an on_substep_end (a callback set it there, or before
        the run's first step): as transformers' Trainer, which leaves its loop right after that micro-batch, no optimizer
        step is taken (the step's gradients are dropped here; Trainer leaves them unapplied).

        Raises:
            FloatingPointError: a non-finite gradient norm, before the optimizer step applies it (`step`: the step number, for the message).
        """
        a, acc, GA = self.args, self.accelerator, self.args.gradient_accumulation_steps
        passes = self.passes(rollout, step_in_pass)
        counts = StepCounts(self.step_tokens(rollout), sum(span.stop - span.start for span, _ in passes), GA, a.max_completion_length)
        recorded = rollout.old_logps.clone() if capture_old and rollout.old_logps is not None else None
        sums: dict[str, torch.Tensor] = {}
        acc.sync_gradients = True  # accelerate's state is shared: a transformers Trainer left between micro-batches leaves it False (step, zero_grad: no-ops)
        with self.timer("update"):
            self.model.train()
            started, forward_s = time.perf_counter(), 0.0
            for j, (span, micro_batches) in enumerate(passes):
                last = j == len(passes) - 1
                mb = rollout.select(span)
                mask = self.loss_mask(mb)
                with acc.no_sync(self.model) if not last else nullcontext():
                    forward_started = time.perf_counter()
                    stats = self.log_probs(self.model, mb, self.reference)
                    forward_s += time.perf_counter() - forward_started
                    logps, entropy = stats.logps, stats.entropy
                    old = logps.detach() if mb.old_logps is None else mb.old_logps
                    if recorded is not None:  # π_old for free where unset: the policy has not moved yet
                        old = torch.where(torch.isnan(old), logps.detach(), old)
                        recorded[span, : logps.shape[1]] = old
                    weight, mismatch, vespo_ratio = self.correction(mb.advantages, logps.detach(), old, mb.sampling_logps, mask)
                    if a.max_staleness is not None and mb.sampling_logps is not None:  # TRL AsyncGRPOTrainer's ratio and kl
                        mismatch = {**mismatch, **behaviour_metrics(logps.detach(), mb.sampling_logps, mask)}
                    out = grpo_loss(
                        logps, old, mb.advantages, mask, counts, **dataclasses.asdict(self.loss),
                        per_token_kl=self.kl(stats, mb) if a.beta > 0 else None, policy_mask=self.policy_mask(entropy.detach(), mask),
                        policy_weight=weight, vespo_ratio=vespo_ratio, entropy=entropy if self.entropy_control else None,
                        entropy_coef=self.entropy_control.applied() if self.entropy_control else 0.0,
                    )
                    loss, aux = out.loss, {}
                    if self.router.enabled:  # TRL: loss + coef · aux_loss / GA; `loss` is logged with it, as TRL's is
                        loss = loss + self.router.coef * stats.aux_loss / GA
                        aux = {"aux_loss": stats.aux_loss.detach().float(), "aux_micro_batches": torch.ones((), device=loss.device)}
                    acc.backward(loss)
                packing = {"padded_tokens": stats.padded_tokens, "real_tokens": stats.real_tokens, "packed_tokens": stats.packed_tokens}
                accumulate(sums, {**out.metrics, "loss": loss.detach(), "entropy": masked_sum(entropy.detach(), mask), **packing, **mismatch, **aux})
                for _ in range(micro_batches - last):  # TRL's on_substep_end: once per micro-batch but the step's last
                    self.events.substep_end()
                    if self.events.control.should_training_stop:  # Trainer leaves its loop there: the step is never taken
                        self.optimizer.zero_grad(set_to_none=True)
                        return None
            forward_backward_s = time.perf_counter() - started
            clip = a.max_grad_norm if a.max_grad_norm > 0 else math.inf  # 0: no clip
            grad_norm = full_value(acc.clip_grad_norm_(self.model.parameters(), clip))
            if not torch.isfinite(grad_norm):  # before optimizer.step: the weights and every checkpoint stay finite
                raise FloatingPointError(
                    f"step {step + 1}: the gradient norm is {float(grad_norm)} (loss {float(sums['loss'])}); the weights "
                    "were not updated. Lower learning_rate, or check the model's weights and the rewards for inf/NaN."
                )
            self.events.pre_optimizer_step()
            optimizer_started = time.perf_counter()
            self.optimizer.step()
            optimizer_s = time.perf_counter() - optimizer_started
            self.events.optimizer_step()
            self.learning_rate = self.scheduler.get_last_lr()[0]  # before the schedule moves on, as Trainer reads it
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        ended = time.perf_counter()
        sums.update(self.step_budget(passes, forward_s, forward_backward_s, optimizer_s, ended, sums))
        self.last_end = ended
        kl_old = torch.stack([sums["kl_old"], sums["tokens"]])
        if acc.num_processes > 1:  # a token mean over all processes: the same target_kl decision on each
            kl_old = acc.reduce(kl_old, reduction="sum")
        return StepResult(float(kl_old[0] / kl_old[1].clamp(min=1)), recorded, sums, grad_norm)

    def step_budget(self, passes: list[tuple[slice, int]], forward_s: float, forward_backward_s: float, optimizer_s: float,
                    ended: float, sums: dict) -> dict[str, float]:
        """The step's time and work, as sums for the window (run/overlap_metrics.py logs them, TRL's async keys): its
        forward and forward + backward seconds, optimizer.step's, the seconds since the last step's end with the tokens
        they covered (none at the first step this object runs), its micro-batches and completions; where the device has a
        peak (`peak_flops`), its MFU in percent over each of the two spans (TRL's per-step `perf/mfu_fwd_bwd`,
        `perf/mfu_wall_clock`: the forwarded tokens × `flops_per_token` at the step's forwarded tokens per completion)."""
        samples, packed = float(sum(span.stop - span.start for span, _ in passes)), float(sums["packed_tokens"])
        budget = {"step_fwd_s": forward_s, "step_fwd_bwd_s": forward_backward_s, "step_optimizer_s": optimizer_s,
                  "micro_batches": float(sum(n for _, n in passes)), "samples": samples}
        flops = flops_per_token(self.text_config, int(packed / samples)) * packed if self.peak_flops is not None and packed > 0 else None
        if flops is not None:
            budget["step_mfu_fwd_bwd"] = mfu(flops, forward_backward_s, self.peak_flops)
        if self.last_end is not None:
            budget.update(step_gap_s=ended - self.last_end, step_gaps=1.0, gap_packed_tokens=packed, gap_tokens=float(sums["tokens"]))
            if flops is not None:
                budget["gap_mfu"] = mfu(flops, ended - self.last_end, self.peak_flops)
        return budget

    @torch.no_grad()
    def eval_loss(self, rollout: Rollout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """TRL's eval-mode loss of one eval batch (0-d) and its metric sums: `_compute_loss` with π_old = π_θ detached
        (ρ = 1), no accumulation. The sums are the training step's (the policy's entropy, clip fractions, β's KL, over
        the batch's loss tokens; `grpo_loss`'s keys) but kl_old, which is 0 here by construction.

        `rollout` is the whole batch as one micro-batch (TRL's eval batch of per_device_eval_batch_size completions),
        with its Â (and π_ref's log-probs for the k3 KL). The loss terms are the training ones: the objective at ρ = 1
        (−Â per token, clipped alike), β·KL, the sampler correction, the entropy bonus and the router's aux loss at
        weight coef (no 1/GA). Normalisers: dapo/cispo/vespo divide by this batch's loss tokens on this process
        (TRL: the batch's tokens on all processes / world size — equal on one process).
        """
        a, was_training = self.args, self.model.training
        self.model.eval()
        try:
            mask = self.loss_mask(rollout)
            stats = self.log_probs(self.model, rollout, self.reference)
            logps = stats.logps
            counts = StepCounts(float(mask.sum()), len(rollout), 1, a.max_completion_length)
            weight, _, vespo_ratio = self.correction(rollout.advantages, logps, logps, rollout.sampling_logps, mask)
            out = grpo_loss(
                logps, logps, rollout.advantages, mask, counts, **dataclasses.asdict(self.loss),
                per_token_kl=self.kl(stats, rollout) if a.beta > 0 else None, policy_mask=self.policy_mask(stats.entropy, mask),
                policy_weight=weight, vespo_ratio=vespo_ratio, entropy=stats.entropy if self.entropy_control else None,
                entropy_coef=self.entropy_control.applied() if self.entropy_control else 0.0,
            )
        finally:
            self.model.train(was_training)
        metrics = {k: v for k, v in out.metrics.items() if k != "kl_old"} | {"entropy": masked_sum(stats.entropy.detach(), mask)}
        return (out.loss + self.router.coef * stats.aux_loss if self.router.enabled else out.loss), metrics

    def loss_mask(self, mb: Rollout) -> torch.Tensor:
        """Completion tokens that carry loss; none for truncated ones when mask_truncated_completions (DAPO)."""
        mask = mb.model_mask().float()  # tool/environment tokens never carry loss
        if self.args.mask_truncated_completions:
            mask = mask * (~mb.is_truncated).float().unsqueeze(-1)
        return mask

    def step_tokens(self, rollout: Rollout) -> float:
        """dapo/cispo normaliser: the rollout's loss tokens on all processes, per process and optimizer step (TRL's)."""
        acc, a = self.accelerator, self.args
        tokens = self.loss_mask(rollout).sum()
        if acc.num_processes > 1:
            tokens = acc.reduce(tokens, reduction="sum")
        return step_tokens(float(tokens), acc.num_processes, a.steps_per_generation // a.gradient_accumulation_steps)

    def policy_mask(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """top_entropy_quantile's policy tokens as a float mask, or None when every token carries the loss."""
        if self.args.top_entropy_quantile >= 1.0:
            return None
        return self.entropy_mask(entropy, mask, 1 - self.args.top_entropy_quantile).float()

    def kl(self, stats: TokenStats, mb: Rollout) -> torch.Tensor:
        """Per-token KL(π_θ‖π_ref): k3 from stored log π_ref, or exact over the vocabulary (computed in the policy pass)."""
        return kl_k3(stats.logps, mb.ref_logps) if self.args.kl_estimator == "k3" else stats.kl
