"""What the trainer saves: checkpoints (also after Ctrl-C), resuming a run from one, and the final model.

- `save`: checkpoint-<step> with the weights, the optimizer and scheduler, the data order, the step counters (and
  whether on_epoch_end of the epoch that step ended is still to come), π_ref when `sync_ref_model` moves it, the
  entropy bonus's coefficient (adaptive), each process's rollout while μ passes over it remain, its logging window
  (the metric sums and completions trained on but not yet logged), dynamic sampling's carry-over buffer and, with the
  overlap (max_staleness), the data order after the last rollout trained (rollouts in flight are sampled again on
  resume) and the weight version; then TRL's model card (output_dir/README.md, unless a README.md there is not a card:
  `card_is_replaceable`) and the callbacks' on_save.
- `stop_interrupted`: after Ctrl-C, that step's checkpoint (unless just
  written) and `TrainingInterrupted` saying how to resume.
- `resume`: a new run claims output_dir; a resumed one loads the state back,
  applies the settings that changed, cuts the logs back to its step and takes
  back the unlogged window, so whatever stops the run (Ctrl-C, a crash, a
  callback) and wherever it resumes, every optimizer step and every completion
  trained on reaches metrics.jsonl / completions.jsonl exactly once; the completions/*.parquet tables
  of later steps are removed, and the latest generation batch they are written from rides along.
- `save_model`: the policy (or its adapters, or both merged) and tokenizer,
  loadable with `from_pretrained` (`GRPOTrainer.save_model`).
- `finish`: after train()'s summary, the best checkpoint's weights back into the policy with
  `load_best_model_at_end` (`load_best`), and with `save_total_limit=1` the best checkpoint kept alone.

A checkpoint is the trainer's state, so the first three take the trainer (`Checkpointed`):
`save` reads, and `resume` sets, its step, target_kl_stops, run_id, order,
optimizer, scheduler, ref_model and entropy_control.

Not here: the files and their checks (run/checkpoint_files.py), the new-run rule and
which config changes a resume accepts (runs.py), catching Ctrl-C (interrupt.py).
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any, Protocol

import torch
import yaml
from accelerate.utils import broadcast_object_list
from huggingface_hub import metadata_load
from safetensors.torch import load_file

from . import checkpoint_files as ckpt
from . import completion_tables, runs
from .interrupt import TrainingInterrupted
from .metrics import Window
from ..model.adapters import adapter_file, merged_copy
from ..model.loading import is_peft_model
from ..rollout.record import Rollout
from ..model.sharding import full_state_dict, is_sharded


class Checkpointed(Protocol):
    """What a checkpoint reads from and restores into a trainer (`GRPOTrainer` has it all; this module never imports it)."""

    args: Any
    accelerator: Any
    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    optimizer_from_args: bool  # built from args (optim, learning_rate, …), not the caller's `optimizers`
    order: Any
    ref_model: Any
    events: Any
    state: Any
    log: Any
    console: Any
    window: Any
    fresh_completions: list
    completion_tables: Any  # run/completion_tables.CompletionTables on the main process with log_completions, else None
    loss_sum: float
    step: int
    max_steps: int
    args_at_build: Any  # runs.ArgsAtBuild: the config's values when the trainer was built
    check_live_args: Any  # run/trainer_attributes.TRLAttributes.check_live_args: runs.LIVE_FIELDS checked on their values now
    clock: Any  # run/epochs.EpochClock: state.epoch from the data drawn
    timer: Any  # run/metrics.PhaseTimer: the phases' seconds since the last log
    target_kl_stops: int
    run_id: str
    weight_version: int  # weight pushes so far (TRL's model_version; the overlap's staleness counts them)
    synced_step: int  # the step the generation backend's weight copy is from (the trainer's `_sync_weights` pushes when it is behind)
    epoch_end_pending: bool  # this step ended an epoch whose on_epoch_end (its log/evaluate/save) has not run yet
    update: Any  # update/step.OptimizerStep: its learning_rate is the rate the last step used, which a record logs
    metrics_log: Any  # run/metrics.MetricsLog on the main process, else None
    setup: dict  # reward functions, tools, environments, rollout_func by name (runs.run_setup)
    create_model_card: Any  # TRL's method (trl_methods.py): README.md in output_dir
    save_model: Any  # Trainer's method (trl_methods.py); a subclass's override is called for each checkpoint too


def save(trainer: Checkpointed, rollout: Rollout, done: int) -> str:
    """Write checkpoint-<step> (every process calls it; a subclass's `save_model` into it too, as Trainer._save_checkpoint
    calls it), then the callbacks' on_save.

    Args:
        trainer: the trainer whose state is saved.
        rollout: this process's rollout in use; kept when `done` < steps_per_rollout.
        done: optimizer steps already taken on `rollout`.
    Returns:
        The checkpoint's path.
    Raises:
        CheckpointWriteError: see checkpoint.save_checkpoint.
    """
    a = trainer.args
    if trainer.metrics_log is not None:  # the previous run's files go before this run's first checkpoint (runs.PreviousRun)
        trainer.metrics_log.previous_run.remove()
    trainer.accelerator.wait_for_everyone()
    state = {
        "step": trainer.step, "scheduler": trainer.scheduler.state_dict(),
        "optimizer": None if is_sharded(trainer.model) else trainer.optimizer.state_dict(),  # sharded: with the weights' shards
        "order": trainer.rollouts.handed_order, "epoch_clock": trainer.clock.state_dict(), "target_kl_stops": trainer.target_kl_stops, "done": done,
        "ref_model": trainer.ref_model.state_dict() if a.sync_ref_model else None, "config": a.to_dict(), "loss_sum": trainer.loss_sum,
        "weight_version": trainer.weight_version, "setup": trainer.setup, "epoch_end_pending": trainer.epoch_end_pending,
        "learning_rate": trainer.update.learning_rate,  # the last step's: the scheduler has moved on, and a record logged at resume reads it
        "entropy_control": trainer.entropy_control.state_dict() if trainer.entropy_control else None,
        "log_sizes": trainer.metrics_log.sizes() if trainer.metrics_log is not None else None,  # the main process writes this state
        "completion_tables": trainer.completion_tables.state_dict() if trainer.completion_tables is not None else None,  # the latest batch
    }
    # this process's share of the rollout, of what was trained since the last log, and dynamic sampling's carry-over
    own = {
        "rollout": rollout if done < a.steps_per_rollout else None, "window": trainer.window, "completions": trainer.fresh_completions,
        "producer": trainer.rollouts.state_dict(),
    }
    acc = trainer.accelerator
    subclass_saves = any("save_model" in vars(c) for c in type(trainer).__mro__ if not c.__module__.startswith("fastgrpo."))
    path = ckpt.save_checkpoint(a.output_dir, trainer.step, acc, trainer.model, trainer.tokenizer, a, state, own, trainer.run_id, trainer.optimizer,
                                write_more=(lambda folder: trainer.save_model(folder, _internal_call=True)) if subclass_saves else None)
    # TRL's _save_checkpoint writes the model card: output_dir/README.md, named after hub_model_id or the folder (here
    # after the checkpoint, so a full disk is reported as the checkpoint's failure; before on_save, as TRL's)
    if card_is_replaceable(a.output_dir):
        trainer.create_model_card(model_name=(a.hub_model_id or os.path.basename(os.path.abspath(a.output_dir))).split("/")[-1])
    acc.wait_for_everyone()  # the main process has renamed it into place: every process sees it, as Trainer's barrier before naming the best
    trainer.events.save(path)  # names the best checkpoint before pruning, as Trainer._save_checkpoint does
    if acc.is_main_process:
        ckpt.prune(a.output_dir, a.save_total_limit, trainer.run_id, trainer.state.best_model_checkpoint, latest=path)
    acc.wait_for_everyone()
    return path


def card_is_replaceable(output_dir: str) -> bool:
    """Whether a checkpoint may write the model card over output_dir/README.md: there is none, or it is a model card a
    trainer wrote (its metadata tags "fastgrpo", or TRL's "trl"). TRL overwrites any README.md there; fastgrpo keeps
    one it did not write (`output_dir="."` in a project would lose the project's README).

    Warns:
        UserWarning: a README.md kept, naming it and `create_model_card()`, which replaces it when asked.
    """
    path = os.path.join(output_dir, "README.md")
    if not os.path.exists(path):
        return True
    try:
        tags = (metadata_load(path) or {}).get("tags") or []
    except yaml.YAMLError:  # front matter that is not YAML: not a card
        tags = []
    if "fastgrpo" in tags or "trl" in tags:
        return True
    warnings.warn(f"{path} is not a model card a trainer wrote, so checkpoints leave it as it is (TRL's would overwrite it); "
                  "call trainer.create_model_card() to replace it with the run's card.", stacklevel=3)
    return False


def finish(trainer: Checkpointed) -> None:
    """What transformers' `Trainer._finalize_training` does after logging train()'s summary, before on_train_end (the
    trainer calls it there, on every process): the best checkpoint's weights loaded (`load_best`), then with
    save_total_limit=1 the best checkpoint kept alone (not after a call that trained no step, a resume of a finished run: it
    saved nothing, so what its run kept stays). A run that wrote nothing (no log, no checkpoint) still replaces the
    previous run it took over here.

    Raises:
        CorruptCheckpointError, ValueError: see `load_best`.
    """
    if trainer.metrics_log is not None:
        trainer.metrics_log.previous_run.remove()
    load_best(trainer)
    if trainer.accelerator.is_main_process and trainer.step > trainer.events.initial_step:  # a call that trained no step saved nothing
        ckpt.prune(trainer.args.output_dir, trainer.args.save_total_limit, trainer.run_id, trainer.state.best_model_checkpoint, at_end=True)


def load_best(trainer: Checkpointed) -> None:
    """With `load_best_model_at_end` and a best checkpoint (`state.best_model_checkpoint`): its model weights into the
    policy, as transformers' `Trainer._load_best_model` (the whole model's, a peft model's adapters as its
    `load_adapter`, an FSDP model's shards; never the optimizer, π_ref or the data position). The generation backend's
    weight copy (bf16, vLLM) is then behind, so its next use (`evaluate()`, more training) pushes these weights, as after
    a resume. Every process loads it (each holds the model or its shards).

    Raises:
        CorruptCheckpointError: the checkpoint changed since it was saved (`checkpoint_files.read_manifest`).
        ValueError: its weights do not fit the policy (`checkpoint_files.apply_weights`).
    """
    path, a = trainer.state.best_model_checkpoint, trainer.args
    if not a.load_best_model_at_end or path is None:
        return
    files = ckpt.read_manifest(path)["files"]
    policy = trainer.accelerator.unwrap_model(trainer.model)
    name = adapter_file(policy) if is_peft_model(policy) else "model.safetensors"
    if ckpt.SHARDS_METADATA not in files and name not in files:
        raise ValueError(f"the best checkpoint {path!r} holds no {name} (load_best_model_at_end=True); it was not saved by this run's model.")
    ckpt.apply_weights(path, policy, None if ckpt.SHARDS_METADATA in files else load_file(os.path.join(path, name)))
    trainer.synced_step = trainer.step - a.weight_sync_steps  # the backend's copy holds the last step's weights: the next use pushes
    if trainer.accelerator.is_main_process:
        trainer.console.print(f"loaded the best model, {path} ({a.metric_for_best_model} {trainer.state.best_metric:g}; "
                              "load_best_model_at_end=True)", markup=False, soft_wrap=True)


def stop_interrupted(trainer: Checkpointed, rollout: Rollout, done: int) -> None:
    """After Ctrl-C: save this step's checkpoint (unless just saved) and stop.

    A new run under overwrite_output_dir that has written nothing yet saves nothing: Ctrl-C that early is how a
    mistaken command is stopped, and saving would replace the previous run (runs.PreviousRun) with one step.

    Raises:
        TrainingInterrupted: always, naming the step, the checkpoint and how to resume (or that nothing was saved).
    """
    replacing = [bool(trainer.metrics_log is not None and trainer.metrics_log.previous_run.names)]
    broadcast_object_list(replacing)  # the main process knows; every process stops the same way
    if replacing[0]:
        raise TrainingInterrupted(
            f"interrupted at step {trainer.step}/{trainer.max_steps}, before this run wrote anything: nothing was saved and the "
            f"previous run in {trainer.args.output_dir} was left as it was."
        )
    path = os.path.join(trainer.args.output_dir, f"{ckpt.PREFIX}{trainer.step}")
    if path not in ckpt.checkpoints(trainer.args.output_dir, trainer.run_id):
        path = save(trainer, rollout, done)
    raise TrainingInterrupted(
        f"interrupted at step {trainer.step}/{trainer.max_steps}; saved {path}. Resume with "
        "trainer.train(resume_from_checkpoint=True), or the same fastgrpo train command plus --resume."
    )


def resume(trainer: Checkpointed, resume_from_checkpoint) -> tuple[Rollout | None, int]:
    """Start a new run (claiming output_dir) or resume a checkpoint: state, changed settings, logs cut back.

    Args:
        trainer: the trainer to restore.
        resume_from_checkpoint: None/False (a new run), True (the latest checkpoint that loads) or a checkpoint path, as `Trainer.train` takes it.
    Returns:
        (rollout, done): the saved rollout (None when saved at a window's end or resumed on another number of processes) and its
        optimizer steps taken; (None, 0) for a new run, whose data order starts afresh (a train() that failed before its first step drew some).
        A checkpoint at max_steps (a finished run) leaves output_dir's logs and completion tables as they are, and its unlogged
        window and completions buffer unrestored: nothing trains, so nothing is logged or written again (Trainer's resume there).
    Warns:
        UserWarning: resumed from a given checkpoint while output_dir holds later ones (the branch left: `--resume` would pick the highest
            step until this run replaces it); resumed with other reward functions, tools, environments or rollout_func than the saved run's.
    Raises:
        ValueError: a new run in an output_dir holding another run (runs.claim_output_dir);
            a changed `runs.STATE_FIELDS` field; see checkpoint.load_checkpoint; an `args` field changed since the trainer was
            built that it read then (runs.ArgsAtBuild.check), or a live one whose value now cannot apply (the trainer's
            check_live_args); a new run (no resume) on a trainer that has already trained
            (Trainer would start over at step 0 from the trained weights; fastgrpo refuses before output_dir is touched).
        CorruptCheckpointError: see checkpoint.load_checkpoint.
    """
    a, acc = trainer.args, trainer.accelerator
    trainer.args_at_build.check(a, trainer.max_steps)  # a field changed after __init__ that it read (runs.ArgsAtBuild)
    trainer.check_live_args()  # the fields it reads where it uses them, checked on their values now
    if trainer.step and not resume_from_checkpoint:  # Trainer would start over at step 0 from the trained weights
        kept = ckpt.checkpoints(a.output_dir, trainer.run_id)
        go_on = f"call train(resume_from_checkpoint=True) to go on from {kept[-1]}, or " if kept else "no checkpoint of it was saved: "
        raise ValueError(f"this trainer has already trained to step {trainer.step}/{trainer.max_steps}: {go_on}build a new GRPOTrainer "
                         f"to start a new run (nothing in {a.output_dir!r} was touched).")
    path, state = ckpt.load_checkpoint(resume_from_checkpoint, a.output_dir, acc, trainer.model, trainer.optimizer)
    trainer.events.new_state()  # as Trainer's train(): a pre-train evaluate()'s record is not in log_history
    if path is None:  # a train() that failed before its first step drew prompts: start afresh, as Trainer's new dataloader
        trainer.order.load_state_dict({"epoch": 0, "position": 0})
        trainer.clock.load_state_dict(None, trainer.order.state_dict())
        trainer.window, trainer.fresh_completions, _ = Window(), [], trainer.timer.pop()  # and its rollout's metrics
        if trainer.metrics_log is not None:  # the main process: what it replaces goes at this run's first write (runs.PreviousRun)
            trainer.metrics_log.previous_run = runs.PreviousRun(a.output_dir, runs.claim_output_dir(a.output_dir, a.overwrite_output_dir), trainer.console)
        acc.wait_for_everyone()
        return None, 0
    changed = runs.config_changes(state["config"], a.to_dict())  # refuses a change to the saved state's meaning
    trainer.events.resume(path)
    if state["optimizer"] is not None:  # None: a sharded checkpoint, loaded with the weights
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.optimizer_from_args:  # a caller's optimizer and scheduler resume with their own saved settings (Trainer's)
        runs.apply_optimizer_settings(trainer.optimizer, trainer.scheduler, a)
    trainer.order.load_state_dict(state["order"])
    trainer.step, trainer.target_kl_stops, trainer.run_id = state["step"], state["target_kl_stops"], state["run_id"]
    trainer.loss_sum, trainer.weight_version = state.get("loss_sum", 0.0), state.get("weight_version", 0)
    # At max_steps (a finished run) nothing trains: its epoch ended, its logs and tables stay as they are (the window it logged at
    # its end is not logged again, the completions buffer not printed or written again) and train() writes nothing (Trainer's).
    finished = trainer.step >= trainer.max_steps
    trainer.epoch_end_pending = state.get("epoch_end_pending", False) and not finished  # saved at on_step_end of an epoch's last step: train() ends it first
    trainer.update.learning_rate = state.get("learning_rate", trainer.update.learning_rate)
    if "window" in state and not finished:  # the unlogged steps and completions up to this checkpoint (absent on another number of processes)
        trainer.window, trainer.fresh_completions = state["window"], state["completions"]
    elif "window" in state:  # a finished run logged it at its end: its loss still counts in train()'s train_loss, as it did then
        trainer.loss_sum += state["window"].reduce(acc)[0].get("loss", 0.0) / acc.num_processes
    if state["ref_model"] is not None:
        trainer.ref_model.load_state_dict(state["ref_model"])
    if state.get("entropy_control") and trainer.entropy_control:  # the adaptive coefficient where it was (TRL restores it too)
        trainer.entropy_control.load_state_dict(state["entropy_control"])
    if trainer.completion_tables is not None and state.get("completion_tables") and not finished:  # absent from checkpoints before the tables
        trainer.completion_tables.load_state_dict(state["completion_tables"])
    if trainer.metrics_log is not None:
        if not finished:  # what the logs and tables hold after the checkpoint's step: the abandoned branch's, replaced as it trains
            trainer.metrics_log.cut_back(trainer.step, state.get("log_sizes"))
            completion_tables.remove_after(a.output_dir, trainer.step)
        trainer.console.print(f"resumed from {path} at step {trainer.step}", markup=False, soft_wrap=True)
        if finished:  # say so, rather than a full progress bar and "done"
            trainer.console.print(f"the run is already at max_steps={trainer.max_steps}: nothing to train; raise max_steps "
                                  f"(--max_steps {2 * trainer.max_steps}) to train on from step {trainer.step}", markup=False, soft_wrap=True)
        if resume_from_checkpoint is not True and not finished and (later := ckpt.later_checkpoints(a.output_dir, trainer.step)):
            names = [os.path.basename(p) for p in later]
            warnings.warn(
                f"resumed from step {trainer.step}, but {a.output_dir!r} also holds the later {', '.join(names)}: this run replaces "
                f"each when it saves that step, and until then resume_from_checkpoint=True (`--resume`) picks {names[-1]}; "
                f"move them out of {a.output_dir!r} to keep them apart.", stacklevel=4,
            )
        if other := runs.setup_changes(state.get("setup"), trainer.setup):
            listed = "; ".join(f"{k} {', '.join(old) or 'none'} → {', '.join(new) or 'none'}" for k, old, new in other)
            single = any(k in ("tools", "environment_factory") and old and not new for k, old, new in other)
            warnings.warn(
                f"resumed {path} with other trainer arguments than the run that saved it ({listed}): it trains on with this "
                f"run's{' (without its tools or environments, single-turn)' if single else ''}; pass the saved ones to continue it as it was.",
                stacklevel=4,
            )
        if changed:
            listed = ", ".join(f"{k} {old!r} → {new!r}" for k, old, new in changed)
            trainer.console.print(f"changed since the checkpoint, applied: {listed}", markup=False, soft_wrap=True)
    trainer.rollouts.load_state_dict(state.get("producer"))  # DAPO's carry-over; the overlap's: the order after the last rollout trained
    trainer.clock.load_state_dict(state.get("epoch_clock"), trainer.rollouts.handed_order)
    return state.get("rollout"), state["done"]  # no rollout, no window: resumed on another number of processes


def check_saveable(args) -> None:
    """Refuse a config pickle cannot write, before anything loads: every checkpoint holds it (trainer_state.pt's
    config, training_args.bin) and `save_model` writes it, so a value such as a lambda, a local function, an open
    file or a lock failed the run at its first save, after the compute (transformers' Trainer fails there too).

    Raises:
        ValueError: naming the field, its value, pickle's error and the fix.
    """
    unpicklable = (pickle.PicklingError, TypeError, AttributeError)  # a lambda / local object, a lock or handle
    try:
        pickle.dumps(args)
        return
    except unpicklable as err:
        whole = err
    for name in vars(args):
        try:
            pickle.dumps(getattr(args, name))
        except unpicklable as err:
            whole = f"{name}={getattr(args, name)!r} ({err})"
            break
    raise ValueError(f"the config cannot be saved with the run's checkpoints and model: {whole}; give values pickle can write "
                     "(no lambdas, local functions, open files or locks: a function defined at a module's top level works).")


def save_model(accelerator, model, tokenizer, args, output_dir: str, merge_adapters: bool) -> None:
    """Write the policy (safetensors), tokenizer and `args` (training_args.bin, as Trainer writes it) to `output_dir`;
    the main process writes. Collective only where the weights are sharded (FSDP: every process joins the gather), as
    Trainer.save_model, which has no barrier either: without sharding a subclass may call it on the main process alone
    (Trainer's DDP path is `if should_save: _save(…)`), and the other processes do not wait for the files.

    Args:
        accelerator: gathers the state dict (sharded models) and says which process writes.
        model: the policy as `accelerator.prepare` returned it.
        args: the run's GRPOConfig, pickled with torch.save (`torch.load(path, weights_only=False)` reads it back).
        merge_adapters: with adapters, write the base weights with them merged in
            (`from_pretrained` loads it) instead of the adapters alone
            (`adapter_model.safetensors`, `peft.PeftModel.from_pretrained` loads it).
    Under FSDP the whole model is gathered (rank 0 holds it): a consolidated save.

    Raises:
        ValueError: merge_adapters=True for a policy without adapters, or for a sharded one; an `output_dir`
            that is a file or not writable (runs.check_output_dir), before anything is gathered.
    """
    runs.check_output_dir(output_dir)  # on every process: none may wait at a gather that the main one never reaches
    policy = accelerator.unwrap_model(model)
    if merge_adapters and not is_peft_model(policy):
        raise ValueError("merge_adapters=True but the policy has no adapters; call save_model() without it.")
    if merge_adapters and is_sharded(policy):
        raise ValueError("merge_adapters=True under FSDP: save the adapters (save_model()), then merge them on one process with peft's merge_and_unload().")
    state_dict = full_state_dict(model) if is_sharded(policy) else accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        if merge_adapters:
            merged_copy(policy).save_pretrained(output_dir, safe_serialization=True)
        else:
            policy.save_pretrained(output_dir, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
        torch.save(args, os.path.join(output_dir, ckpt.TRAINING_ARGS_NAME))
        ckpt.make_readable(output_dir)
