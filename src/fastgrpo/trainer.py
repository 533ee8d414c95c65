"""`GRPOTrainer`: TRL's constructor and methods, and the GRPO loop with μ passes over each rollout.

The loop (docs/design.md) reads top to bottom in `train()`: collect a rollout, then μ passes over it, one optimizer
step per `gradient_accumulation_steps` micro-batches. accelerate supplies the device, gradient synchronisation
(`no_sync` during accumulation) and multi-process reductions; the loop is ours.

Usage (TRL's API; only the import differs):

    from fastgrpo import GRPOConfig, GRPOTrainer
    GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=fn, args=GRPOConfig(num_iterations=4), train_dataset=ds).train()

Not here (docs/design.md has the map): the maths (algo/), generating (generation/), a rollout (rollout/),
log-prob passes and the optimizer step (update/), set-up, checkpoints, evaluation, metrics (run/).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from contextlib import closing

import torch
from accelerate.utils import gather_object
from datasets import IterableDataset
from transformers.trainer_utils import TrainOutput  # what train() returns, as Trainer's: (global_step, training_loss, metrics)
from rich.console import Console

from .algo.entropy_control import EntropyControl
from .algo.sampling_correction import SamplingCorrection
from .config import GRPOConfig
from .generation.build import build_backend, open_engine
from .generation.contract import SamplingSettings
from .model.adapters import reference_of
from .model.loading import sync_reference
from .model.precision import autocast_for
from .rollout.assembly import build_assembly
from .rollout.async_producer import overlapped
from .rollout.producers import build_producer
from .rollout.prompts import PromptEncoder
from .rollout.record import Rollout
from .rollout.reward_models import RewardModel
from .run import checkpoints, failures, reward_hooks, runs
from .run.callbacks import TrainerEvents, scheduled
from .run.completion_tables import CompletionTables
from .run.dataset_kinds import prompt_order
from .run.epochs import EpochClock
from .run.inputs import check_trainer_inputs
from .run.interrupt import StopOnInterrupt
from .run.metrics import CompletionRows, MetricsLog, PhaseTimer, Window, logged_names, rollout_metrics, window_record
from .run.setup import bf16_working_copy, build_accelerator, build_optimization, load_policy, prepare
from .trl_methods import TRLMethods
from .update.logprobs import HEAD_KEEP_BYTES, LogProbs, fallback_notices
from .update.passes import LogProbPasses
from .update.step import OptimizerStep


class GRPOTrainer(TRLMethods):
    """GRPO trainer with TRL's constructor and methods (TRL's public helpers: trl_methods.py).

    Args:
        model: "smollm2-135m-instruct", a local folder or .gguf file, a hub id, a `PreTrainedModel`, or a peft `PeftModel` (its adapters train).
        reward_funcs: a callable, a built-in reward name, "module:function", a sequence-classification reward model
            (instance, local folder or hub id; rollout/reward_models.py), or a list of them (protocol: rollout/rewards.py).
        args: `GRPOConfig`; default `GRPOConfig("<model name>-GRPO")`, as TRL (`run.inputs.default_output_dir`).
        train_dataset: rows with a "prompt" column (text or chat messages): a Dataset, a list of dicts or an IterableDataset (run/dataset_kinds.py).
        eval_dataset: optional rows, or a dict / DatasetDict of them, for `evaluate()` (run as `eval_strategy` says).
        processing_class: the tokenizer; default: the model's own.
        reward_processing_classes: tokenizers of the reward models, one per reward_funcs entry (None for functions) or a single one (TRL's).
        callbacks: a list of `transformers.TrainerCallback` instances or classes (run/callbacks.py).
        optimizers: (optimizer, lr_scheduler), either None (Trainer's): an optimizer over `model`'s parameters; default args.optim's.
        quantization_config: passed to `from_pretrained` when `model` is a name (TRL's; e.g. QLoRA with peft_config).
        peft_config: a `peft.PeftConfig` (e.g. `LoraConfig`, see `model.loading.lora_config`): train adapters only; with
            beta > 0, π_ref is the same model run as it started (adapters disabled), never a second copy.
        tools, environment_factory, rollout_func: agent training, TRL's meanings (rollout/agents/).
    Attributes:
        state: a `transformers.TrainerState` (global_step, log_history, best_metric), as Trainer keeps it.
    Raises:
        ValueError/TypeError: a missing or empty dataset, a missing or empty prompt (naming the row), a column the
            reward protocol reserves, reward weights that do not match the functions, a world size that does not
            match the config, an output_dir that is a file or not writable, a peft_config that is not one or comes
            with a PeftModel or sync_ref_model, args that are not a fastgrpo GRPOConfig, a model or reward of the
            wrong type, no reward function, `optimizers` that cannot drive the model, a subclass overriding a TRL method
            fastgrpo never calls (`compute_loss`, …: run/inputs.check_trainer_class) — all before any model is loaded.
        EngineError, EnvironmentFunctionError: use_vllm=True without vLLM, its server down or serving another model; an environment_factory raised.
    """

    def __init__(
        self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None, eval_dataset=None, processing_class=None,
        reward_processing_classes=None, callbacks=None, optimizers=(None, None), quantization_config=None, peft_config=None, tools=None,
        rollout_func=None, environment_factory=None,
    ):
        checked = check_trainer_inputs(model, reward_funcs, args, train_dataset, eval_dataset, reward_processing_classes, peft_config,
                                       tools, environment_factory, rollout_func, optimizers, quantization_config, callbacks, type(self))
        self.args = a = checked.args
        train_dataset = checked.train_dataset  # TRL's placeholder rows when an environment owns the data
        self._train_dataset, self._eval_dataset, self.eval_sets = train_dataset, eval_dataset, checked.eval_sets  # their properties: trainer_attributes.py
        self._reward_funcs, self.reward_names, self.setup = checked.reward_funcs, checked.reward_names, checked.setup  # setup: runs.run_setup
        self.reward_processing_classes, weights, self.agents = checked.reward_processing_classes, checked.reward_weights, checked.agents  # agents: tools, environments, rollout_func

        acc, bf16 = build_accelerator(a)  # device, process group, seed; bf16 where the hardware is fast at it
        self.accelerator, self.autocast, self.console = acc, autocast_for(acc.device, bf16), Console()  # autocast: around every forward (precision.py)
        self._reward_weights = torch.tensor(weights, dtype=torch.float32, device=acc.device)
        for fn in (f for f in self.reward_funcs if isinstance(f, RewardModel)):
            fn.prepare(acc.device, self.autocast, a.chat_template_kwargs)  # scored in the policy's precision

        server = open_engine(a, model, is_main=acc.is_main_process, bf16=bf16)  # vLLM installed; its server up, serving this model
        self.tokenizer, policy, self.ref_model, self.eos_token_ids, gathered, self.router, vocab_size, room = load_policy(
            model, processing_class, peft_config, a, acc, bf16, checked.check_tokenizer)  # the prompts render, then the model loads

        self.max_steps, optimizer, self.scheduler = build_optimization(a, policy, train_dataset, checked.optimizers)
        self.optimizer_from_args = checked.optimizers[0] is None  # a resume re-applies args' settings only to these (run/checkpoints.py)
        self._model, self._optimizer, self.model_preparation_time = prepare(acc, policy, optimizer)  # Trainer's time: evaluate reports it
        self.flops_per_token = 6.0 * policy.num_parameters(exclude_embeddings=True)  # state.total_flos: transformers' floating_point_ops
        sampling = SamplingSettings.from_config(a, self.eos_token_ids, self.tokenizer.pad_token_id, vocab_size)
        working = bf16_working_copy(a, acc, policy, optimizer, bf16)  # the update's and the own sampler's one bf16 copy, where it applies
        self.backend = build_backend(a, acc.unwrap_model(self.model), sampling, bf16=bf16, gathered=gathered, server=server,
                                     tokenizer=self.tokenizer, seed=a.seed + acc.process_index, working=working)  # one bf16 copy of the weights
        self.encode = PromptEncoder(self.tokenizer, a.max_prompt_length, a.chat_template_kwargs, vocab_size, room)
        self.entropy_control = EntropyControl.from_config(a)  # the entropy bonus's coefficient; None: no bonus
        self.correction = SamplingCorrection.from_config(a, self.backend.owns_weights, rollout_func is not None)  # the sampler–trainer mismatch, TRL's vllm_importance_sampling_*
        self.log_probs = LogProbs(a.temperature, autocast=self.autocast, entropy_grad=self.entropy_control is not None, weights=working, router_aux_loss=self.router.enabled,
                                  head_keep_bytes=0 if a.gradient_checkpointing else HEAD_KEEP_BYTES)
        notify = lambda note: acc.is_main_process and self.console.print(f"fastgrpo: {note}", soft_wrap=True)  # noqa: E731
        producer, self.tokenizer = build_producer(
            a, checked.agents, tokenizer=self.tokenizer, encode=self.encode, backend=self.backend, eos_token_ids=sampling.eos_token_ids,
            device=acc.device, trainer=self, notify=notify)  # single turn, multi-turn with tools/environments, or rollout_func
        for note in fallback_notices(policy) + self.backend.notices():
            notify(note)
        self.streaming = isinstance(train_dataset, IterableDataset)  # rows come in stream order, not by index
        self.order = prompt_order(train_dataset, a)  # the data order: seeded per epoch, or the stream's
        self.needs_old_logps = not (a.num_iterations == 1 and a.steps_per_generation == a.gradient_accumulation_steps)  # else π_old = π_θ detached
        self.step, self.timer, self.window, self.fresh_completions = 0, PhaseTimer(), Window(), []
        self.target_kl_stops, self.last_metrics, self.loss_sum, self.run_id, self.epoch_end_pending = 0, {}, 0.0, uuid.uuid4().hex, False
        self.metrics_log = MetricsLog(a.output_dir, self.console) if acc.is_main_process else None
        self.completion_tables = CompletionTables(a.output_dir, self.reward_names, a.report_to, a.log_unique_prompts, a.generation_batch_size,
                                                  self.console) if a.log_completions and acc.is_main_process else None  # TRL's log() tables
        self.events = TrainerEvents(a, checked.callbacks, self.model, self.tokenizer, self.optimizer, self.scheduler, acc.is_main_process, self.console)
        self.clock = EpochClock(self.order.per_pass, a.steps_per_rollout, self.max_steps)
        self.reward_hooks = reward_hooks.RewardHooks(lambda: self.window, lambda: self.state, lambda: logged_names(self.reward_names, self.last_metrics))  # log_metric, log_extra
        self.reference = lambda: reference_of(self.ref_model, acc.unwrap_model(self.model))  # () → a context yielding the π_ref model
        self.passes = LogProbPasses(self.log_probs, self.reference, a.beta > 0 and a.kl_estimator == "k3", self.timer)
        self.assembly = build_assembly(  # one batch, or DAPO's rounds; Â set once on what trains
            a, acc, draw=self._draw, producer=producer, reward_funcs=self.reward_funcs, reward_names=self.reward_names,
            reward_weights=self.reward_weights, reward_kwargs=self.reward_hooks.kwargs, pop_columns=self.reward_hooks.pop_columns,
            behaviour_logps=lambda r, rows: self.passes.old(acc.unwrap_model(self.model), r, rows), timer=self.timer,  # one process's surplus: no DDP
        )
        self.rollouts = overlapped(a, self.assembly, self.order, lambda: self.weight_version, self.backend)  # max_staleness: made ahead
        self.update = OptimizerStep(
            a, acc, self.model, self.optimizer, self.scheduler, log_probs=self.log_probs, correction=self.correction, router=self.router, bf16=bf16,
            entropy_control=self.entropy_control, reference=self.reference, entropy_mask=self.get_high_entropy_mask, events=self.events, timer=self.timer,
        )
        self.synced_step, self.weight_version = 0, 0  # the step the backend's weights are from, and its pushes so far (TRL's model_version)
        self.args_at_build = runs.ArgsAtBuild(a)  # train() refuses a field changed since that it would ignore

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint=None) -> TrainOutput:
        """Run until `max_steps` optimizer steps are done; resume from a checkpoint if asked (True = latest that loads).

        Raises:
            ValueError: a new run in an output_dir holding another run (unless `overwrite_output_dir`); a resume that changes
                a `runs.STATE_FIELDS` field; a callback's `control.should_evaluate` without an eval_dataset (Trainer's error, there).
            CorruptCheckpointError, CheckpointWriteError: see run/checkpoint_files.py.
            TrainingInterrupted: after Ctrl-C, once this step's checkpoint is saved.
            FloatingPointError: a non-finite gradient norm, before the optimizer step applies it.
        """
        a = self.args
        rollout, done = checkpoints.resume(self, resume_from_checkpoint)
        schedule = [(i, s) for i in range(a.num_iterations) for s in range(a.steps_per_generation // a.gradient_accumulation_steps)]
        self.events.train_begin(self.max_steps, self.step, self.clock(self.step, done), self.order.per_pass, self.get_train_dataloader())
        if a.eval_on_start:  # an eval_dataset is there (check_live_args)
            self.evaluate()
        stop = self.events.control.should_training_stop  # set before the first step: Trainer checks it after a micro-batch (the loop)
        self.events.control.should_training_stop = stop and not self.epoch_end_pending  # resumed at an epoch's last step: its end
        ended = self._epoch_end(rollout, done) if self.epoch_end_pending else bool(self.events.epoch_begin())  # first (no epoch left: no step)
        self.events.control.should_training_stop |= stop
        # by an exception too: the console bar stops, the engine stops (its shared-memory weights go), the producer stops
        with closing(self.events), StopOnInterrupt() as interrupt, closing(self.backend), closing(self.rollouts), \
                failures.name_the_resume(self):  # an error that ends the run names the checkpoint to resume from
            while self.step < self.max_steps and not ended:  # a stop set before the first step: Trainer checks it after a micro-batch
                started = time.perf_counter()  # TRL's step_time: a step's passes, and the sampling of the rollout it starts
                if rollout is None or done >= a.steps_per_rollout:
                    rollout, done = self._collect(), 0  # generate G completions per prompt, score, Â, π_ref, π_old
                for iteration, step_in_pass in schedule[done:]:  # μ passes over the same rollout
                    self.events.step_begin()
                    stepped = self._optimizer_step(rollout, step_in_pass, capture_old=(iteration == 0 and step_in_pass == 0), started=started)
                    if stepped is None:  # a callback stopped training in on_substep_end: no step; the epoch ends, as Trainer's loop
                        self._epoch_end(rollout, done)
                        break
                    kl_old, rollout = stepped
                    self.step, done = self.step + 1, done + 1
                    stop_reuse = a.target_kl is not None and kl_old > a.target_kl
                    self.target_kl_stops += int(stop_reuse and done < a.steps_per_rollout)
                    done = a.steps_per_rollout if stop_reuse else done
                    self._after_step(rollout, done)
                    if self.step < self.max_steps and interrupt.requested(self.accelerator):  # Ctrl-C: save this whole step, stop
                        checkpoints.stop_interrupted(self, rollout, done)
                    if self.step >= self.max_steps or stop_reuse or self.events.control.should_training_stop:
                        break
                    started = time.perf_counter()
                ended = self.events.control.should_training_stop
        pending = self._log(to_callbacks=False) if self.window.sums.get("steps") else {}  # to the summary log, as TRL's log() merges it
        summary = self.events.train_end(self.loss_sum / max(self.step, 1), pending, lambda: checkpoints.finish(self), self.log)  # best model, pruning
        pending.pop("step", None)  # TRL's log() merges the unlogged steps' metrics into Trainer's summary dict, which train() returns
        return TrainOutput(self.step, self.loss_sum / max(self.step, 1), {**pending, **summary})

    # ------------------------------------------------------------------ rollout
    def _collect(self) -> Rollout:
        """One rollout for this process, whole groups only (rollout/assembly.py), with π_ref and the π_old it needs."""
        self._sync_weights()
        rollout, extra, sums = self.rollouts()
        self.clock.drew(self.rollouts.handed_order)
        steps = self.update.rollout_passes(rollout)  # each step's passes: π_old and π_ref run the update's own rows
        old = self.passes.old(self.model, rollout, sum(steps[1:], [])) if self.needs_old_logps or rollout.old_logps is not None else None
        rollout = dataclasses.replace(rollout, ref_logps=self.passes.ref(rollout, sum(steps, [])), old_logps=old)
        if self.args.log_completions:
            self.fresh_completions.append(CompletionRows.of(rollout, extra))
        self.window.add("rollouts", 1)
        self.window.record({**sums, **rollout_metrics(rollout, self.reward_names, self.reward_weights, self.args.num_generations)})
        return rollout

    def _sync_weights(self) -> None:
        """The backend's weights from the policy: at a rollout's start, once weight_sync_steps optimizer steps were taken since the last."""
        if self.step - self.synced_step >= self.args.weight_sync_steps:
            with self.timer("weight_sync"):
                self.backend.update_weights(self.accelerator.unwrap_model(self.model))
            self.synced_step, self.weight_version = self.step, self.weight_version + 1

    def _draw(self, prompts: int) -> list[dict]:
        """This process's `prompts` rows of the next `prompts` × world_size in the data order."""
        acc = self.accelerator
        drawn = self.order.take(prompts * acc.num_processes)[acc.process_index * prompts : (acc.process_index + 1) * prompts]
        return drawn if self.streaming else [self.train_dataset[i] for i in drawn]

    # ------------------------------------------------------------------ update
    def _optimizer_step(self, rollout: Rollout, step_in_pass: int, capture_old: bool, started: float) -> tuple[float, Rollout] | None:
        """One optimizer step (update/step.py); its metrics and seconds since `started` (perf_counter: TRL's step_time) into the
        window; → (mean KL(π_θ‖π_old), the rollout with π_old recorded), or None: stopped in on_substep_end (no step taken)."""
        out = self.update(rollout, step_in_pass, capture_old, self.step)
        if out is None:
            return None
        self.window.record({**out.sums, "grad_norm": out.grad_norm, "steps": 1, "step_time": time.perf_counter() - started})
        if self.entropy_control is not None:  # the next step's coefficient (adaptive: from this step's entropy, all processes)
            self.window.add("entropy_coef", self.entropy_control.step_end(out.sums, self.accelerator))
        return out.kl_old, rollout if out.old_logps is None else dataclasses.replace(rollout, old_logps=out.old_logps)

    # ------------------------------------------------------------------ bookkeeping
    def _after_step(self, rollout: Rollout, done: int) -> None:
        a = self.args
        if a.sync_ref_model and self.step % a.ref_model_sync_steps == 0:  # TR-DPO soft update
            sync_reference(self.ref_model, self.accelerator.unwrap_model(self.model), a.ref_model_mixup_alpha)
        self.epoch_end_pending = self.clock.pass_ended(self.step, done)  # a checkpoint saved at on_step_end: its resume ends the epoch first
        # Trainer's order: on_step_end and its log/evaluate/save, then at an epoch's end (or the run's, or a cut) on_epoch_end and its own.
        self._act(self.events.step_end(self.step, self.clock(self.step, done), *scheduled(a, self.step, self.max_steps, False, self.eval_dataset is not None)), rollout, done)
        if self.events.control.should_epoch_stop and not self.epoch_end_pending:  # a callback ended the pass here (Trainer's check): its rest skipped
            self.epoch_end_pending = self.clock.cut_pass(self.rollouts.next_pass(), self.step)
        if self.epoch_end_pending or self.step >= self.max_steps or self.events.control.should_training_stop:
            self._epoch_end(rollout, done)

    def _epoch_end(self, rollout: Rollout, done: int) -> bool:
        """on_epoch_end and its log/evaluate/save, then on_epoch_begin unless training ends (→ True); also a resume's first event."""
        self.epoch_end_pending, epoch = False, self.clock(self.step, done)
        self._act(self.events.epoch_end(epoch, *scheduled(self.args, self.step, self.max_steps, True, self.eval_dataset is not None, epoch)), rollout, done)
        self.events.control.should_training_stop |= self.clock.passes_over(self.state.num_train_epochs)  # Trainer's epoch loop ends
        ends = self.step >= self.max_steps or self.events.control.should_training_stop
        if not ends:
            self.events.epoch_begin()
        return ends

    def _act(self, control, rollout: Rollout, done: int) -> None:
        """Log, evaluate and save as the control says (callbacks may have added any), in Trainer's order."""
        if control.should_log and self.window.sums.get("steps"):  # Trainer logs a step once
            self._log()
        if control.should_evaluate:  # without an eval_dataset evaluate() raises, as Trainer's; a candidate for the best (Trainer's _determine_best_metric)
            control.should_save = self.events.track_best(self.evaluate(), control.should_save)
        if control.should_save:
            checkpoints.save(self, rollout, done)

    def _log(self, to_callbacks: bool = True) -> dict:
        """Write the window's record (metrics.jsonl, completions.jsonl; its rollouts into TRL's completions buffer) and, unless told
        not to, log() it (on_log, the trackers, the completions table); return it."""
        acc = self.accelerator
        sums, extremes = self.window.reduce(acc)
        record = window_record(self.step, sums, extremes, self.timer.pop(), self.reward_names, overlap=self.args.max_staleness is not None)
        self.state.num_input_tokens_seen += int(sums.get("input_tokens", 0))  # all processes' (TRL's num_tokens: cumulative)
        self.state.total_flos += self.flops_per_token * sums.get("packed_tokens", 0)  # the update's passes, all processes'
        record.update(learning_rate=self.update.learning_rate, target_kl_stops=self.target_kl_stops, num_tokens=float(self.state.num_input_tokens_seen))
        self.loss_sum += sums.get("loss", 0.0) / acc.num_processes  # Σ over processes of each one's share
        rows = gather_object(self.fresh_completions) if self.args.log_completions and acc.num_processes > 1 else self.fresh_completions  # all processes'
        if self.completion_tables is not None:  # TRL's buffer: the latest generation batch, which log() tables (trl_methods.log)
            self.completion_tables.update(rows, acc.num_processes)
        for r in rows if self.metrics_log is not None else []:  # every completion to completions.jsonl
            self.metrics_log.completions(self.step, r, self.reward_names)
        if to_callbacks:  # through Trainer's log(), as TRL's loop: a subclass's override sees the record (it writes metrics.jsonl)
            self.log({k: v for k, v in record.items() if k != "step"})  # Trainer's logs hold no "step" (log() adds it)
        elif self.metrics_log is not None:  # the steps merged into the summary (train_end): to on_log with it
            self.metrics_log.write(record)
        self.last_metrics, self.window, self.fresh_completions = record, Window(), []
        return record
