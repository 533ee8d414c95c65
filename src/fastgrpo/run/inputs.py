"""What `GRPOTrainer(...)` is given, checked before any model loads: argument kinds, datasets, rewards.

Every check here costs no model load and no compute, so a wrong argument is a
one-line error at once (docs/reliability.md). The trainer builds the rest
(accelerator, policy, optimizer) from what this returns.

Not here: GRPOConfig's own field checks (config/checks.py), loading models (model/loading.py).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
from transformers import PreTrainedTokenizerBase

from ..rollout.producers import AgentInputs, check_agent_datasets, check_agent_inputs, check_prompt_rendering
from ..config import GRPOConfig
from .callbacks import check_callbacks, check_early_stopping
from .checkpoints import check_saveable
from .dataset_kinds import check_train_dataset, eval_sets
from .datasets import prompt_shapes
from .evaluation import check_best_metric, loss_keys
from .runs import run_setup
from ..rollout.group_filter import resolve_filter
from ..model.loading import init_kwargs
from ..model.peft_checks import check_peft_inputs
from ..model.sharding import fsdp_requested
from ..model.optimizers import check_optimizer_name, check_scheduler, optimizer_factory
from ..rollout.reward_models import RewardModel
from ..rollout.rewards import check_columns, check_reward_arguments, resolve_reward, reward_names
from ..rollout.trl_rewards import check_trl_rewards


class TrainerInputs(NamedTuple):
    """The trainer's arguments once checked and resolved."""

    args: GRPOConfig
    eval_sets: dict | None  # {metric prefix: rows}, or None without an eval_dataset
    reward_funcs: list  # R callables (functions and wrapped reward models)
    reward_names: list[str]  # R distinct log names
    reward_processing_classes: list  # R: each reward model's tokenizer, None for functions (TRL's attribute)
    reward_weights: list[float]  # R
    train_dataset: object  # as given, or TRL's placeholder when an environment owns the data
    agents: AgentInputs  # tools, environments, rollout_func (rollout/producers.py)
    optimizers: tuple  # (optimizer or None, lr_scheduler or None): the caller's, as Trainer's `optimizers`
    callbacks: list  # TrainerCallback instances or classes
    setup: dict  # reward functions, tools, environments, rollout_func by name (runs.run_setup: saved, compared on resume)
    check_tokenizer: Callable  # tokenizer → None: renders each dataset's sample chat prompts (producers.check_prompt_rendering)


# TRL 1.16 GRPOTrainer's and transformers Trainer's methods a subclass overrides to change how it trains, evaluates or
# saves, none of which fastgrpo's loop calls (rollout/, update/, run/evaluation.py, run/checkpoints.py do that work; the
# optimizer's class comes from transformers' own Trainer.get_optimizer_cls_and_kwargs): an override would be ignored
TRL_HOOKS = (
    "compute_loss", "_compute_loss", "training_step", "prediction_step", "_prepare_inputs", "_generate_and_score_completions",
    "_generate", "_generate_single_turn", "_tool_call_loop", "_calculate_rewards", "_tokenize_prompts",
    "_get_per_token_logps_and_entropies", "get_gamma_weights", "get_train_dataloader", "get_eval_dataloader", "_get_train_sampler",
    "_get_eval_sampler", "get_test_dataloader", "create_optimizer", "create_scheduler", "create_optimizer_and_scheduler", "evaluation_loop",
    "_inner_training_loop", "_maybe_log_save_evaluate", "_save_checkpoint", "_load_optimizer_and_scheduler",
    "_save", "_load_from_checkpoint", "get_decay_parameter_names", "get_optimizer_cls_and_kwargs", "compute_loss_context_manager",
)


