"""`GRPOTrainer`: set-up, the GRPO loop with μ passes over each rollout, save/resume, evaluate.

The loop (DESIGN.md) reads top to bottom in `train()`: collect a rollout, then
μ passes over it, one optimizer step per `gradient_accumulation_steps`
micro-batches. accelerate supplies the device, mixed precision, gradient
synchronisation (`no_sync` during accumulation) and multi-process
reductions; the loop itself is ours.

Usage (TRL's API; only the import differs):

    from fastgrpo import GRPOConfig, GRPOTrainer
    trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=fn,
                          args=GRPOConfig(num_iterations=4), train_dataset=ds)
    trainer.train()

Not here: the maths (losses.py), the rollout record (rollout.py), checkpoint
files (checkpoint.py), metric output (metrics.py).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from functools import partial
from typing import NamedTuple

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import get_scheduler

from . import checkpoint as ckpt
from .config import GRPOConfig
from .data import PromptEncoder, PromptOrder, check_dataset, is_conversational
from .generation import TransformersGenerator
from .launch import cpu_launch_error, cpu_only
from .logprobs import LogProbs, TokenStats, fallback_notices
from .losses import (
    StepCounts,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    kl_k3,
    normalize_then_sum,
    weighted_rewards,
)
from .metrics import CompletionRows, MetricsLog, PhaseTimer, Window, rollout_metrics, window_record
from .models import disable_dropout, load_model, load_tokenizer, prepare_tokenizer, reference_model
from .rewards import resolve_reward, reward_name, score
from .rollout import Rollout, collect


class TrainOutput(NamedTuple):
    """What `train()` returns (TRL's fields): optimizer steps done, mean loss, last logged metrics."""

    global_step: int
    training_loss: float
    metrics: dict


class GRPOTrainer:
    """GRPO trainer with TRL's constructor and methods.

    Args:
        model: "smollm2-135m-instruct", a local folder or .gguf file, a hub
            id, or a `PreTrainedModel`.
        reward_funcs: a callable, a built-in reward name, "module:function",
            or a list of them (see rewards.py for the protocol).
        args: `GRPOConfig`; default `GRPOConfig()`.
        train_dataset: rows with a "prompt" column (text or chat messages).
        eval_dataset: optional rows for `evaluate()` (every `eval_steps`).
        processing_class: the tokenizer; default: the model's own.
    Raises:
        ValueError/TypeError: a missing dataset or "prompt" column, reward
            weights that do not match the functions, a world size that does not
            match the config — all before any model is loaded.
    """

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None, eval_dataset=None, processing_class=None):
        self.args = a = args if args is not None else GRPOConfig()
        if train_dataset is None:
            raise ValueError("train_dataset is required: a datasets.Dataset (or list of dicts) with a 'prompt' column.")
        check_dataset(train_dataset)
        if eval_dataset is not None:
            check_dataset(eval_dataset, "eval_dataset")
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_funcs = [resolve_reward(f) for f in funcs]
        self.reward_names = [reward_name(f) for f in self.reward_funcs]
        weights = a.reward_weights if a.reward_weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values for {len(self.reward_funcs)} reward functions; give one weight per function.")

        bf16 = a.bf16 if a.bf16 is not None else bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if (launch_error := cpu_launch_error()) is not None:
            raise ValueError(launch_error)
        # cpu=True without GPUs: only then does accelerate join torchrun's processes into one gloo group.
        self.accelerator = acc = Accelerator(
            cpu=cpu_only(), mixed_precision="bf16" if bf16 else "no", log_with=a.report_to or None, project_dir=a.output_dir
        )
        if a.report_to:  # TensorBoard/W&B through accelerate's trackers, under output_dir
            acc.init_trackers("fastgrpo", config={k: v for k, v in a.to_dict().items() if isinstance(v, (int, float, str, bool))})
        if acc.num_processes != a.world_size:
            raise ValueError(f"GRPOConfig was built for world_size={a.world_size} but {acc.num_processes} processes run; build the config inside the launched script.")
        set_seed(a.seed, device_specific=True)  # each process samples its own completions; PromptOrder has its own seed
        self.console = Console()
        self.reward_weights = torch.tensor(weights, dtype=torch.float32, device=acc.device)

        name = model if isinstance(model, str) else model.config._name_or_path
        with acc.main_process_first():  # a built-in model's first load converts it, once
            self.tokenizer = prepare_tokenizer(processing_class) if processing_class is not None else load_tokenizer(name)
            policy = load_model(model, a.model_init_kwargs)
        if a.disable_dropout:
            disable_dropout(policy)
        if a.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
        self.ref_model = reference_model(policy).to(acc.device) if a.beta > 0 else None
        eos = policy.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_token_ids = sorted(eos | {self.tokenizer.eos_token_id})

        num_rollouts = math.ceil(a.num_train_epochs * len(train_dataset) / a.prompts_per_rollout)
        self.max_steps = a.max_steps if a.max_steps > 0 else num_rollouts * a.steps_per_rollout
        optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad],
            lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_epsilon, weight_decay=a.weight_decay,
        )
        warmup = a.warmup_steps if a.warmup_steps > 0 else math.ceil(a.warmup_ratio * self.max_steps)
        self.scheduler = get_scheduler(a.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=self.max_steps)
        self.model, self.optimizer = acc.prepare(policy, optimizer)
        self.generate = TransformersGenerator(
            acc.unwrap_model(self.model), max_completion_length=a.max_completion_length, eos_token_ids=self.eos_token_ids,
            pad_token_id=self.tokenizer.pad_token_id, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
            min_p=a.min_p, repetition_penalty=a.repetition_penalty,
        )
        self.encode = PromptEncoder(self.tokenizer, a.max_prompt_length)
        self.log_probs = LogProbs(a.temperature, ref_autocast=acc.autocast)  # packed rows, each prompt once per group, chunked LM head
        for note in fallback_notices(policy) if acc.is_main_process else []:
            self.console.print(f"fastgrpo: {note}")
        self.order = PromptOrder(len(train_dataset), a.seed, a.shuffle_dataset)
        # π_old = π_θ detached (no pass) when the policy cannot move between generation and last use.
        self.needs_old_logps = not (a.num_iterations == 1 and a.steps_per_generation == a.gradient_accumulation_steps)
        self.step, self.timer, self.window, self.fresh_completions = 0, PhaseTimer(), Window(), []
        self.target_kl_stops, self.last_metrics, self.loss_sum = 0, {}, 0.0
        self.log = MetricsLog(a.output_dir, acc, self.console) if acc.is_main_process else None

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint=None) -> TrainOutput:
        """Run until `max_steps` optimizer steps are done; resume from a checkpoint if asked (True = latest)."""
        a = self.args
        rollout, done = self._resume(resume_from_checkpoint)
        schedule = [(i, s) for i in range(a.num_iterations) for s in range(a.steps_per_generation // a.gradient_accumulation_steps)]
        with self._progress() as progress:
            while self.step < self.max_steps:
                if rollout is None or done >= a.steps_per_rollout:
                    rollout, done = self._collect(), 0  # generate G completions per prompt, score, Â, π_ref, π_old
                for iteration, step_in_pass in schedule[done:]:  # μ passes over the same rollout
                    kl_old = self._optimizer_step(rollout, step_in_pass, capture_old=(iteration == 0 and step_in_pass == 0))
                    self.step, done = self.step + 1, done + 1
                    stop_reuse = a.target_kl is not None and kl_old > a.target_kl
                    self.target_kl_stops += int(stop_reuse and done < a.steps_per_rollout)
                    done = a.steps_per_rollout if stop_reuse else done
                    self._after_step(rollout, done, progress)
                    if self.step >= self.max_steps or stop_reuse:
                        break
        for tracker in self.accelerator.trackers:  # not end_training(): it ends the process group save_model needs
            tracker.finish()
        return TrainOutput(self.step, self.loss_sum / max(self.step, 1), self.last_metrics)

    # ------------------------------------------------------------------ rollout
    def _collect(self) -> Rollout:
        """One rollout for this process: its share of the next B prompts, whole groups only."""
        a, acc = self.args, self.accelerator
        share = a.prompts_per_rollout // acc.num_processes
        indices = self.order.take(a.prompts_per_rollout)[acc.process_index * share : (acc.process_index + 1) * share]
        rollout = collect(
            [self.train_dataset[i] for i in indices], num_generations=a.num_generations,
            encode=self._encode, generate=self.generate, decode=self._decode,
            score=partial(score, self.reward_funcs), advantages=self._advantages,
            eos_token_ids=self.eos_token_ids, timer=self.timer,
        )
        rollout = dataclasses.replace(rollout, ref_logps=self._ref_logps(rollout), old_logps=self._old_logps(rollout))
        if a.log_completions:
            self.fresh_completions.append(CompletionRows.of(rollout))
        self.window.add("rollouts", 1)
        for key, value in rollout_metrics(rollout, self.reward_names, self.reward_weights, a.num_generations).items():
            (self.window.extreme if key.endswith(("_min", "_max")) else self.window.add)(key, value)
        return rollout

    def _encode(self, prompts):
        ids, mask, truncated = self.encode(prompts)
        return ids.to(self.accelerator.device), mask.to(self.accelerator.device), truncated

    def _decode(self, completion_ids, mask, prompts):
        texts = [self.tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(completion_ids, mask)]
        return [[{"role": "assistant", "content": t}] if is_conversational(p) else t for t, p in zip(texts, prompts)]

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """(N, R) rewards → (N,) Â, groups of G in the shape (num_prompts, G)."""
        a, G = self.args, self.args.num_generations
        rewards = rewards.to(self.reward_weights.device)
        if a.multi_objective_aggregation == "normalize_then_sum":
            return normalize_then_sum(rewards.view(-1, G, rewards.shape[1]), self.reward_weights).view(-1)
        total = weighted_rewards(rewards, self.reward_weights)
        batch_std = self.accelerator.gather(total).std() if a.scale_rewards == "batch" else None  # all processes
        return group_advantages(total.view(-1, G), a.scale_rewards, batch_std).view(-1)

    @torch.no_grad()
    def _old_logps(self, rollout: Rollout) -> torch.Tensor | None:
        """log π_old for the micro-batches first used after the first update; the rest are captured for free."""
        if not self.needs_old_logps:
            return None
        a = self.args
        old = torch.full(rollout.completion_ids.shape, float("nan"), device=rollout.completion_ids.device)
        with self.timer("old_logps"):
            for start in range(a.gradient_accumulation_steps * a.per_device_train_batch_size, len(rollout), a.per_device_train_batch_size):
                rows = slice(start, start + a.per_device_train_batch_size)
                old[rows] = self._logps(self.model, rollout.select(rows)).logps
        return old

    @torch.no_grad()
    def _ref_logps(self, rollout: Rollout) -> torch.Tensor | None:
        """log π_ref per completion token (k3 KL only; the exact KL needs π_ref's logits at update time)."""
        if self.ref_model is None or self.args.kl_estimator != "k3":
            return None
        size = self.args.per_device_train_batch_size
        ref = torch.zeros(rollout.completion_ids.shape, device=rollout.completion_ids.device)
        with self.timer("ref_logps"):
            for start in range(0, len(rollout), size):
                with self.accelerator.autocast():  # π_ref in the policy's precision: KL is 0 where they agree
                    ref[start : start + size] = self._logps(self.ref_model, rollout.select(slice(start, start + size))).logps
        return ref

    def _logps(self, model, mb: Rollout, reference=None) -> TokenStats:
        """Log-probs (B, T), entropy and, given `reference` (a context yielding π_ref), exact KL of the completion tokens at the sampling temperature (logprobs.py)."""
        return self.log_probs(model, mb, reference)

    # ------------------------------------------------------------------ update
    def _optimizer_step(self, rollout: Rollout, step_in_pass: int, capture_old: bool) -> float:
        """One optimizer step over `gradient_accumulation_steps` micro-batches; returns mean KL(π_θ‖π_old)."""
        a, acc, size, GA = self.args, self.accelerator, self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps
        rows = [slice((step_in_pass * GA + j) * size, (step_in_pass * GA + j + 1) * size) for j in range(GA)]
        batches = [rollout.select(r) for r in rows]
        masks = [self._loss_mask(mb) for mb in batches]
        tokens = torch.stack([m.sum() for m in masks]).sum().float()
        if acc.num_processes > 1:  # dapo: the step's tokens on all processes
            tokens = acc.reduce(tokens, reduction="sum")
        counts = StepCounts(float(tokens) / acc.num_processes, GA * size, GA, a.max_completion_length)
        sums: dict[str, torch.Tensor] = {}
        with self.timer("update"):
            self.model.train()
            for j, (mb, mask) in enumerate(zip(batches, masks)):
                with acc.no_sync(self.model) if j < GA - 1 else nullcontext():
                    reference = (lambda: nullcontext(self.ref_model)) if a.beta > 0 and a.kl_estimator == "full" else None
                    stats = self._logps(self.model, mb, reference)
                    logps, entropy = stats.logps, stats.entropy
                    old = logps.detach() if mb.old_logps is None or capture_old else mb.old_logps
                    if capture_old and rollout.old_logps is not None:  # π_old for free: the policy has not moved yet
                        rollout.old_logps[rows[j], : logps.shape[1]] = old
                    out = grpo_loss(
                        logps, old, mb.advantages, mask, counts, loss_type=a.loss_type, epsilon_low=a.epsilon,
                        epsilon_high=a.epsilon_high, delta=a.delta, importance_sampling_level=a.importance_sampling_level,
                        temperature_pos=a.sapo_temperature_pos, temperature_neg=a.sapo_temperature_neg, beta=a.beta,
                        per_token_kl=self._kl(stats, mb) if a.beta > 0 else None,
                        policy_mask=high_entropy_mask(entropy, mask, a.top_entropy_quantile),
                    )
                    acc.backward(out.loss)
                packing = {"padded_tokens": stats.padded_tokens, "real_tokens": stats.real_tokens, "packed_tokens": stats.packed_tokens}
                for key, value in {**out.metrics, "loss": out.loss.detach(), "entropy": (entropy * mask).sum(), **packing}.items():
                    sums[key] = sums.get(key, 0) + value
            grad_norm = acc.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        for key, value in sums.items():
            self.window.add(key, value)
        self.window.add("grad_norm", grad_norm)
        self.window.add("steps", 1)
        kl_old = torch.stack([sums["kl_old"], sums["tokens"]])
        if acc.num_processes > 1:  # a token mean over all processes: the same target_kl decision on each
            kl_old = acc.reduce(kl_old, reduction="sum")
        return float(kl_old[0] / kl_old[1].clamp(min=1))

    def _loss_mask(self, mb: Rollout) -> torch.Tensor:
        """Completion tokens that carry loss; none for truncated ones when mask_truncated_completions (DAPO)."""
        mask = mb.completion_mask.float()
        if self.args.mask_truncated_completions:
            mask = mask * (~mb.is_truncated).float().unsqueeze(-1)
        return mask

    def _kl(self, stats: TokenStats, mb: Rollout) -> torch.Tensor:
        """Per-token KL(π_θ‖π_ref): k3 from stored log π_ref, or exact over the vocabulary (computed in the policy pass)."""
        return kl_k3(stats.logps, mb.ref_logps) if self.args.kl_estimator == "k3" else stats.kl

    # ------------------------------------------------------------------ bookkeeping
    def _after_step(self, rollout: Rollout, done: int, progress) -> None:
        a, every = self.args, lambda x: int(x) if x >= 1 else max(1, math.ceil(x * self.max_steps))
        progress.update(progress.task_ids[0], completed=self.step)
        if a.sync_ref_model and self.step % a.ref_model_sync_steps == 0:  # TR-DPO soft update
            with torch.no_grad():
                for ref, p in zip(self.ref_model.parameters(), self.accelerator.unwrap_model(self.model).parameters()):
                    ref.mul_(1 - a.ref_model_mixup_alpha).add_(p.detach(), alpha=a.ref_model_mixup_alpha)
        if self.step % every(a.logging_steps) == 0 or self.step == self.max_steps:
            self._log()
        if self.eval_dataset is not None and a.eval_steps and self.step % a.eval_steps == 0:
            self.evaluate()
        if self.step % every(a.save_steps) == 0 or self.step == self.max_steps:
            state = {
                "step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "order": self.order.state_dict(), "target_kl_stops": self.target_kl_stops, "done": done,
                "ref_model": self.ref_model.state_dict() if a.sync_ref_model else None, "config": a.to_dict(),
            }
            own = {"rollout": rollout if done < a.steps_per_rollout else None}  # this process's share of the rollout
            ckpt.save_checkpoint(a.output_dir, self.step, self.accelerator, self.model, self.tokenizer, state, a.save_total_limit, own)

    def _log(self) -> None:
        acc = self.accelerator
        sums, extremes = self.window.reduce(acc)
        record = window_record(self.step, sums, extremes, self.timer.pop(), self.reward_names)
        record.update(learning_rate=self.scheduler.get_last_lr()[0], target_kl_stops=self.target_kl_stops)
        self.loss_sum += sums.get("loss", 0.0) / acc.num_processes  # Σ over processes of each one's share
        rows = self.fresh_completions
        if self.args.log_completions and acc.num_processes > 1:
            rows = gather_object(rows)  # every process's completions, in process order
        if self.log is not None:
            self.log.write(record)
            for r in rows:
                self.log.completions(self.step, r, self.reward_names, self.args.num_completions_to_print)
        self.last_metrics, self.window, self.fresh_completions = record, Window(), []

    def _resume(self, resume_from_checkpoint) -> tuple[Rollout | None, int]:
        path = ckpt.resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if path is None:
            if self.log is not None:
                self.log.reset()
            return None, 0
        state = ckpt.load_checkpoint(path, self.accelerator, self.model)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.order.load_state_dict(state["order"])
        self.step, self.target_kl_stops = state["step"], state["target_kl_stops"]
        if state["ref_model"] is not None:
            self.ref_model.load_state_dict(state["ref_model"])
        if self.accelerator.is_main_process:
            self.console.print(f"resumed from {path} at step {self.step}")
        return state.get("rollout"), state["done"]  # no rollout: resumed on another number of processes

    def _progress(self) -> Progress:
        columns = (TextColumn("GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        progress = Progress(*columns, console=self.console, disable=self.args.disable_tqdm or not self.accelerator.is_main_process)
        progress.add_task("train", total=self.max_steps, completed=self.step)
        return progress

    # ------------------------------------------------------------------ public helpers
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean reward of G sampled completions per eval prompt (each process scores its share)."""
        a, acc = self.args, self.accelerator
        rows = [self.eval_dataset[i] for i in range(acc.process_index, len(self.eval_dataset), acc.num_processes)]
        chunk = max(a.per_device_eval_batch_size // a.num_generations, 1)
        window = Window()  # the same keys on every process, even one without eval rows
        for key in ["reward_sum", "completions"] + [f"rewards/{n}_{part}" for n in self.reward_names for part in ("sum", "count")]:
            window.add(key, 0.0)
        for start in range(0, len(rows), chunk):
            rollout = collect(
                rows[start : start + chunk], num_generations=a.num_generations, encode=self._encode, generate=self.generate,
                decode=self._decode, score=partial(score, self.reward_funcs), advantages=lambda r: torch.zeros(len(r)),
                eos_token_ids=self.eos_token_ids, timer=PhaseTimer(),
            )
            values = rollout_metrics(rollout, self.reward_names, self.reward_weights, a.num_generations)
            for key in list(window.sums):
                window.add(key, values[key])
        sums, _ = window.reduce(acc)
        metrics = {"eval_reward": sums["reward_sum"] / max(sums["completions"], 1)}
        for name in self.reward_names:
            metrics[f"eval_rewards/{name}"] = sums[f"rewards/{name}_sum"] / max(sums[f"rewards/{name}_count"], 1)
        if self.log is not None:
            self.log.write({"step": self.step, **metrics})
        return metrics

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the policy (safetensors) and tokenizer to `output_dir` (default args.output_dir); main process writes."""
        output_dir = output_dir or self.args.output_dir
        state_dict = self.accelerator.get_state_dict(self.model)
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(output_dir, state_dict=state_dict, safe_serialization=True)
            self.tokenizer.save_pretrained(output_dir)
        self.accelerator.wait_for_everyone()
