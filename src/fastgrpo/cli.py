"""`fastgrpo train`: the command line.

    fastgrpo train                                  # the built-in job (README)
    fastgrpo train --config run.yaml                # fields from YAML
    fastgrpo train --model ./my-model --dataset data.jsonl --reward mymod:score --num_iterations 4

Every `GRPOConfig` field is a flag (`--num_iterations 4`, `--bf16 true`).
Precedence: the built-in job's values < the YAML file < flags. `--model`,
`--dataset` and `--reward` take the same values as in the YAML (`model:`,
`dataset:`, `reward:`). Works under `accelerate launch` and `torchrun`
(`python -m fastgrpo.cli train …`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing

import yaml

from .checkpoint import CheckpointWriteError
from .config import GRPOConfig
from .interrupt import TrainingInterrupted

# The built-in job: SmolLM2-135M-Instruct on easy reasoning-gym arithmetic,
# asked for "only the final answer". Two rewards, logged apart: reasoning-gym's
# own scorer (correctness; 1 for the exact answer, partial credit when the
# reply merely contains it) and brevity (1 − characters/100). The untrained
# model is chatty (~100 characters), so brevity has spread in every group and
# rises within minutes on 2 CPU cores; correctness (≈ 5 % exact at the start)
# is the slow part a 135M model only creeps on.
BUILTIN_JOB = {
    "model": "smollm2-135m-instruct",
    "dataset": "reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1",
    "reward": ["reasoning_gym", "brevity"],
    "dataset_size": 1000,
    "config": {
        "output_dir": "grpo-output",
        "learning_rate": 1e-5,  # TRL's 1e-6 barely moves a 135M model in 48 steps
        "lr_scheduler_type": "constant",
        "num_iterations": 4,  # μ: each rollout feeds 4 passes
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # 16 completions per rollout → 2 × μ = 8 optimizer steps per rollout
        "max_prompt_length": 128,
        "max_completion_length": 32,  # answers are a few tokens; the untrained model's chatter is cut here
        "max_steps": 48,
        "logging_steps": 8,  # one line per rollout
        "save_steps": 48,
        "save_total_limit": 1,
        "log_completions": True,
        "num_completions_to_print": 2,
    },
}
JOB_KEYS = ("model", "dataset", "reward", "dataset_size")


def _parse_value(text: str, annotation):
    """Parse a flag's text by the field's annotation (bool, int, float, str, lists, None)."""
    if text.lower() in ("none", "null") and "None" in str(annotation):
        return None
    kind = str(annotation)
    if "bool" in kind and text.lower() in ("true", "false", "1", "0", "yes", "no"):
        return text.lower() in ("true", "1", "yes")
    if "list[float]" in kind:
        return [float(x) for x in text.split(",")]
    for cast in ((int,) if "int" in kind else ()) + ((float,) if "float" in kind else ()):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def build_parser() -> argparse.ArgumentParser:
    from .rewards import BUILTIN_REWARDS

    # allow_abbrev=False: a misspelt flag (--num_generation) must be an error, not a prefix match.
    parser = argparse.ArgumentParser(prog="fastgrpo", description="GRPO fine-tuning with multi-step rollout reuse.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model with GRPO (no arguments: the built-in job)", allow_abbrev=False)
    train.add_argument("--config", help="YAML file of GRPOConfig fields plus model/dataset/reward")
    train.add_argument("--model", help="smollm2-135m-instruct, a local folder or .gguf file, or a hub id")
    train.add_argument("--dataset", help="reasoning-gym:<task>[,<task>], a local json/jsonl/csv/parquet file, or a hub name")
    train.add_argument("--reward", action="append", help=f"{', '.join(BUILTIN_REWARDS)} or module:function (repeatable or comma-separated)")
    train.add_argument("--dataset_size", type=int, help="rows generated for reasoning-gym datasets")
    train.add_argument("--resume", nargs="?", const=True, help="resume from the latest checkpoint in output_dir, or from PATH")
    hints = typing.get_type_hints(GRPOConfig)
    for f in dataclasses.fields(GRPOConfig):
        if f.name != "world_size":
            default = BUILTIN_JOB["config"].get(f.name, f.default)
            kind = getattr(hints[f.name], "__name__", str(hints[f.name]))
            train.add_argument(f"--{f.name}", dest=f"cfg_{f.name}", metavar=kind, help=f"default {default!r}".replace("%", "%%"))
    return parser


def resolve_job(ns: argparse.Namespace) -> tuple[dict, dict]:
    """(job values, config fields): built-in job < YAML < flags.

    Raises:
        ValueError: a YAML file that is not a mapping.
    """
    job = {k: BUILTIN_JOB[k] for k in JOB_KEYS}
    fields = dict(BUILTIN_JOB["config"])
    if ns.config:
        with open(ns.config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{ns.config}: expected a mapping of field: value, got {type(loaded).__name__}.")
        job.update({k: loaded.pop(k) for k in JOB_KEYS if k in loaded})
        fields.update(loaded)
    hints = typing.get_type_hints(GRPOConfig)
    for name, value in vars(ns).items():
        if name.startswith("cfg_") and value is not None:
            fields[name[4:]] = _parse_value(value, hints[name[4:]])
        elif name in JOB_KEYS and value is not None:
            job[name] = value
    rewards = job["reward"] if isinstance(job["reward"], list) else [job["reward"]]
    job["reward"] = [r.strip() for spec in rewards for r in str(spec).split(",") if r.strip()]
    return job, fields


def train(ns: argparse.Namespace) -> None:
    from .checkpoint import checkpoints
    from .data import load_dataset_spec
    from .rewards import resolve_reward
    from .trainer import GRPOTrainer

    job, fields = resolve_job(ns)
    args = GRPOConfig(**fields)  # bad values are refused here, before anything loads
    rewards = [resolve_reward(r) for r in job["reward"]]
    dataset = load_dataset_spec(job["dataset"], size=job["dataset_size"], seed=args.seed)
    trainer = GRPOTrainer(model=job["model"], reward_funcs=rewards, args=args, train_dataset=dataset)
    if trainer.accelerator.is_main_process:
        trainer.console.print(
            f"fastgrpo: {job['model']} on {job['dataset']} ({len(dataset)} prompts), rewards {', '.join(job['reward'])}; "
            f"{trainer.max_steps} steps, μ={args.num_iterations}, G={args.num_generations}, rollout={args.generation_batch_size} completions"
        )
    trainer.train(resume_from_checkpoint=ns.resume)
    trainer.save_model(args.output_dir)
    trainer.accelerator.end_training()  # trackers closed, process group destroyed (multi-process runs)
    if trainer.accelerator.is_main_process:
        out = os.path.abspath(args.output_dir)
        trainer.console.print(
            f"done. final model: {out}\n  metrics:     {os.path.join(out, 'metrics.jsonl')}\n"
            f"  completions: {os.path.join(out, 'completions.jsonl')}\n  checkpoints: {', '.join(checkpoints(out)) or 'none'}"
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fastgrpo` console script."""
    ns = build_parser().parse_args(argv)
    try:
        if ns.command == "train":
            train(ns)
    except (ValueError, TypeError, CheckpointWriteError) as err:  # fastgrpo's own checks; errors in user code keep their traceback
        print(f"fastgrpo: error: {err}", file=sys.stderr)
        return 2
    except TrainingInterrupted as err:  # Ctrl-C: the checkpoint is saved, the message says how to resume
        print(f"fastgrpo: {err}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
