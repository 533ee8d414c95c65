"""`fastgrpo train` (and `fastgrpo vllm-serve`, generation/vllm/serve.py): the command line.

    fastgrpo train                                  # the built-in job (README)
    fastgrpo train --config examples/run.yaml       # model, dataset, reward and GRPOConfig fields from YAML
    fastgrpo train --model ./my-model --dataset data.jsonl --reward mymod:score --num_iterations 4
    fastgrpo train --model smollm2-135m-instruct --dataset calculator --environment calculator \
        --reward fastgrpo.tasks.calculator:answer_correct   # an agent task (README "Agents")

Every `GRPOConfig` field, TRL's passthrough fields included (`--run_name x`,
`--use_vllm false`), is a flag, parsed by transformers' `HfArgumentParser` as
TRL's CLI parses it (`--num_iterations 4`, `--bf16 false`, `--reward_weights
1 0.5`, dict fields as JSON: `--generation_kwargs '{"top_k": 20}'`), with its
help text (flags.py). A YAML value that is text goes through the same types, as
`trl grpo --config` hands YAML values to the parser (`max_grad_norm: "0.5"` is
0.5). TRL's model-config LoRA options (`--use_peft`, `--lora_r`, …) build a
`peft_config`, its loading options (`--dtype`, `--attn_implementation`, `--model_revision`)
go into model_init_kwargs as `trl grpo` puts them (`ModelOptions`), and `trl grpo`'s script flags (`--model_name_or_path`, `--dataset_name`,
`--dataset_config`, `--dataset_*_split`, `--reward_funcs`, …) work as in TRL's script
(`ScriptOptions`). A mistyped flag is one line with the closest flag's name.

Which values apply: the built-in job's (model, dataset, rewards and its
GRPOConfig values) only when neither a model nor a dataset is given; a run of
your own starts from GRPOConfig's defaults and must name its rewards. Then the
YAML file, then flags. `--reward module:function`, `--tools module:function`
and `--environment module:Class` import from the current folder (TRL's
`tools=` and `environment_factory=`; `--environment calculator` is the
built-in one). Works under `accelerate launch` and `torchrun` (`python -m fastgrpo.cli
train …`).

`fastgrpo --help` imports nothing heavy; `fastgrpo train --help` imports
transformers' argument parser only; torch and the trainer load when a run starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import gc
import os
import sys
import warnings

from .config import GRPOConfig
from .config.flags import FIELD_HELP, check_yaml_types, layout_help, load_yaml, one_line_error, training_arguments_fields, yaml_values_as_flags
from .config.trl_fields import TRL_FIELDS
from .config.trl_script import (
    BUILTIN_REWARD_NAMES, LORA_KEYS, MODEL_KEYS, QUANTIZATION_KEYS, SCRIPT_KEYS, LoraOptions, ModelOptions, QuantizationOptions, ScriptOptions,
    model_init_kwargs, quantization_config, reward_specs,
)

# The built-in job: SmolLM2-135M-Instruct on one-digit addition (reasoning-gym
# basic_arithmetic, "+" only, no brackets or negation), two solved examples
# before each question, asked for "only the final answer", and one reward: 1 for
# the exact answer, 0 otherwise ("exact"). Correctness alone, so what rises is
# the share of right answers (≈ 5 % → ≈ 80 % in two minutes on 2 CPU cores,
# docs/benchmarks.md); a length term would teach brevity first. μ = 1 and lr 3e-5:
# the setting that reached the reward soonest in wall-clock, measured against
# μ = 2, 4, target_kl and other learning rates (docs/benchmarks.md, "Time to reward").
BUILTIN_JOB = {
    "model": "smollm2-135m-instruct",
    "dataset": (
        "reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1"
        "&operators=%2B&allow_parentheses=false&allow_negation=false&few_shot=2"
    ),
    "reward": ["exact"],
    "dataset_size": 1000,
    "config": {
        "output_dir": "grpo-output",
        "learning_rate": 3e-5,  # TRL's 1e-6 barely moves a 135M model in 48 steps; 3e-5 beat 1e-5 at every μ
        "lr_scheduler_type": "constant",
        "num_iterations": 1,  # μ: reuse did not pay here (generation is ≈ 30 % of a μ = 1 run)
        "filter_groups": True,  # dynamic sampling: only groups with a right and a wrong answer (reached 40 % exact sooner)
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # 16 completions per rollout → 2 optimizer steps per rollout
        "max_prompt_length": 128,
        "max_completion_length": 32,  # answers are a few tokens; the untrained model's chatter is cut here
        "max_steps": 48,
        "logging_steps": 8,  # one line per 4 rollouts
        "save_steps": 48,
        "save_total_limit": 1,
        "log_completions": True,
        "num_completions_to_print": 2,
    },
}
JOB_KEYS = ("model", "dataset", "reward", "dataset_size", "tools", "environment")
ENVIRONMENTS = {"calculator": "fastgrpo.tasks.calculator:Calculator"}  # built-in environment names
OPTIONS = (GRPOConfig, LoraOptions, ModelOptions, QuantizationOptions, ScriptOptions)  # the dataclasses whose fields are flags


def build_parser() -> argparse.ArgumentParser:
    """The `fastgrpo` parser: a light top level whose `train` subcommand is parsed by `train_parser()`."""
    parser = argparse.ArgumentParser(prog="fastgrpo", description="GRPO fine-tuning with multi-step rollout reuse.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train a model with GRPO (no arguments: the built-in job; `fastgrpo train --help` lists the flags)", add_help=False)
    sub.add_parser("vllm-serve", help="serve a model with vLLM for use_vllm=True, vllm_mode='server' (`fastgrpo vllm-serve --help`)", add_help=False)
    return parser


USAGE = "%(prog)s [--config YAML] [--model MODEL] [--dataset DATASET] [--reward REWARD] [--resume [PATH]] [--FIELD VALUE ...]"
FIRST_FIELDS = ("output_dir", "max_steps", "learning_rate", "num_generations", "num_iterations")  # in --help's first section
HELP_EPILOG = ("README.md: \"Command line\" (YAML recipes, which values apply), \"Configuration: every field fastgrpo honours\", "
               "\"Differences from TRL\" and \"Combinations TRL accepts that fastgrpo refuses\"; docs/reliability.md: what each refusal guards.")


def train_parser() -> argparse.ArgumentParser:
    """`fastgrpo train`'s flags: the job's, then GRPOConfig's and TRL's model and script options via transformers' HfArgumentParser.

    Every default is suppressed, so the parsed namespace holds only what was given (the precedence rule needs it).
    `--help` lists the job's flags and `FIRST_FIELDS` first, then GRPOConfig's own fields, the TrainingArguments fields
    fastgrpo honours, `trl grpo`'s model and script options, and last TRL's and TrainingArguments' other fields (trl_fields.py).
    """
    from transformers import HfArgumentParser

    # allow_abbrev=False: a misspelt flag (--num_generation) must be an error, not a prefix match.
    own = tuple({f.name for f in dataclasses.fields(GRPOConfig)} - set(TRL_FIELDS))  # TRL's other fields' help names their default
    parser = HfArgumentParser(OPTIONS, prog="fastgrpo train", allow_abbrev=False, usage=USAGE, epilog=HELP_EPILOG,
                              description="GRPO fine-tuning; with no flags, the built-in job. Every flag is also a key of a --config YAML recipe.")
    parser.error = lambda message: one_line_error(parser, message)
    builtin = {**BUILTIN_JOB["config"], **{k: BUILTIN_JOB[k] for k in JOB_KEYS if k in BUILTIN_JOB}}
    for action in parser._actions:
        if action.dest != "help" and action.help != argparse.SUPPRESS:
            what = FIELD_HELP.get(action.dest) or action.help or ""
            default = "" if action.dest not in own + LORA_KEYS + MODEL_KEYS + QUANTIZATION_KEYS + SCRIPT_KEYS else f" (default {action.default!r})"
            job = f" (built-in job: {builtin[action.dest]!r})" if action.dest in builtin else ""
            action.help = f"{what}{default}{job}".replace("%", "%%")
        action.default = argparse.SUPPRESS if action.dest != "help" else action.default
    job = parser.add_argument_group("the job")
    job.add_argument("--config", metavar="YAML", default=argparse.SUPPRESS, help="YAML file of GRPOConfig fields plus model/dataset/reward (examples/run.yaml)")
    job.add_argument("--model", "--model_name_or_path", dest="model", default=argparse.SUPPRESS,  # TRL's spelling too (TRL_SCRIPT_KEYS)
                     help="smollm2-135m-instruct, a local folder or .gguf file, or a hub id")
    job.add_argument("--dataset", "--dataset_name", dest="dataset", default=argparse.SUPPRESS,
                     help="reasoning-gym:<task>[,<task>], a local json/jsonl/csv/parquet file or dataset folder, or a hub name")
    job.add_argument("--reward", action="append", default=argparse.SUPPRESS, help=f"{', '.join(BUILTIN_REWARD_NAMES)} or module:function (repeatable or comma-separated)")
    job.add_argument("--tools", action="append", default=argparse.SUPPRESS, help="module:function tools the model may call (repeatable or comma-separated)")
    job.add_argument("--environment", default=argparse.SUPPRESS, help=f"module:Class environment_factory, or {', '.join(ENVIRONMENTS)}")
    job.add_argument("--dataset_size", type=int, default=argparse.SUPPRESS, help="rows: generated for reasoning-gym and calculator (default 1000), the first N of a file or hub dataset (default all)")
    job.add_argument("--resume", nargs="?", const=True, metavar="PATH", default=argparse.SUPPRESS, help="resume from the latest checkpoint in output_dir, or from PATH")
    inherited, trl_other = training_arguments_fields(), set(TRL_FIELDS)
    layout_help(parser, job, FIRST_FIELDS, [
        ("GRPO", "GRPOConfig's own fields (TRL's names and defaults)", set(own) - inherited),
        ("training", "the fields of transformers' TrainingArguments that fastgrpo honours", set(own) & inherited),
        ("trl grpo's model options", "loading, LoRA adapters (--use_peft) and bitsandbytes, as `trl grpo` takes them",
         {*MODEL_KEYS, *LORA_KEYS, *QUANTIZATION_KEYS}),
        ("trl grpo's script options", "its dataset and reward flags", set(SCRIPT_KEYS)),
        ("TRL's other GRPOConfig fields", "accepted as TRL takes them; a value fastgrpo cannot honour is refused, naming the fix",
         trl_other - inherited),
        ("TrainingArguments' other fields", "accepted as TRL takes them; a value fastgrpo cannot honour is refused, naming the fix",
         trl_other & inherited),
    ])
    return parser


TRL_SCRIPT_KEYS = {"model_name_or_path": "model", "dataset_name": "dataset"}  # TRL's script flags / YAML keys → fastgrpo train's


def resolve_job(ns: argparse.Namespace) -> tuple[dict, dict, dict]:
    """(job values, GRPOConfig fields, LoRA options) from the parsed flags and the YAML file; the job's
    `quantization_config` is the bitsandbytes options' (trl_script.quantization_config).

    The built-in job's values are the base only when neither model nor dataset
    is given; otherwise GRPOConfig's defaults are, and the rewards must be named.

    Raises:
        ValueError: a YAML file that is empty, is not a mapping or has a mistyped value, or a job of
            your own without rewards (the message lists the built-in ones).
    """
    given = vars(ns)
    loaded: dict = {}
    if "config" in given:
        import yaml

        try:
            with open(given["config"]) as f:
                loaded = load_yaml(f)
        except OSError as err:
            raise ValueError(f"--config {given['config']}: cannot read it ({err.strerror or err}); give a YAML file.") from None
        except yaml.YAMLError as err:
            raise ValueError(f"--config {given['config']} is not valid YAML: {' '.join(str(err).split())}") from None
        if loaded is None or loaded == {}:  # empty or comments only: running the built-in job instead would be a surprise
            raise ValueError(f"{given['config']} is empty (it sets no field); write field: value lines as in examples/run.yaml, "
                             "or drop --config to run the built-in job.")
        if not isinstance(loaded, dict):
            raise ValueError(f"{given['config']}: expected a mapping of field: value, got {type(loaded).__name__}.")
        known = {f.name for kind in OPTIONS for f in dataclasses.fields(kind)} | {*JOB_KEYS, *TRL_SCRIPT_KEYS}
        for key in loaded:  # a typo of any key a recipe takes, not only GRPOConfig's (its error would suggest only those)
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                raise ValueError(f"{given['config']}: unknown key {key!r}{f' (did you mean {close[0]!r}?)' if close else ''}: a recipe takes "
                                 "GRPOConfig's fields, model, dataset, reward, tools, environment, dataset_size, trl grpo's model_name_or_path, "
                                 "dataset_name, reward_funcs, dataset_config, dtype, attn_implementation, model_revision, … and the LoRA and bitsandbytes options.")
        loaded = {TRL_SCRIPT_KEYS.get(k, k): v for k, v in loaded.items()}  # a TRL recipe's model_name_or_path, dataset_name
        loaded = {**loaded, **yaml_values_as_flags({k: v for k, v in loaded.items() if k not in JOB_KEYS}, train_parser(), given["config"])}
        check_yaml_types({k: v for k, v in loaded.items() if k not in JOB_KEYS}, OPTIONS, given["config"])
    chosen = {**{k: loaded[k] for k in JOB_KEYS if k in loaded}, **{k: given[k] for k in JOB_KEYS if k in given}}
    builtin = "model" not in chosen and "dataset" not in chosen
    job = {**{k: BUILTIN_JOB[k] for k in JOB_KEYS if k in BUILTIN_JOB and (builtin or k not in ("reward", "dataset_size"))}, **chosen}
    script = {**dataclasses.asdict(ScriptOptions()), **{k: v for k, v in {**loaded, **given}.items() if k in SCRIPT_KEYS}}
    trl_rewards = bool(script["reward_funcs"] or script["reward_model_name_or_path"])
    if trl_rewards and "reward" not in chosen:  # TRL's reward flags name the run's rewards: not added to the built-in job's
        job.pop("reward", None)
    if "reward" not in job and "environment" not in job and not trl_rewards:  # an environment may score itself (get_reward)
        raise ValueError(
            f"a job with its own model or dataset needs --reward (or reward: in the YAML): one or more of "
            f"{', '.join(BUILTIN_REWARD_NAMES)} or module:function (or TRL's --reward_funcs / --reward_model_name_or_path)."
        )
    for key in ("model", "dataset", "environment"):  # an environment: module:Class or a built-in name (a mapping was "unhashable type")
        if key in job and not isinstance(job[key], str) and not (key == "environment" and job[key] is None):
            raise ValueError(f"{key}: {job[key]!r} has type {type(job[key]).__name__}; give a name or a path (text)"
                             f"{', module:Class or ' + ', '.join(ENVIRONMENTS) if key == 'environment' else ''}.")
    size = job.setdefault("dataset_size", None)  # None: 1000 generated rows, or every row of a file or hub dataset
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ValueError(f"dataset_size={size!r}: give the number of rows, 1 or more (generated for reasoning-gym and calculator, "
                         "the first rows of a file or hub dataset).")
    job.update(script)
    for key in ("reward", "tools", "reward_funcs"):
        specs = job.get(key) or []
        job[key] = [r.strip() for spec in (specs if isinstance(specs, list) else [specs]) for r in str(spec).split(",") if r.strip()]
    fields = {**(BUILTIN_JOB["config"] if builtin else {}), **{k: v for k, v in loaded.items() if k not in JOB_KEYS + SCRIPT_KEYS}}
    fields.update({k: v for k, v in given.items() if k not in JOB_KEYS + SCRIPT_KEYS + ("config", "resume")})
    lora = {k: fields.pop(k) for k in LORA_KEYS if k in fields}
    loading = {k: fields.pop(k) for k in MODEL_KEYS if k in fields and fields[k] is not None}  # trl grpo's --dtype, --model_revision, …
    if loading:
        fields["model_init_kwargs"] = model_init_kwargs(loading, fields.get("model_init_kwargs"))
    job["quantization_config"] = quantization_config({k: fields.pop(k) for k in QUANTIZATION_KEYS if k in fields}, loading.get("dtype"))
    return job, fields, lora


def peft_kwargs(lora: dict) -> dict:
    """GRPOTrainer keyword arguments for TRL's LoRA options: {"peft_config": …} when use_peft, else {}.

    `--lora_target_modules all-linear` arrives as ["all-linear"] and is passed as
    peft's keyword "all-linear". TRL's `ModelConfig` unwraps every one-element
    list, which turns `--lora_target_modules q_proj` into a regex that matches no
    module in peft; here other lists stay lists, and text (from YAML) stays text.

    Warns:
        UserWarning: LoRA options given without use_peft (TRL's ModelConfig ignores them silently and every weight trains),
            naming them and the fix.
    Raises:
        ValueError: options `lora_config` refuses (r < 1, α ≤ 0, a dropout outside [0, 1)).
    """
    if not lora.get("use_peft"):
        unread = [f"{k}={v!r}" for k, v in lora.items() if k != "use_peft"]
        if unread:
            from .config.unread_fields import no_effect

            warnings.warn(no_effect(unread, "use_peft is off (every weight trains)",
                                    "add --use_peft (use_peft: true in YAML) to train LoRA adapters"), stacklevel=2)
        return {}
    from .model.loading import lora_config

    options = {k: v for k, v in {**dataclasses.asdict(LoraOptions()), **lora}.items() if k != "use_peft"}
    if options["lora_target_modules"] == ["all-linear"]:
        options["lora_target_modules"] = "all-linear"
    return {"peft_config": lora_config(**options)}


def import_object(spec: str, flag: str):
    """`module:name` → the object (a tool function or an environment class).

    Raises:
        ValueError: a spec without ":", a module that does not import, or a missing name (naming the flag and the fix).
    """
    from .tasks import import_module

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{flag} {spec!r}: give module:name (a Python file or module in the current folder, and the name in it).")
    try:
        return getattr(import_module(module), name)
    except ModuleNotFoundError as err:
        raise ValueError(f"{flag} {spec!r}: module {module!r} not found ({err}); run from the folder that holds it.") from None
    except AttributeError:
        raise ValueError(f"{flag} {spec!r}: module {module!r} has no {name!r}.") from None


def train(ns: argparse.Namespace) -> None:
    job, fields, lora = resolve_job(ns)
    args = GRPOConfig(**fields)  # bad values are refused here, before anything loads
    peft = peft_kwargs(lora)  # LoRA options refused or warned about before anything loads too
    if os.getcwd() not in sys.path:  # --reward module:function finds modules in the current folder
        sys.path.insert(0, os.getcwd())
    import torch
    from accelerate.utils import broadcast_object_list

    from .run.checkpoint_files import TRAINING_ARGS_NAME, check_resume_target, checkpoints, later_checkpoints
    from .run.datasets import load_dataset_spec, splits_apply
    from .run.runs import claim_output_dir
    from .rollout.rewards import resolve_reward, reward_names
    from .rollout.trl_rewards import check_trl_rewards
    from .trainer import GRPOTrainer

    resume = getattr(ns, "resume", None)
    if resume is None and args.resume_from_checkpoint is not None:  # TRL's field, which its scripts pass to train()
        resume = {"true": True, "false": False}.get(str(args.resume_from_checkpoint).lower(), args.resume_from_checkpoint)
    check_resume_target(resume, args.output_dir)  # before the model loads: nothing to resume, or another run in the way
    if resume in (None, False):
        claim_output_dir(args.output_dir, args.overwrite_output_dir)  # only refuses here; train() replaces at its first write
    rewards = [resolve_reward(r) for r in reward_specs(job)]
    splits = {"config": job["dataset_config"], "streaming": job["dataset_streaming"]}  # TRL's script flags
    dataset = load_dataset_spec(job["dataset"], split=job["dataset_train_split"], size=job["dataset_size"], seed=args.seed, **splits)
    evaluated = args.eval_strategy != "no" and splits_apply(job["dataset"])  # TRL's script: the test split, when it evaluates
    eval_dataset = load_dataset_spec(job["dataset"], split=job["dataset_test_split"], **splits) if evaluated else None
    sets = [(f"dataset {job['dataset']!r} ({which} split)", rows) for which, rows in (("train", dataset), ("eval", eval_dataset)) if rows is not None]
    check_trl_rewards(rewards, reward_names(rewards), sets)  # as GRPOTrainer checks them, naming the split
    agents = {"tools": [import_object(t, "--tools") for t in job["tools"]] or None}
    if job.get("environment"):
        agents["environment_factory"] = import_object(ENVIRONMENTS.get(job["environment"], job["environment"]), "--environment")
    trainer = GRPOTrainer(model=job["model"], reward_funcs=rewards, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
                          quantization_config=job["quantization_config"], **agents, **peft)
    if trainer.accelerator.is_main_process:
        rows = "streamed" if job["dataset_streaming"] else f"{len(dataset)} prompts"
        trainer.console.print(
            f"fastgrpo: {job['model']} on {job['dataset']} ({rows}), rewards {', '.join(trainer.reward_names)}; "
            f"{trainer.max_steps} step{'s' if trainer.max_steps != 1 else ''}, μ={args.num_iterations}, G={args.num_generations}, rollout={args.generation_batch_size} completions",
            soft_wrap=True, markup=False,  # one line, whatever the width: grep-able in a log file
        )
    trainer.train(resume_from_checkpoint=resume)
    out, trained = os.path.abspath(args.output_dir), trainer.state.global_step > trainer.events.initial_step
    # A call that trained nothing (a resume of a finished run) leaves the final model as saved; it writes one where none was
    # finished (training_args.bin: save_model's last file) or where output_dir holds checkpoints past this step (an older one
    # resumed at a lowered max_steps: the final model there is a later step's; `trl grpo` saves the resumed one's, as here).
    # The main process's view, so that all call it or none.
    stale = not os.path.exists(os.path.join(out, TRAINING_ARGS_NAME)) or bool(later_checkpoints(out, trainer.state.global_step))
    saved = broadcast_object_list([trained or stale])[0]
    if saved:
        trainer.save_model(args.output_dir)
    world = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None  # held past the trainer: see below
    trainer.accelerator.end_training()  # process group unregistered (multi-process runs); the trackers closed at on_train_end
    if trainer.accelerator.is_main_process:
        files = {"metrics": "metrics.jsonl", "completions": "completions.jsonl", "tables": os.path.join("completions", "")}  # TRL's parquet tables
        listed = "".join(f"\n  {k + ':':12} {os.path.join(out, f)}" for k, f in files.items() if os.path.exists(os.path.join(out, f)))
        done = "done" if trained else (f"nothing trained (at step {trainer.state.global_step} of max_steps={trainer.max_steps}); "
                                       + ("the final model saved from it" if saved else "output_dir's files left as they were"))
        trainer.console.print(
            f"{done}. final model: {out}{listed}\n  checkpoints: {', '.join(checkpoints(out)) or 'none'}", soft_wrap=True, markup=False
        )
    # The process group lives on in the DDP wrapper. A gloo thread may still be releasing the last collective's tensors,
    # which needs the GIL: at interpreter exit that thread aborts the process (SIGABRT, "terminate called without an
    # active exception") after everything is saved. So the wrapper goes first, then our hold on the group: torch frees
    # it with the GIL released, so its threads finish and are joined here.
    del trainer
    gc.collect()
    del world


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fastgrpo` console script."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = build_parser().parse_known_args(argv[:1])
    if command.command == "vllm-serve":
        from .generation.vllm.serve import main as serve

        return serve(argv[1:] + rest)
    ns = train_parser().parse_args(argv[1:] + rest)
    from .generation.contract import EngineError  # imports torch: only once a run starts, never for --help
    from .run.checkpoint_files import CheckpointWriteError
    from .run.interrupt import TrainingInterrupted

    try:
        if command.command == "train":
            train(ns)
    except (ValueError, TypeError, FloatingPointError, CheckpointWriteError, EngineError) as err:  # fastgrpo's own checks; errors in user code keep their traceback
        print(f"fastgrpo: error: {err}", *getattr(err, "__notes__", ()), sep="\n", file=sys.stderr)  # notes: run/failures.py's
        return 2
    except TrainingInterrupted as err:  # Ctrl-C: the checkpoint is saved, the message says how to resume
        print(f"fastgrpo: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt as err:  # Ctrl-C while loading, or a second one that aborts at once: no traceback, the shell's code
        print("fastgrpo: interrupted; what was already saved in output_dir is kept.", *getattr(err, "__notes__", ()), sep="\n", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