def check_trainer_class(trainer_class: type) -> None:
    """Refuse a `GRPOTrainer` subclass that overrides one of `TRL_HOOKS`: TRL's trainer calls them, fastgrpo's never
    does, so the subclass's change would be silently ignored (a custom loss trained as the stock one).

    fastgrpo's own classes define some of them for user code to call (`get_train_dataloader`, `create_optimizer`, …;
    refused ones such as `compute_loss` raise), never to be called by its loop: only a definition in a class outside
    fastgrpo's modules counts as an override.

    Raises:
        TypeError: naming the class, the methods and what to use instead.
    """
    outside = [c for c in trainer_class.__mro__ if not c.__module__.startswith("fastgrpo.")]
    overridden = [name for name in TRL_HOOKS if any(name in vars(c) for c in outside)]
    if overridden:
        raise TypeError(
            f"{trainer_class.__name__} overrides {', '.join(overridden)}: TRL's GRPOTrainer calls "
            f"{'these' if len(overridden) > 1 else 'it'} while training, fastgrpo's loop never does, so the override would be "
            "silently ignored. Remove it and make the change with what fastgrpo calls: GRPOConfig's loss fields (loss_type, beta, "
            "epsilon, …), a reward function, a rollout_func, or a transformers TrainerCallback."
        )


def default_output_dir(model, suffix: str) -> str:
    """TRL's `output_dir` when no args are given: the model's name or folder, its last part, + "-" + suffix
    ("Qwen/Qwen2-0.5B-Instruct" → "Qwen2-0.5B-Instruct-GRPO"); for a model instance its config's `_name_or_path`
    (TRL's `get_config_model_id`: "" for a model built from a config, so "-GRPO", as TRL)."""
    name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return f"{name.rstrip('/').split('/')[-1]}-{suffix}"


