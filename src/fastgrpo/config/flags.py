"""What `fastgrpo train --help` says about each flag, and argparse's errors as one line.

- `FIELD_HELP`: one line per field fastgrpo honours (what it does, its unit or
  its values), which `cli.train_parser` hands to transformers'
  `HfArgumentParser` as the field's help text. TRL's other fields
  (trl_fields.py) carry their own help: what fastgrpo does with the value.
- `one_line_error()`: argparse's errors as one line, an unknown flag with the
  closest known one (`fastgrpo train`, `fastgrpo vllm-serve`).
- `layout_help()`, `training_arguments_fields()`: the order of `--help`'s sections (the job's flags first,
  transformers' `TrainingArguments` fields last).
- `load_yaml()`, `yaml_values_as_flags()`, `check_yaml_types()`: a recipe's YAML read (a key given twice
  refused), its values typed as `trl grpo --config` types them, and refused when they do not fit.

Not here: the fields themselves and their checks (config/grpo_config.py, trl_fields.py).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import types
import typing

from .checks import ALSO_ACCEPTED

FIELD_HELP = {
    "output_dir": "folder for checkpoints, metrics.jsonl, completions.jsonl and the final model",
    "overwrite_output_dir": "a new run in a folder holding another run: false refuses, true removes the old run's files",
    "seed": "seed of the model's sampling and of everything random",
    "data_seed": "seed of the prompt order (default: seed)",
    "full_determinism": "torch's deterministic algorithms for the whole process (transformers' enable_full_determinism)",
    "max_steps": "optimizer steps to train; -1: num_train_epochs passes over the prompts",
    "num_train_epochs": "passes over the prompts, read only when max_steps is -1",
    "shuffle_dataset": "draw prompts in a seeded random order each epoch (false: the dataset's order)",
    "learning_rate": "AdamW learning rate (TRL's 1e-6 is small for a 135M model; the built-in job uses 3e-5)",
    "lr_scheduler_type": "transformers scheduler name: linear, constant, cosine, …",
    "lr_scheduler_kwargs": "extra scheduler arguments, JSON, e.g. '{\"num_cycles\": 2}'",
    "optim": "transformers optimizer name (adamw_torch, adafactor, sgd, …)",
    "optim_args": "optimizer arguments as key=value,key=value",
    "warmup_ratio": "warm-up as a fraction of max_steps (older spelling of a fractional warmup_steps)",
    "warmup_steps": "warm-up optimizer steps; below 1: a fraction of max_steps",
    "weight_decay": "AdamW weight decay",
    "adam_beta1": "AdamW beta1",
    "adam_beta2": "AdamW beta2",
    "adam_epsilon": "AdamW epsilon",
    "max_grad_norm": "clip the gradient norm to this (0: no clipping)",
    "per_device_train_batch_size": "completions per micro-batch per process",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "num_generations": "G: completions sampled per prompt (a group)",
    "generation_batch_size": "completions per rollout on all processes (default: one optimizer step's worth)",
    "steps_per_generation": "micro-batches per rollout per process (alternative to generation_batch_size)",
    "num_iterations": "mu: optimizer passes over each rollout (reuse)",
    "max_prompt_length": "prompt tokens kept (the left part is cut); none: no limit",
    "max_completion_length": "most tokens per completion",
    "temperature": "sampling temperature (log-probs are taken at it)",
    "top_p": "nucleus sampling: keep the smallest set of tokens reaching this probability (1.0: off)",
    "top_k": "keep the k most likely tokens (0: off)",
    "min_p": "drop tokens below min_p times the top token's probability (none: off)",
    "repetition_penalty": "penalise tokens already in the prompt or completion (1.0: off; padding never counts)",
    "generation_kwargs": "sampling settings as JSON, e.g. '{\"top_k\": 20}' (TRL's field: the engine's sampling keys, stop strings and ids, penalties and masks)",
    "chat_template_kwargs": "extra chat-template variables as JSON, e.g. '{\"enable_thinking\": false}'",
    "generation_backend": "fastgrpo (own sampler), transformers (generate) or vllm (what use_vllm sets)",
    "use_vllm": "sample with vLLM (TRL's field; README 'vLLM')",
    "vllm_mode": "colocate (one engine per training process) or server (`fastgrpo vllm-serve`, started by you)",
    "vllm_model_impl": "vLLM's model implementation: vllm or transformers",
    "vllm_enable_sleep_mode": "free the engine's memory between rollouts (refused: not on CPU, not driven on CUDA yet)",
    "vllm_server_base_url": "the server's URL, e.g. http://127.0.0.1:8000 (none: http://host:port)",
    "vllm_server_host": "the server's host when no base URL is given",
    "vllm_server_port": "the server's port when no base URL is given",
    "vllm_server_timeout": "seconds to wait for the server at start-up and for each request",
    "vllm_group_port": "the NCCL weight-transfer group's port (server mode on CUDA)",
    "vllm_gpu_memory_utilization": "the colocated engine's share of GPU memory (on CPU: of RAM)",
    "vllm_max_model_length": "the colocated engine's context in tokens (none: max_prompt_length + max_completion_length)",
    "vllm_tensor_parallel_size": "GPUs per colocated engine (1 here; a bigger engine: fastgrpo vllm-serve)",
    "vllm_structured_outputs_regex": "a regex every completion matches (vLLM's structured outputs; vLLM's log-probs then go unused)",
    "loss_type": "objective: grpo, bnpo, dapo, dr_grpo, cispo or sapo (README, 'The objective family')",
    "epsilon": "epsilon: lower clip of the ratio at 1 - epsilon",
    "epsilon_high": "upper clip at 1 + epsilon_high (default: epsilon); cispo: the importance weight's bound itself (default 5.0)",
    "delta": "two-sided clip: the ratio is also capped at delta for negative advantages",
    "importance_sampling_level": "token or sequence (GSPO) importance ratio",
    "sapo_temperature_pos": "SAPO gate temperature for positive advantages",
    "sapo_temperature_neg": "SAPO gate temperature for negative advantages",
    "beta": "beta: weight of KL(pi_theta || pi_ref); 0 loads no reference model",
    "use_bias_correction_kl": "multiply the KL term by the importance ratio (TRL's default)",
    "kl_estimator": "k3 (Schulman's estimator) or full (exact, over the vocabulary)",
    "sync_ref_model": "TR-DPO: move pi_ref towards pi_theta every ref_model_sync_steps",
    "ref_model_mixup_alpha": "TR-DPO mixing weight alpha",
    "ref_model_sync_steps": "TR-DPO: optimizer steps between reference updates",
    "top_entropy_quantile": "train only on this top fraction of tokens by entropy (1.0: all)",
    "mask_truncated_completions": "leave completions cut at max_completion_length out of the loss",
    "target_kl": "stop reusing a rollout once KL(pi_theta || pi_old) exceeds this (none: never)",
    "reward_weights": "one weight per reward, e.g. --reward_weights 1 0.5",
    "scale_rewards": "divide advantages by the std of the group, the batch, or none",
    "multi_objective_aggregation": "sum_then_normalize or normalize_then_sum over several rewards",
    "disable_dropout": "turn dropout off (pi_old must be reproducible)",
    "bf16": "bfloat16 mixed precision (default: where the device supports it)",
    "tf32": "fp32 matmuls in TF32 on an Ampere or newer GPU (true), or not (false); default: torch's setting",
    "gradient_checkpointing": "recompute activations in the backward pass to save memory",
    "gradient_checkpointing_kwargs": "gradient_checkpointing_enable arguments as JSON",
    "activation_checkpointing": "transformers 5.25's name for gradient_checkpointing; when given it wins",
    "activation_checkpointing_kwargs": "transformers 5.25's name for gradient_checkpointing_kwargs; when given it wins",
    "model_init_kwargs": "from_pretrained arguments as JSON, e.g. '{\"dtype\": \"bfloat16\"}'",
    "trust_remote_code": "run the code a model's folder defines (its config's auto_map): the policy, its tokenizer and reward models",
    "logging_strategy": "steps (every logging_steps), epoch (at each pass's end) or no (only train()'s closing summary)",
    "logging_steps": "optimizer steps between log lines",
    "logging_first_step": "also log after the first optimizer step",
    "log_completions": "write every completion to completions.jsonl, TRL's completions/*.parquet table at each log, and print a few",
    "num_completions_to_print": "completions printed per log (0: none)",
    "log_unique_prompts": "the completions table sent to wandb / trackio keeps one row per prompt (the parquet file keeps all)",
    "resume_from_checkpoint": "resume: true (the latest checkpoint in output_dir) or a checkpoint folder; `fastgrpo train` passes it to train() as TRL's script does (--resume is the short form)",
    "report_to": "trackers: none, all (every installed one) or any of transformers' (tensorboard, wandb, trackio, mlflow, comet_ml, swanlab, …)",
    "save_strategy": "steps (every save_steps), epoch, best (when an evaluation improves metric_for_best_model) or no",
    "save_steps": "optimizer steps between checkpoints",
    "save_total_limit": "checkpoints kept, the oldest deleted first; none: all",
    "eval_strategy": "no, steps (every eval_steps) or epoch",
    "eval_steps": "optimizer steps between evaluations (default: logging_steps)",
    "eval_on_start": "evaluate once before the first step",
    "eval_delay": "no scheduled evaluation before this many steps (eval_strategy steps) or epochs (epoch)",
    "per_device_eval_batch_size": "completions per evaluation micro-batch",
    "metric_for_best_model": "metric that picks the best checkpoint, e.g. eval_reward",
    "greater_is_better": "whether a larger metric_for_best_model is better (default: unless it ends in loss)",
    "load_best_model_at_end": "after training, load the best checkpoint's weights (metric_for_best_model, default loss) into the model",
    "disable_tqdm": "hide the progress bar",
    "use_cpu": "train on the CPU even where a GPU is (accelerate's cpu=True); TRL's CPU scripts set it",
    "vespo_k_pos": "VESPO: Gamma shape k for positive advantages",
    "vespo_lambda_pos": "VESPO: Gamma rate lambda for positive advantages",
    "vespo_k_neg": "VESPO: Gamma shape k for negative advantages",
    "vespo_lambda_neg": "VESPO: Gamma rate lambda for negative advantages",
    "entropy_coef": "entropy bonus c: loss - c * mean entropy over the policy tokens (0: off; adaptive: the initial c)",
    "use_adaptive_entropy": "Skywork-OR1: raise c by entropy_coef_delta while the entropy is below entropy_target, else lower it",
    "entropy_coef_min": "adaptive entropy bonus: the smallest c",
    "entropy_coef_max": "adaptive entropy bonus: the largest c",
    "entropy_coef_delta": "adaptive entropy bonus: change of c per optimizer step",
    "entropy_target": "adaptive entropy bonus: target mean entropy in nats",
    "vllm_importance_sampling_correction": "correct for the sampler's own (bf16) weights with TRL's importance-sampling ratio",
    "vllm_importance_sampling_mode": "token_truncate, token_mask, sequence_truncate or sequence_mask (TRL's modes)",
    "vllm_importance_sampling_clip_max": "the sampler importance ratio's upper bound C_max",
    "vllm_importance_sampling_clip_min": "the sampler importance ratio's lower bound C_min (none: no lower bound)",
    "vllm_importance_sampling_cap": "deprecated spelling of vllm_importance_sampling_clip_max (TRL)",
    "off_policy_mask_threshold": "DeepSeek-V3.2 off-policy mask: drop sequences with negative advantage whose KL to the sampler passes this (none: off)",
    "filter_groups": "DAPO dynamic sampling: train only on groups whose rewards differ, sampling more prompts until the rollout is full",
    "filter_groups_metric": "dynamic sampling: the reward whose spread counts, or module:function taking a group's rewards (default: what the advantage uses)",
    "max_num_gen_batches": "dynamic sampling: the most sampling rounds per rollout, then train on what there is",
    "num_generations_eval": "completions per prompt in evaluation (default: num_generations)",
    "max_tool_calling_iterations": "agents: rounds of tool calls per completion (none: until max_completion_length ends them)",
    "filter_groups_max_age": "dynamic sampling: rollouts a carried-over group may wait (0: drop the surplus)",
    "max_staleness": "overlap generation with training on the vLLM server: rollouts made ahead, at most this many weight versions old (none: the synchronous loop; 0: no lookahead)",
    "weight_sync_steps": "optimizer steps between weight pushes to the vLLM engine",
    "max_inflight_tasks": "with max_staleness: completions started and not yet trained, at most (-1: max(max_staleness, 1) rollouts)",
    "queue_maxsize": "with max_staleness: completions produced and waiting to be trained, at most",
    "heartbeat_stale_after_s": "with max_staleness: seconds without a rollout or a sign of life from the producer before the run stops",
    "update_token_budget": "tokens per forward/backward of the update: an optimizer step's micro-batches run merged while they fit (exact where the loss's normaliser is the step's; default: per_device_train_batch_size × (max_prompt_length + max_completion_length), four times that under gradient_checkpointing; 0: one pass each)",
    "router_aux_loss_coef": "mixture-of-experts models: weight of the router load-balancing loss (default: the model config's; 0 off)",
}

def training_arguments_fields() -> frozenset[str]:
    """The field names of transformers' `TrainingArguments` (the dataclass's annotated class attributes), read from
    transformers' source: importing the class imports torch, seconds `--help` need not spend.

    Raises:
        StopIteration: a transformers whose training_args.py defines no `TrainingArguments` class.
    """
    with open(importlib.util.find_spec("transformers.training_args").origin) as f:
        tree = ast.parse(f.read())
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments").body
    return frozenset(node.target.id for node in body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name))


def layout_help(parser: argparse.ArgumentParser, job, first: tuple[str, ...], sections: list[tuple[str, str, set[str]]]) -> None:
    """Lay `--help` out in sections: `job` (an argument group added after transformers' `HfArgumentParser` put every
    field in the parser's default group) with the `first` fields after its own flags, then each of `sections`
    (title, description, the fields' names) as its own group, in order, each field where the parser has it.
    A field named in no section stays in the default group, printed before the job's. Only the help changes:
    argparse parses by option string, whatever the group (argparse keeps a group's flags in `_group_actions`)."""
    home = dict.fromkeys(first, job)
    for title, description, names in sections:
        group = parser.add_argument_group(title, description)
        home.update({name: group for name in names if name not in home})
    for action in [a for a in parser._optionals._group_actions if a.dest in home]:  # --x and its --no_x: one dest
        parser._optionals._group_actions.remove(action)
        home[action.dest]._group_actions.append(action)


def did_you_mean(flag: str, known: typing.Iterable[str]) -> str:
    """"; did you mean --x?" naming the known flag closest to a mistyped one (difflib, as `fastgrpo train` does), or ""."""
    close = difflib.get_close_matches(flag.split("=")[0], list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parser_flags(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's flags as its help writes them: HfArgumentParser's `--num_generations`, not its `--num-generations` alias."""
    return [option for action in parser._actions for option in action.option_strings if "_" in option or "-" not in option[2:]]


def one_line_error(parser: argparse.ArgumentParser, message: str) -> typing.NoReturn:
    """argparse's error, as one line and exit 2: no usage dump; an unknown flag names the closest one ("did you mean").

    Set as `parser.error`. Raises SystemExit(2) after printing `<prog>: error: <message>` to stderr.
    """
    hint = ""
    if message.startswith("unrecognized arguments:"):
        flags = [word for word in message.split(":", 1)[1].split() if word.startswith("-")]
        message = f"unknown flag {flags[0]}" if flags else message
        hint = did_you_mean(flags[0], parser_flags(parser)) if flags else ""
    parser.exit(2, f"{parser.prog}: error: {message}{hint} (`{parser.prog} --help` lists the flags)\n")


def load_yaml(stream):
    """`yaml.safe_load`, but a mapping that gives a key twice (`learning_rate:` on two lines) is a `yaml.YAMLError` naming the
    key and its line: YAML requires unique keys, and PyYAML (so `trl grpo --config`) silently keeps the last value."""
    import yaml  # noqa: PLC0415 (only when a recipe is read: `fastgrpo --help` stays light)

    class EachKeyOnce(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            keys = [self.construct_object(key, deep=True) for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]
            for i, key in enumerate(keys):
                if isinstance(key, typing.Hashable) and key in keys[:i]:
                    raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark, f"found the key {key!r} "
                                                            "twice (only the last value would be kept); give each key once", node.value[i][0].start_mark)
            return super().construct_mapping(node, deep)

    return yaml.load(stream, Loader=EachKeyOnce)


def yaml_values_as_flags(values: dict, parser: argparse.ArgumentParser, source: str) -> dict:
    """YAML values typed as `trl grpo --config` types them: text goes through the flag's type, anything else stays.

    TRL's parser sets YAML values as argparse defaults, and argparse converts a
    default that is text with the action's type: `max_grad_norm: "0.5"` is 0.5,
    `bf16: "false"` is False, `lora_target_modules: all-linear` stays text.

    Raises:
        ValueError: text the field's type refuses, naming the field, the type and the value.
    """
    actions = {action.dest: action for action in parser._actions}
    typed = dict(values)
    for name, value in values.items():
        action = actions.get(name)
        if isinstance(value, str) and action is not None and callable(action.type):
            try:
                typed[name] = action.type(value)
            except (TypeError, ValueError, argparse.ArgumentTypeError):
                kind = getattr(action.type, "__name__", "value").replace("string_to_bool", "bool")
                raise ValueError(f"{source}: {name}: expected {kind}, got {value!r} (str).") from None
            if action.choices is not None and typed[name] not in action.choices:
                raise ValueError(f"{source}: {name}: {value!r} is not one of {', '.join(map(str, action.choices))}.")
    return typed


def check_yaml_types(values: dict, fields: tuple, source: str) -> None:
    """Refuse a YAML value whose type does not fit its field in one of the dataclasses `fields` (GRPOConfig and TRL's
    script options, cli.py); a name none of them has is left to the caller.

    Raises:
        ValueError: names the field, the expected type and the value; a bool for a text field (`save_strategy: no`, which
            YAML 1.1 reads as false) says to quote it.
    """
    hints = {name: hint for kind in fields for name, hint in typing.get_type_hints(kind).items()}
    for name, value in values.items():
        if name not in hints:
            continue  # an unknown name: GRPOConfig refuses it, naming the closest field
        kinds = typing.get_args(hints[name]) if typing.get_origin(hints[name]) in (typing.Union, types.UnionType) else (hints[name],)
        # list[float] → list; peft also takes text ("all-linear", a regex), as TRL passes it; reward_funcs: one name, or names with commas
        kinds = tuple(typing.get_origin(k) or k for k in kinds) + ((str,) if name in ("lora_target_modules", "reward_funcs") else ())
        kinds += ALSO_ACCEPTED.get(name, ())
        fits = any(_fits(value, kind) for kind in kinds)
        if not fits:
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            quote = ""  # YAML 1.1 (PyYAML, TRL's parser too) reads `logging_strategy: no` as False
            if isinstance(value, bool) and str in kinds:
                quote = (f"; YAML reads a bare {'yes, on or true' if value else 'no, off or false'} as {str(value).lower()}: quote the text, "
                         f"{name}: \"{'yes' if value else 'no'}\"")
            raise ValueError(f"{source}: {name}: expected {expected}, got {value!r} ({type(value).__name__}){quote}.")


def _fits(value, kind) -> bool:
    """YAML's value against one annotated type: an int is a float too, a bool is neither."""
    if kind is type(None):
        return value is None
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)
