"""One run per output_dir: the folder check before any model loads, the new-run rule, and what a resume may change.

- `check_output_dir`: the folder can be created and written (not a file, not read-only).
- `claim_output_dir`: a new run refuses a folder that holds another run's
  checkpoints or logs, unless `overwrite_output_dir` (TRL's field), which removes them
  (`PreviousRun`) once the new run first writes.
- `config_changes`: resuming with a changed config; fields that give saved
  state its meaning (`STATE_FIELDS`: batch shapes, G, μ, lengths, loss) are
  refused, the rest are applied and listed in one notice.
- `ArgsAtBuild`: the config's values when the trainer was built; train() refuses a field changed since that the
  trainer read then (its optimizer, schedule, sampler, loss, trackers), where transformers' Trainer reads many at train();
  `LIVE_FIELDS` are read where they are used, so their changes apply.
- `run_setup`/`setup_changes`: the trainer arguments a run trains with (reward
  functions, tools, environments, rollout_func) by name, and the train dataset by its size and ends; a resume with
  others warns.

Not here: writing or reading checkpoint files (run/checkpoint_files.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import warnings

from . import completion_tables
from .checkpoint_files import checkpoints, written_by_fastgrpo

LOGS = ("metrics.jsonl", "completions.jsonl")
TABLES = completion_tables.FOLDER  # log_completions' completions/*.parquet: a run's log once it holds a table (the trainer makes it empty)

# A saved rollout, optimizer step count and data position only mean the same thing under these values.
# Per-process sizes, not generation_batch_size: that one also scales with the number of processes, and a
# resume on another number of processes is allowed (it generates a new rollout; checkpoint.load_checkpoint).
STATE_FIELDS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations",
    "num_iterations", "max_prompt_length", "max_completion_length", "loss_type",
    "importance_sampling_level", "temperature", "beta", "kl_estimator", "scale_rewards", "multi_objective_aggregation",
    "reward_weights", "seed", "shuffle_dataset", "lr_scheduler_type", "sync_ref_model",
)
# Fields that say nothing about a run's maths (where it writes, how it resumes, how many processes run it;
# resume_from_checkpoint: TRL's field scripts pass to train(), set when resuming).
IGNORED_FIELDS = ("output_dir", "overwrite_output_dir", "world_size", "resume_from_checkpoint")

# The fields the trainer reads where it uses them, as Trainer does, so a change after it was built applies (checked at
# train()'s start on the values then: the trainer's check_live_args): the log/evaluate/save schedule (run/callbacks.scheduled),
# eval_on_start (train()), disable_tqdm (the console callback, at train_begin), the best-model tracking and pruning
# (callbacks.track_best, checkpoints.save/finish), max_grad_norm (each optimizer step), num_completions_to_print (each
# log), overwrite_output_dir (train() claims output_dir), resume_from_checkpoint.
LIVE_FIELDS = ("logging_strategy", "logging_steps", "logging_first_step", "eval_strategy", "eval_steps", "eval_delay", "eval_on_start",
               "save_strategy", "save_steps", "save_total_limit", "metric_for_best_model", "greater_is_better", "load_best_model_at_end",
               "disable_tqdm", "max_grad_norm", "num_completions_to_print", "overwrite_output_dir", "resume_from_checkpoint")


class ArgsAtBuild:
    """A GRPOConfig's field values when a trainer was built, to refuse in train() those changed since (`check`).

    transformers' Trainer builds the optimizer and schedule in train() and reads the rest of `args` where it uses them,
    so `trainer.args.learning_rate = …` before train() applies there; fastgrpo builds them, the sampler and the loss
    with the trainer, so such a change would be ignored silently. Values are compared as JSON text (objects by repr),
    so a dict changed in place (generation_kwargs["top_p"] = …) counts as a change.
    """

    def __init__(self, args):
        self.values = {name: (_as_text(value), repr(value)) for name, value in _fields(args)}

    def check(self, args, max_steps: int) -> None:
        """Refuse a field outside `LIVE_FIELDS` whose value differs from the one the trainer was built with.

        Args:
            args: the trainer's GRPOConfig now (or a config of another class put in its place: its other fields count as changed).
            max_steps: the run length the trainer planned (args.max_steps set to it is no change).
        Warns:
            UserWarning: `metric_for_best_model` changed since build while `greater_is_better` kept the value that goes with
                another name (filled from the built name, as TrainingArguments fills it once): the best checkpoint would be
                the worst by the new metric's usual direction. transformers' Trainer keeps it silently.
        Raises:
            TypeError: `args` is no config (trainer.args = {…}: a dict has none of the fields the trainer reads).
            ValueError: `args.max_steps` > 0 and not the planned length; any other changed field, naming each with
                both values and the fix (build a new GRPOTrainer with these args, or set them back).
        """
        if not dataclasses.is_dataclass(args) or isinstance(args, type):
            raise TypeError(f"trainer.args is {args!r:.80} ({type(args).__name__}), not a GRPOConfig: put a config in its place, e.g. "
                            "trainer.args = copy.copy(trainer.args), then set the fields that apply live on it.")
        if args.max_steps > 0 and args.max_steps != max_steps:  # the learning-rate schedule spans the planned length
            raise ValueError(f"args.max_steps is {args.max_steps}, but this trainer was built for max_steps={max_steps} (its learning-rate "
                             "schedule spans them): build a new GRPOTrainer with these args, then call train(resume_from_checkpoint=True) to go "
                             f"on from the last checkpoint (or `fastgrpo train … --max_steps {args.max_steps} --resume`).")
        unset = (None, "no such field")  # args replaced by a config of another class (TRL's GRPOConfig)
        changed = [f"{name}={value!r} (built with {self.values.get(name, unset)[1]})" for name, value in _fields(args)
                   if name not in LIVE_FIELDS and _as_text(value) != self.values.get(name, unset)[0] and not (name == "max_steps" and value == max_steps)]
        if changed:
            raise ValueError(
                f"args changed after this GRPOTrainer was built: {', '.join(changed[:10])}{f' and {len(changed) - 10} more' if len(changed) > 10 else ''}. The trainer read "
                f"{'it' if len(changed) == 1 else 'them'} when it was built (optimizer, schedule, sampler, loss, trackers), so train() would "
                "ignore the change: build a new GRPOTrainer with these args (then train(resume_from_checkpoint=True) goes on from the "
                f"last checkpoint), or set {'it' if len(changed) == 1 else 'them'} back. Changes apply live only to {', '.join(LIVE_FIELDS)}."
            )
        self._warn_stale_direction(args)

    def _warn_stale_direction(self, args) -> None:
        """`check`'s warning: the new metric_for_best_model with the greater_is_better its built name gave."""
        metric, better = args.metric_for_best_model, args.greater_is_better
        built = json.loads(self.values["metric_for_best_model"][0])
        if metric is None or built is None or metric == built or _as_text(better) != self.values["greater_is_better"][0]:
            return  # no metric, the same one, or greater_is_better set since: the user's choice
        if better == (not built.endswith("loss")) != (not metric.endswith("loss")):  # TrainingArguments' rule, by each name
            warnings.warn(f"metric_for_best_model changed from {built!r} to {metric!r} after the trainer was built, but greater_is_better="
                          f"{better} was kept (as {built!r}'s name gave it when the config was built): the best checkpoint will be the one "
                          f"with the {'highest' if better else 'lowest'} {metric}. Set trainer.args.greater_is_better = {not better} if "
                          f"{'lower' if better else 'higher'} is better (transformers' Trainer keeps the old value too).", UserWarning, stacklevel=4)