def check_trainer_inputs(
    model, reward_funcs, args, train_dataset, eval_dataset, reward_processing_classes, peft_config,
    tools=None, environment_factory=None, rollout_func=None, optimizers=(None, None), quantization_config=None, callbacks=None,
    trainer_class: type | None = None,
) -> TrainerInputs:
    """Check and resolve `GRPOTrainer`'s arguments (TRL's meanings) before anything loads; `trainer_class`: the class
    being built (`check_trainer_class`).

    Raises:
        TypeError: a subclass overriding a TRL method fastgrpo never calls (`check_trainer_class`); `args` that is not a fastgrpo GRPOConfig, a model or reward of the wrong kind, a
            reward_processing_classes entry that is neither a tokenizer nor None, callbacks that are not a list of
            TrainerCallbacks (callbacks.check_callbacks); agent arguments of the wrong kind (producers.check_agent_inputs).
        ValueError: no reward function, no or an unreadable dataset, a reserved column,
            reward_processing_classes or reward_weights whose count does not match the
            reward functions, reward_weights all 0, a peft_config that cannot apply (model.peft_checks.check_peft_inputs), a
            filter_groups_metric that is no reward name or importable "module:function"; `optimizers` that cannot
            drive this model (`check_optimizers`); `quantization_config` also set in model_init_kwargs (TRL's error);
            a schedule transformers cannot build (optimizers.check_scheduler); eval_strategy or eval_on_start
            without an eval_dataset (transformers' error); a metric_for_best_model the eval sets do not report
            (evaluation.check_best_metric); TRL's math rewards without math_verify, its chat rewards over text prompts
            (trl_rewards.check_trl_rewards); an EarlyStoppingCallback without metric_for_best_model or
            evaluation (callbacks.check_early_stopping); agent arguments or datasets tools/environments cannot use
            (producers.check_agent_inputs, producers.check_agent_datasets); a chat prompt a reward model's chat
            template cannot render (RewardModel.check_renders; the policy's tokenizer is checked by `check_tokenizer`
            once it loads, before the model); a config value pickle cannot write (checkpoints.check_saveable).
        EnvironmentFunctionError: an environment's factory raised.
    Warns:
        UserWarning: `quantization_config` for an already built model (ignored, as TRL warns); `max_tool_calling_iterations`
            without tools or an environment.
    """
    if trainer_class is not None:
        check_trainer_class(trainer_class)
    if args is not None and not isinstance(args, GRPOConfig):
        raise TypeError(
            f"args has type {type(args).__module__}.{type(args).__name__}; give a fastgrpo GRPOConfig "
            "(`from fastgrpo import GRPOConfig`: TRL's field names, so only the import changes)."
        )
    if not isinstance(model, (str, os.PathLike, torch.nn.Module)):
        raise TypeError(f"model has type {type(model).__name__}; give a model name or folder (text), a .gguf file, or a PreTrainedModel.")
    a = with_quantization(args if args is not None else GRPOConfig(default_output_dir(model, "GRPO")), model, quantization_config,
                          peft_config is not None)
    check_saveable(a)  # every checkpoint and save_model pickle it
    callbacks = check_callbacks(callbacks)
    check_early_stopping(callbacks, a.metric_for_best_model, a.eval_strategy)
    agents = check_agent_inputs(tools, environment_factory, rollout_func, train_dataset, a.max_steps, a.prompts_per_rollout,
                                a.max_tool_calling_iterations)
    train_dataset = agents.train_dataset
    no_rewards = reward_funcs is None or (isinstance(reward_funcs, (list, tuple)) and not reward_funcs)
    if no_rewards and not agents.reward_funcs:
        raise ValueError(
            "reward_funcs is empty; give at least one reward function (TRL's protocol, see rewards.py) or reward model, "
            "or an environment_factory whose environment defines get_reward()."
        )
    check_optimizer_name(a.optim)
    if a.optim_target_modules is None:  # otherwise the factory needs the model's modules
        optimizer_factory(a, None)
    if eval_dataset is None and (a.eval_strategy != "no" or a.eval_on_start):  # transformers' Trainer refuses it too
        raise ValueError(
            f"eval_strategy={a.eval_strategy!r}{' with eval_on_start' if a.eval_on_start else ''} but no eval_dataset was passed; "
            "pass an eval_dataset, or set eval_strategy='no' and eval_on_start=False."
        )
    if train_dataset is None:
        raise ValueError("train_dataset is required: a datasets.Dataset (or list of dicts) with a 'prompt' column.")
    check_train_dataset(train_dataset, a.max_steps)
    sets = eval_sets(eval_dataset) if eval_dataset is not None else None
    named_sets = [("train_dataset", train_dataset), *((f"{k} dataset", v) for k, v in (sets or {}).items())]
    for name, rows in named_sets:
        check_columns(rows, name, agents.environments is not None)
    check_agent_datasets(agents, named_sets)
    funcs = [] if no_rewards else list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if reward_processing_classes is None:
        procs = [None] * len(funcs)
    else:  # TRL's rule: a single one stands for a list of one
        procs = list(reward_processing_classes) if isinstance(reward_processing_classes, (list, tuple)) else [reward_processing_classes]
    if len(procs) != len(funcs):
        raise ValueError(
            f"reward_processing_classes has {len(procs)} entries for {len(funcs)} reward_funcs; the numbers must match "
            "(one per entry, None for functions)."
        )
    for i, p in enumerate(procs):
        if p is not None and not isinstance(p, PreTrainedTokenizerBase):
            where = f"reward_processing_classes[{i}]" if isinstance(reward_processing_classes, (list, tuple)) else "reward_processing_classes"
            raise TypeError(f"{where} is {p!r:.80} ({type(p).__name__}); give the reward model's tokenizer (e.g. "
                            "AutoTokenizer.from_pretrained(name)), or None to load the reward model's own.")
    resolved = [resolve_reward(f, p, init_kwargs(a.model_init_kwargs, a.trust_remote_code)) for f, p in zip(funcs, procs)]
    weights = a.reward_weights if a.reward_weights is not None else [1.0] * len(resolved)
    if len(weights) != len(resolved):
        raise ValueError(f"reward_weights has {len(weights)} values for {len(resolved)} reward functions; give one weight per function.")
    resolved, procs, weights = resolved + agents.reward_funcs, procs + [None] * len(agents.reward_funcs), [*weights, *[1.0] * len(agents.reward_funcs)]
    if not any(weights):  # TRL trains on: every Â is 0, loss and gradient 0 at every step
        raise ValueError(f"reward_weights={list(weights)} are all 0: every advantage would be 0 and the policy would learn nothing "
                         "from its rewards; give a nonzero weight to at least one reward function.")
    for name, rows in named_sets:  # a rollout_func's extra fields reach the rewards too: their names are not known here
        check_reward_arguments(resolved, reward_names(resolved), rows, name, agents.environments is not None, agents.rollout_func is not None)
    check_trl_rewards(resolved, reward_names(resolved), named_sets)  # TRL's math rewards need math_verify; its chat rewards, chat prompts
    if sets is not None:  # without eval sets it is read only by evaluate(eval_dataset=…), whose sets are not known here
        check_best_metric(a.metric_for_best_model, list(sets), reward_names(resolved), loss_keys(a.loss_type, a.beta))
    check_peft_inputs(model, peft_config, a.sync_ref_model)
    pair = check_optimizers(optimizers, model, peft_config)
    if pair[1] is None:
        check_scheduler(a)
    if a.filter_groups:  # a filter_groups_metric that names nothing fails here, not after the model loads
        resolve_filter(a.filter_groups_metric, reward_names(resolved), torch.tensor(weights), a.multi_objective_aggregation)
    samples = {name: prompt_shapes(rows) for name, rows in named_sets}  # each chat shape's first prompt, rendered before loading
    for f in resolved:
        if isinstance(f, RewardModel):
            f.check_renders(samples, a.chat_template_kwargs)
    tokenizers = [f.tokenizer if isinstance(f, RewardModel) else p for f, p in zip(resolved, procs)]
    names = reward_names(resolved)
    return TrainerInputs(a, sets, resolved, names, tokenizers, list(weights), train_dataset, agents, pair, callbacks, run_setup(names, agents, train_dataset),
                         partial(check_prompt_rendering, agents, samples, a.chat_template_kwargs))