def _fields(args) -> list[tuple[str, object]]:
    return [(f.name, getattr(args, f.name)) for f in dataclasses.fields(args)]


def _as_text(value) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def check_output_dir(output_dir: str) -> None:
    """Create `output_dir` if needed and make sure files can be written in it.

    Raises:
        ValueError: it is a file, cannot be created, or is not writable (naming it).
    """
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir {output_dir!r} is a file; give a folder (it is created if missing).")
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as err:
        raise ValueError(f"output_dir {output_dir!r} is not writable ({err.strerror or err}); choose another folder.") from None


def claim_output_dir(output_dir: str, overwrite: bool) -> list[str]:
    """Make `output_dir` this new run's own: refuse another run's files there, or, when `overwrite`, name them for removal.

    Nothing is removed here: `PreviousRun` removes them when this run first writes, so a run that fails before it has anything to save leaves the previous one whole.

    Only what fastgrpo wrote is ever named for removal: its checkpoint folders (with a manifest) and its logs (the
    `completions` folder among them once it holds a completions_<step>.parquet table, TRL's or fastgrpo's). A
    `checkpoint-N` it did not write (another trainer's, or a file) is another run's too, and refuses a new run
    without `overwrite`; with it, it is left where it is.

    Returns:
        The previous run's checkpoint folders and logs, by name within output_dir; [] when the folder held no run.
    Raises:
        ValueError: the folder holds checkpoints or logs and `overwrite` is False,
            naming them and the three ways on.
    """
    found = [os.path.basename(p) for p in checkpoints(output_dir)] + [n for n in LOGS if os.path.exists(os.path.join(output_dir, n))]
    found += [TABLES] if completion_tables.written_steps(output_dir) else []
    if found and not overwrite:
        raise ValueError(
            f"output_dir {output_dir!r} already holds a run ({', '.join(found)}); resume it with resume_from_checkpoint=True "
            "(fastgrpo train --resume; make train ARGS=--resume), choose another output_dir, or set overwrite_output_dir=True to replace it "
            "(--overwrite_output_dir true)."
        )
    return [n for n in found if n in (*LOGS, TABLES) or written_by_fastgrpo(os.path.join(output_dir, n))]