def checked_eval_sets(eval_dataset, reward_funcs: list, names: list[str], agents: AgentInputs) -> dict:
    """`dataset_kinds.eval_sets(eval_dataset)` with the checks `check_trainer_inputs` runs on the eval sets it is given,
    for sets given later (`trainer.eval_dataset = …`, `evaluate(eval_dataset=…)`, `predict(…)`), before they are
    sampled: a column the reward protocol reserves, a reward argument no column fills, prompts that tools or
    environments cannot use. (A set without a column a reward function needs failed at its first scoring: set as
    trainer.eval_dataset under eval_strategy, after training steps.)

    Args:
        eval_dataset: rows, or a dict / DatasetDict of them.
        reward_funcs, names: the trainer's reward functions (an environment's included) and their log names.
        agents: the trainer's checked agent arguments.
    Returns:
        {"eval[_<name>]": rows}, as `eval_sets` returns them.
    Raises:
        ValueError, TypeError: `eval_sets`' errors, and `check_trainer_inputs`' for an eval set, naming the set.
    """
    sets, environments = eval_sets(eval_dataset), agents.environments is not None
    named = [(f"{k} dataset", rows) for k, rows in sets.items()]
    for name, rows in named:
        check_columns(rows, name, environments)
        check_reward_arguments(reward_funcs, names, rows, name, environments, agents.rollout_func is not None)
    check_agent_datasets(agents, named)
    return sets


def with_quantization(args: GRPOConfig, model, quantization_config, adapters: bool) -> GRPOConfig:
    """`args` with the trainer's `quantization_config` in `model_init_kwargs` when the model loads from a name (TRL 1.16's rule).

    The config reaches `from_pretrained` as TRL passes it (e.g. a `BitsAndBytesConfig` with `peft_config` for QLoRA);
    transformers raises if its package is missing. `args` itself is not changed. `adapters`: a `peft_config` was given.
    Raises:
        ValueError: `quantization_config` given both here and in `args.model_init_kwargs`; a bitsandbytes config (either
            place) for a model loaded from a name without `peft_config`: its quantized weights cannot train
            (transformers' Trainer refuses "purely quantized models" once the model has loaded).
    Warns:
        UserWarning: a model already built (the config is ignored).
    """
    kwargs = dict(args.model_init_kwargs or {})
    if quantization_config is not None and isinstance(model, torch.nn.Module):
        warnings.warn("quantization_config is set but the model is already instantiated; quantization_config is ignored.", stacklevel=4)
        return args
    if quantization_config is not None and "quantization_config" in kwargs:
        raise ValueError("quantization_config is set both as a trainer argument and in args.model_init_kwargs; set it in one place, preferably the trainer argument (TRL's rule).")
    quantized = quantization_config if quantization_config is not None else kwargs.get("quantization_config")
    method = quantized.get("quant_method") if isinstance(quantized, dict) else getattr(quantized, "quant_method", None)
    if method == "bitsandbytes" and not adapters and not isinstance(model, torch.nn.Module):
        raise ValueError(f"quantization_config loads {model!r} quantized by bitsandbytes, but no peft_config was given: quantized weights do "
                         "not train. Add peft_config=LoraConfig(…) (QLoRA; --use_peft on the command line), or drop the quantization.")
    if quantization_config is None:
        return args
    merged = copy.copy(args)  # the fields as they are (a replace() would re-derive the batch fields and refuse them)
    merged.model_init_kwargs = {**kwargs, "quantization_config": quantization_config}
    return merged