class PreviousRun:
    """The previous run's files a new run under overwrite_output_dir replaces (`claim_output_dir`'s list), removed at the new
    run's first write (its first log line, checkpoint, or its end), not before: a run that fails in its first rollout or
    step (a reward function's error, out of memory) has nothing to save, and loses nothing already saved."""

    def __init__(self, output_dir: str, names: list[str], console):
        self.output_dir, self.names, self.console = output_dir, list(names), console

    def remove(self) -> None:
        """Remove the files (once; later calls do nothing), with a one-line notice. Called before every write to output_dir."""
        if self.names:
            for path in (os.path.join(self.output_dir, name) for name in self.names):  # one already gone is skipped
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.exists(path):
                    os.remove(path)
            self.console.print(f"overwrite_output_dir: removed the previous run's {', '.join(self.names)} from {self.output_dir}", soft_wrap=True)
            self.names = []


def config_changes(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """The fields that differ between a checkpoint's config and this run's, as (field, saved, now).

    Raises:
        ValueError: a `STATE_FIELDS` field differs, naming it and both values.
    """
    changed = [(k, saved[k], v) for k, v in current.items() if k in saved and saved[k] != v and k not in IGNORED_FIELDS]
    for name, before, now in changed:
        if name in STATE_FIELDS:
            raise ValueError(
                f"resuming with {name}={now!r}, but the checkpoint was saved with {name}={before!r}, and its saved "
                f"state (rollout, step count, data order) only means the same under the saved value; resume with "
                f"{name}={before!r}, or start a new run in another output_dir."
            )
    return changed


def run_setup(reward_names: list[str], agents, train_dataset=None) -> dict[str, list[str]]:
    """What a run trains with besides its config, by name (saved in each checkpoint, compared on resume). Names only:
    a reward function's or tool's new code, a partial's other arguments, or another reward model saved under the same
    folder name are not seen.

    Args:
        reward_names: the reward functions' log names.
        agents: the checked agent arguments (rollout/producers.AgentInputs: tools, environments, rollout_func).
        train_dataset: random-access rows (a Dataset, a list of dicts), identified by `dataset_identity`; a stream: not.
    Returns:
        {"reward_funcs", "tools", "environment_factory", "rollout_func", "train_dataset"}: lists of names ([] for none).
    """
    def named(f) -> str:
        f = f.func if isinstance(f, functools.partial) else f
        return getattr(f, "__name__", None) or type(f).__name__

    environments = agents.environments.factories if agents.environments is not None else {}
    return {
        "reward_funcs": list(reward_names),
        "tools": [named(t) for t in agents.tools],
        "environment_factory": sorted(named(f) if key is None else f"{key}: {named(f)}" for key, f in environments.items()),  # routed by key
        "rollout_func": [named(agents.rollout_func)] if agents.rollout_func is not None else [],
        "train_dataset": dataset_identity(train_dataset),
    }


def dataset_identity(rows) -> list[str]:
    """["<N> rows, prompts <digest>"]: the row count and a digest of the first and last rows' prompts, the order a resume
    continues in depending on both; [] for rows without a length (a stream, or none). Another file resumed in its place
    trained on from the saved position silently."""
    if rows is None or not hasattr(rows, "__len__") or len(rows) == 0:
        return []
    ends = [rows[0], rows[len(rows) - 1]]
    digest = hashlib.sha256(json.dumps([r.get("prompt") for r in ends], sort_keys=True, default=str).encode()).hexdigest()[:8]
    return [f"{len(rows)} rows, prompts {digest}"]


def setup_changes(saved: dict | None, current: dict) -> list[tuple[str, list, list]]:
    """The `run_setup` entries that differ between a checkpoint's run and this one, as (argument, saved, now);
    [] for a checkpoint that predates them (None)."""
    if saved is None:
        return []
    return [(k, saved[k], v) for k, v in current.items() if k in saved and saved[k] != v]


def apply_optimizer_settings(optimizer, scheduler, args) -> None:
    """A resumed run's own learning rate, betas, eps and weight decay over the loaded ones.

    `optimizer.load_state_dict` restores the saved settings with the saved
    state; a resume that changed them (a field outside `STATE_FIELDS`) means the
    new ones. Only keys the optimizer (`optim`) has are set.

    Args:
        optimizer: a torch optimizer after `load_state_dict`.
        scheduler: its `LambdaLR`-style scheduler after `load_state_dict`.
        args: the run's GRPOConfig.
    """
    scheduler.base_lrs = [args.learning_rate] * len(scheduler.base_lrs)
    settings = {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon, "weight_decay": args.weight_decay}
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group.update(lr=args.learning_rate * factor(scheduler.last_epoch), initial_lr=args.learning_rate)
        group.update({k: v for k, v in settings.items() if k in group})
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