def check_optimizers(optimizers, model, peft_config) -> tuple:
    """The trainer's `optimizers=(optimizer, lr_scheduler)` (transformers.Trainer's argument), checked before any model loads.

    Either may be None: no optimizer means `args.optim`'s (model/optimizers.py), no scheduler means
    `args.lr_scheduler_type`'s over the optimizer (run/setup.py). A given optimizer must be over the very
    model passed in (its parameters are the ones trained and checkpointed); on resume it keeps its own
    saved settings (learning rates, betas), as Trainer restores them, where args' are applied only to
    an optimizer built from args.
    Returns:
        (optimizer or None, lr_scheduler or None).
    Raises:
        TypeError: not a pair; an optimizer that is no `torch.optim.Optimizer`; a scheduler that is no `torch.optim.lr_scheduler.LRScheduler`.
        ValueError: an optimizer with a model given by name, with `peft_config` (peft makes new parameters) or with
            FSDP (transformers' rule); parameters that are not the model's; a scheduler without its optimizer or over
            another one; ReduceLROnPlateau (stepped on a metric).
    """
    if not isinstance(optimizers, (tuple, list)) or len(optimizers) != 2:
        raise TypeError(f"optimizers has type {type(optimizers).__name__}{'' if not isinstance(optimizers, (tuple, list)) else f' of length {len(optimizers)}'}; "
                        "give a pair (optimizer, lr_scheduler), either may be None (transformers.Trainer's argument; default (None, None)).")
    optimizer, scheduler = optimizers
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizers[0] has type {type(optimizer).__name__}; give a torch.optim.Optimizer built over the model's parameters, or None for args.optim's.")
    if scheduler is not None and not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise TypeError(f"optimizers[1] has type {type(scheduler).__name__}; give a torch.optim.lr_scheduler.LRScheduler (e.g. LambdaLR), or None for args.lr_scheduler_type's.")
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError("optimizers[1] is a ReduceLROnPlateau, which steps on a metric the GRPO loop does not have at each optimizer step; "
                         "give a scheduler stepped once per optimizer step (LambdaLR, StepLR, CosineAnnealingLR, …) or set lr_scheduler_type.")
    if scheduler is not None and optimizer is None:
        raise ValueError("optimizers=(None, lr_scheduler): a scheduler drives the optimizer it was built over; pass that optimizer too.")
    if scheduler is not None and scheduler.optimizer is not optimizer:
        raise ValueError("optimizers[1] schedules another optimizer than optimizers[0]; build the scheduler over the optimizer you pass, and pass both.")
    if optimizer is None:
        return None, None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"optimizers=(optimizer, ...) with model={model!r}, a name: the optimizer must be over the model it trains; load the model first and pass it.")
    if peft_config is not None:
        raise ValueError("optimizers=(optimizer, ...) with peft_config: peft creates the adapter parameters after your optimizer; pass a peft.PeftModel with an optimizer over its trainable parameters, or leave optimizers to args.optim.")
    if fsdp_requested():
        raise ValueError("optimizers=(optimizer, ...) under FSDP: the optimizer must be built over the sharded parameters (transformers' rule); leave optimizers to args.optim.")
    owned = {id(p) for p in model.parameters()}
    foreign = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in owned)
    if foreign:
        raise ValueError(f"optimizers[0] holds {foreign} parameters that are not the model's; build it over model.parameters() of the model you pass.")
    return optimizer, scheduler
