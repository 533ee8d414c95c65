"""`GRPOConfig`'s checks: the type of every field, each value and combination, and TRL's warnings.

Pure functions of a built config (`c`), called once from `GRPOConfig.__post_init__`
(config/grpo_config.py), so config/grpo_config.py holds the fields and this module the rules. Every
refusal is one sentence naming the value and the fix, raised before any model
is loaded; the warnings are TRL's own, word for word where TRL warns.

Not here: the fields and their defaults (config/grpo_config.py), TRL's fields that fastgrpo
only accepts or refuses (config/trl_fields.py), the vLLM fields (config/vllm_checks.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import warnings

from .report_to import check as check_report_to
from .vllm_checks import check_vllm

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
# Objectives whose importance weight is defined per token (no sequence-level form);
# vespo forms its own sequence weight from the per-token ratios.
TOKEN_ONLY_LOSS_TYPES = ("cispo", "sapo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
# Fields that take a dict, or its JSON text (from the command line), as transformers' TrainingArguments do.
DICT_FIELDS = ("lr_scheduler_kwargs", "generation_kwargs", "chat_template_kwargs", "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs",
               "model_init_kwargs")
STRATEGIES = ("no", "steps", "epoch")  # eval_strategy / logging_strategy (transformers' IntervalStrategy)
SAVE_STRATEGIES = (*STRATEGIES, "best")  # transformers' SaveStrategy: "best" saves when a scheduled evaluation finds a new best
# apply_chat_template's own arguments that the trainer sets (chat_template_kwargs carries the template's variables only)
TEMPLATE_ARGUMENTS = {"conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
                      "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask"}
KL_ESTIMATORS = ("k3", "full")
GENERATION_BACKENDS = ("fastgrpo", "transformers", "vllm")  # generation/build.py's backends
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's vllm_importance_sampling_mode values
# torch.utils.checkpoint's determinism_check values ("currently these are the only two supported values", its docstring).
DETERMINISM_CHECKS = ("default", "none")


def check_checkpointing_kwargs(kwargs: dict | None) -> None:
    """Refuse gradient_checkpointing_kwargs that torch.utils.checkpoint would misread, or reject only in the first backward.

    The keys are `torch.utils.checkpoint.checkpoint`'s keyword arguments in the installed torch (its
    keyword-only parameters and `preserve_rng_state`, which it pops from **kwargs); any other key would
    reach the layer's forward, which ignores it, so a misspelt `use_reentrant` would silently mean its
    default. The values: a bool where torch's default is one (`debug`, `early_stop`, `preserve_rng_state`;
    torch reads any other value by its truth, so the string "false" would mean True), a bool or None for
    `use_reentrant`, a callable `context_fn`, `determinism_check` in DETERMINISM_CHECKS, and torch's own
    combination rules: `context_fn`/`debug` only non-reentrant, `debug=True` with no `context_fn`.
    Missing `use_reentrant` means False (what transformers and fastgrpo pass), None is torch's reentrant default.

    Checked whether or not gradient_checkpointing is on (a value set is a value meant), from
    GRPOConfig.__post_init__ and again by model/checkpointing.enable_gradient_checkpointing. torch is
    imported only when there is something to check, so an empty config stays fast to build.

    Raises:
        ValueError: naming the key or value and the fix.
    """
    if not kwargs:
        return
    import inspect

    import torch
    from torch.utils.checkpoint import checkpoint

    parameters = {name: p.default for name, p in inspect.signature(checkpoint).parameters.items() if p.kind is p.KEYWORD_ONLY}
    parameters["preserve_rng_state"] = True
    if unknown := sorted(set(kwargs) - set(parameters)):
        raise ValueError(
            f"gradient_checkpointing_kwargs has {', '.join(map(repr, unknown))}, which torch.utils.checkpoint does not take; "
            f"use {', '.join(parameters)} (torch {torch.__version__})."
        )
    for name, value in kwargs.items():
        if name == "use_reentrant":
            ok, fix = isinstance(value, (bool, type(None))), "use True or False (None: torch's reentrant default)"
        elif name == "context_fn":
            ok, fix = callable(value), "give a function returning two context managers (torch.utils.checkpoint's context_fn), from Python"
        elif name == "determinism_check":
            ok, fix = value in DETERMINISM_CHECKS, f"use {' or '.join(map(repr, DETERMINISM_CHECKS))}"
        else:
            ok, fix = isinstance(value, bool) or not isinstance(parameters[name], bool), "use true or false, not a string or number"
        if not ok:
            raise ValueError(f"gradient_checkpointing_kwargs {name}={value!r}: {fix}.")
    if kwargs.get("use_reentrant", False) is not False and ("context_fn" in kwargs or kwargs.get("debug", False)):
        raise ValueError(
            f"gradient_checkpointing_kwargs use_reentrant={kwargs['use_reentrant']!r} with context_fn or debug: torch takes those "
            "only non-reentrant; set use_reentrant=False (the default here) or remove them."
        )
    if kwargs.get("debug", False) and "context_fn" in kwargs:
        raise ValueError("gradient_checkpointing_kwargs debug=True with a context_fn: torch refuses the pair; remove one of them.")


def check_importance_sampling(correction: bool, mode: str, clip_min: float | None, clip_max: float | None) -> None:
    """TRL's checks on the `vllm_importance_sampling_*` fields (GRPOConfig.__post_init__; the maths: algo/sampling_correction.py).

    Raises:
        ValueError: an unknown mode, clip_min ≥ clip_max, a *_truncate mode with no bound, or clip_max ≤ 0 (every weight
            is min(ratio, clip_max): 0 or below zeroes every completion's loss or flips its sign, and the *_mask modes
            drop every ratio above it; TRL accepts it and trains on that).
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode={mode!r}: use one of {', '.join(IMPORTANCE_SAMPLING_MODES)}.")
    if clip_max is not None and not clip_max > 0:
        raise ValueError(f"vllm_importance_sampling_clip_max={clip_max}: the sampler–trainer weight is a ratio of probabilities, "
                         "capped at clip_max: give a positive cap (TRL's default 3.0), or None for no cap.")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(f"vllm_importance_sampling_clip_min ({clip_min}) must be less than vllm_importance_sampling_clip_max ({clip_max}).")
    if correction and mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(
            f"vllm_importance_sampling_mode={mode!r} needs vllm_importance_sampling_clip_min or _clip_max; set one (TRL's default clip_max is 3.0)."
        )


def check_types(c, hints: dict) -> None:
    """Refuse a value of the wrong type, or a NaN/inf number, naming the field — before any arithmetic on it.

    The types are the fields' annotations (int, float, bool, str, dict,
    list, None where allowed); an int is a float, a bool is neither, and a `list[float]`'s items are numbers.
    Infinity is refused too, except `max_grad_norm` (inf: no clipping).
    """
    for f in dataclasses.fields(c):
        kinds = _simple_types(hints[f.name])
        kinds = kinds and kinds + ALSO_ACCEPTED.get(f.name, ())
        value = getattr(c, f.name)
        if kinds is None or (value is None and type(None) in kinds):
            continue
        ok = isinstance(value, tuple(kinds)) and not (isinstance(value, bool) and bool not in kinds)
        if not ok and float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok = True  # an int where a float is expected
        if not ok:
            expected = " or ".join(k.__name__ for k in kinds)
            raise TypeError(f"{f.name}={value!r} has type {type(value).__name__}; give one of type {expected}.")
        if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and f.name != "max_grad_norm")):
            raise ValueError(f"{f.name}={value}: give a finite number.")
        if isinstance(value, list) and list[float] in typing.get_args(hints[f.name]):  # reward_weights=["1"] failed in torch.tensor
            if wrong := [v for v in value if isinstance(v, bool) or not isinstance(v, (int, float))]:
                raise TypeError(f"{f.name}={value!r} holds {wrong[0]!r} ({type(wrong[0]).__name__}); give numbers, e.g. [1.0, 0.5].")
        if isinstance(value, list) and any(isinstance(v, float) and not math.isfinite(v) for v in value):
            raise ValueError(f"{f.name}={value}: every value must be a finite number.")


def validate(c) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    if c.tf32:  # TrainingArguments refuses it as it is built too
        from transformers.utils import is_torch_tf32_available

        need(is_torch_tf32_available(), "tf32=True: TF32 matmuls need an NVIDIA GPU of the Ampere generation or newer, which this "
                                        "machine does not have (transformers refuses it too); remove it, or leave it None.")
    G = c.num_generations
    check_importance_sampling(c.vllm_importance_sampling_correction, c.vllm_importance_sampling_mode,
                              c.vllm_importance_sampling_clip_min, c.vllm_importance_sampling_clip_max)
    need(G >= 2, f"num_generations={G}: a group needs at least 2 completions to compare; use 2 or more.")
    need(c.num_generations_eval is None or c.num_generations_eval >= 1, f"num_generations_eval={c.num_generations_eval}: sample at least 1 completion per eval prompt, or None for num_generations.")
    per_process = c.generation_batch_size // c.world_size
    per_device, steps = c.per_device_train_batch_size, c.steps_per_generation  # generation_batch_size = their product × world_size
    need(
        c.generation_batch_size % (G * c.world_size) == 0,
        f"generation_batch_size={c.generation_batch_size} (per_device_train_batch_size={per_device} × steps_per_generation={steps} × "
        f"{c.world_size} process(es)) does not split into whole groups of num_generations={G} on each process; use a "
        # whole groups on each process and whole optimizer steps (checked above)
        f"generation_batch_size that is a multiple of {_lcm(G * c.world_size, per_device * c.gradient_accumulation_steps * c.world_size)}"
        f"{_group_sizes_that_fit(per_process)} (or, leaving generation_batch_size unset, a per_device_train_batch_size that is a "
        f"multiple of {G // math.gcd(G, steps)}).",
    )
    need(per_process > 0, f"generation_batch_size={c.generation_batch_size} is empty per process.")
    need(c.max_steps == -1 or c.max_steps > 0, f"max_steps={c.max_steps}: use a positive number (or -1 for num_train_epochs).")
    need(c.num_train_epochs > 0, f"num_train_epochs={c.num_train_epochs}: use a positive number.")
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations", "max_completion_length", "per_device_eval_batch_size"):
        need(getattr(c, name) >= 1, f"{name}={getattr(c, name)}: use 1 or more.")
    need(c.update_token_budget is None or c.update_token_budget >= 0,
         f"update_token_budget={c.update_token_budget}: use a token count, 0 for one pass per micro-batch, or leave it unset (None) "
         "for a full-length micro-batch's tokens.")
    need(c.max_tool_calling_iterations is None or c.max_tool_calling_iterations >= 0,
         f"max_tool_calling_iterations={c.max_tool_calling_iterations}: use 0 or more rounds, or None for no limit.")
    need(c.max_prompt_length is None or c.max_prompt_length >= 1, f"max_prompt_length={c.max_prompt_length}: use 1 or more, or None for no limit.")
    need(c.learning_rate > 0, f"learning_rate={c.learning_rate}: use a positive value such as 1e-6.")
    need(0 <= c.warmup_ratio < 1, f"warmup_ratio={c.warmup_ratio}: use a value in [0, 1).")
    need(c.warmup_steps >= 0, f"warmup_steps={c.warmup_steps}: use 0 (none), a fraction below 1, or a step count.")
    need(c.max_grad_norm >= 0, f"max_grad_norm={c.max_grad_norm}: use a positive norm, or 0 for no clipping.")
    for key in ("dtype", "torch_dtype"):  # transformers' loader fails on another name only after the config loads, in torch's words
        dtype = (c.model_init_kwargs or {}).get(key)
        if dtype is not None and dtype != "auto":
            import torch  # noqa: PLC0415 (a dtype to check: the config module loads without torch otherwise)

            need(isinstance(dtype, torch.dtype) or isinstance(getattr(torch, str(dtype), None), torch.dtype),
                 f"model_init_kwargs[{key!r}]={dtype!r}: give 'auto', a torch dtype or its name (float32, bfloat16, float16).")
    for name in ("adam_beta1", "adam_beta2"):  # torch's optimizers refuse these only once the model has loaded, without the field's name
        need(0 <= getattr(c, name) < 1, f"{name}={getattr(c, name)}: use a value in [0, 1), e.g. {0.9 if name == 'adam_beta1' else 0.999}.")
    need(c.adam_epsilon >= 0, f"adam_epsilon={c.adam_epsilon}: use 0 or a small positive value such as 1e-8.")
    need(c.weight_decay >= 0, f"weight_decay={c.weight_decay}: use 0 (none) or a positive value such as 0.01.")
    need(c.temperature > 0, f"temperature={c.temperature}: sampling needs a positive temperature (log-probs are taken at it).")
    need(0 < c.top_p <= 1, f"top_p={c.top_p}: use a value in (0, 1].")
    need(c.top_k >= 0, f"top_k={c.top_k}: use 0 (off) or a positive count.")
    need(c.min_p is None or 0 <= c.min_p <= 1, f"min_p={c.min_p}: use a value in [0, 1] or None.")
    need(c.repetition_penalty > 0, f"repetition_penalty={c.repetition_penalty}: use a positive value (1.0 = off).")
    need(
        c.generation_backend in GENERATION_BACKENDS,
        f"generation_backend={c.generation_backend!r}: use one of {', '.join(GENERATION_BACKENDS)}.",
    )
    check_vllm(c)
    check_async(c)
    need(c.loss_type in LOSS_TYPES, f"loss_type={c.loss_type!r} is unknown; use one of {', '.join(LOSS_TYPES)}.")
    need(0 <= c.epsilon < 1, f"epsilon={c.epsilon}: use a value in [0, 1), e.g. 0.2.")
    need(
        c.epsilon_high >= c.epsilon or c.loss_type == "cispo",
        f"epsilon_high={c.epsilon_high} is below epsilon={c.epsilon}; clip-higher needs epsilon_high ≥ epsilon.",
    )
    need(
        c.delta is None or c.loss_type not in TOKEN_ONLY_LOSS_TYPES,
        f"delta={c.delta} bounds the PPO-clipped ratio; loss_type={c.loss_type!r} has no such ratio, so set delta=None.",
    )
    need(
        c.delta is None or c.delta > 1 + c.epsilon_high,
        f"delta={c.delta} must exceed 1 + epsilon_high = {1 + c.epsilon_high} or it clips inside the trust region; "
        f"use e.g. {1 + c.epsilon_high + 0.8:g}, or None.",
    )
    need(
        c.importance_sampling_level in ("token", "sequence"),
        f"importance_sampling_level={c.importance_sampling_level!r}: use 'token' or 'sequence'.",
    )
    need(c.sapo_temperature_pos > 0 and c.sapo_temperature_neg > 0, "sapo temperatures must be positive, e.g. 1.0 and 1.05.")
    for name in ("vespo_k_pos", "vespo_k_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        need(getattr(c, name) >= 0, f"{name}={getattr(c, name)}: VESPO's kernel w^k·e^(λ(1−w)) needs k, λ ≥ 0; use e.g. 2.0 or 3.0.")
    need(
        c.entropy_coef_min <= c.entropy_coef_max,
        f"entropy_coef_min={c.entropy_coef_min} exceeds entropy_coef_max={c.entropy_coef_max}; use min ≤ max.",
    )
    need(c.entropy_coef_delta >= 0, f"entropy_coef_delta={c.entropy_coef_delta}: use a step ≥ 0, e.g. 0.005.")
    need(c.entropy_target >= 0, f"entropy_target={c.entropy_target}: entropies are ≥ 0 nats; use a target ≥ 0, e.g. 0.2.")
    need(c.beta >= 0, f"beta={c.beta}: use 0 (no π_ref) or a positive KL weight such as 0.04.")
    need(c.kl_estimator in KL_ESTIMATORS, f"kl_estimator={c.kl_estimator!r}: use one of {', '.join(KL_ESTIMATORS)}.")
    need(not c.sync_ref_model or c.beta > 0, "sync_ref_model=True needs a reference model; set beta > 0 or sync_ref_model=False.")
    need(0 <= c.ref_model_mixup_alpha <= 1, f"ref_model_mixup_alpha={c.ref_model_mixup_alpha}: use a value in [0, 1].")
    need(c.ref_model_sync_steps >= 1, f"ref_model_sync_steps={c.ref_model_sync_steps}: use 1 or more.")
    need(0 < c.top_entropy_quantile <= 1, f"top_entropy_quantile={c.top_entropy_quantile}: use a value in (0, 1] (1.0 = all tokens).")
    need(c.target_kl is None or c.target_kl > 0, f"target_kl={c.target_kl}: use a positive value or None.")
    need(c.scale_rewards in SCALE_REWARDS, f"scale_rewards={c.scale_rewards!r}: use one of {', '.join(SCALE_REWARDS)}.")
    need(
        c.multi_objective_aggregation in ("sum_then_normalize", "normalize_then_sum"),
        f"multi_objective_aggregation={c.multi_objective_aggregation!r}: use 'sum_then_normalize' or 'normalize_then_sum'.",
    )
    need(
        c.max_num_gen_batches >= 1,
        f"max_num_gen_batches={c.max_num_gen_batches}: use 1 or more sampling rounds per rollout (verl's 0 = unlimited "
        "could loop forever on prompts whose groups never differ; at the cap fastgrpo trains on what there is).",
    )
    need(c.filter_groups_max_age >= 0, f"filter_groups_max_age={c.filter_groups_max_age}: use 0 (no carry-over) or more rollouts.")
    need(c.seed >= 0 and c.seed < 2**32, f"seed={c.seed}: use a value in [0, 2**32) (numpy's and torch's seeds).")
    need(c.logging_strategy != "steps" or c.logging_steps > 0, f"logging_steps={c.logging_steps}: use a positive number of steps.")
    for name in ("logging_steps", "save_steps", "eval_steps"):  # transformers' rule: a fraction of the run below 1, else whole steps
        value = getattr(c, name)
        need(value is None or value <= 1 or value == int(value), f"{name}={value}: above 1 it counts steps; use a whole number, or a fraction ≤ 1 of the run.")
    need(c.save_steps > 0, f"save_steps={c.save_steps}: use a positive number of steps.")
    need(c.save_total_limit is None or c.save_total_limit >= 1, f"save_total_limit={c.save_total_limit}: keep at least 1, or None.")
    need(c.num_completions_to_print is None or c.num_completions_to_print >= 0, f"num_completions_to_print={c.num_completions_to_print}: "
         "use 0 (no table), a count, or None (every completion); TRL's random.sample raises on a negative one at the first log.")
    for name, allowed in (("save_strategy", SAVE_STRATEGIES), ("eval_strategy", STRATEGIES), ("logging_strategy", STRATEGIES)):
        need(getattr(c, name) in allowed, f"{name}={getattr(c, name)!r}: use one of {', '.join(allowed)} (lower case, as transformers' "
             f"{'SaveStrategy' if name == 'save_strategy' else 'IntervalStrategy'} values).")
    need(c.save_strategy != "best" or c.metric_for_best_model is not None, "save_strategy='best' saves when an evaluation improves on "
         "metric_for_best_model, which is None; name it, e.g. metric_for_best_model='reward' (eval_reward, higher is better) (Trainer's rule).")
    need(c.eval_steps is None or c.eval_steps > 0, f"eval_steps={c.eval_steps}: use a positive number of steps, or None.")
    check_load_best(c)
    check_checkpointing_kwargs(c.gradient_checkpointing_kwargs)
    set_by_trainer = sorted(set(c.chat_template_kwargs or {}) & TEMPLATE_ARGUMENTS)
    need(not set_by_trainer, f"chat_template_kwargs holds {', '.join(map(repr, set_by_trainer))}, which fastgrpo passes apply_chat_template "
         "itself (the generation prompt, the tools, tokenising); keep only your template's own variables, e.g. {\"enable_thinking\": false}.")
    check_report_to(c.report_to)


def check_load_best(c) -> None:
    """load_best_model_at_end=True as transformers' TrainingArguments checks it: every evaluation's weights are saved,
    so the best evaluation has a checkpoint to load; save_strategy="best" saves exactly those, whatever eval_strategy.

    Raises:
        ValueError: eval_strategy and save_strategy differ; with "steps", save_steps not a multiple of eval_steps
            (a fraction of the run and a number of steps mixed, as transformers refuses it too), naming both and the fix.
    """
    if not c.load_best_model_at_end or c.save_strategy == "best":
        return
    if c.eval_strategy != c.save_strategy:
        raise ValueError(f"load_best_model_at_end=True needs eval_strategy and save_strategy to match (transformers' rule: the best "
                         f"evaluation's weights must be saved), but eval_strategy={c.eval_strategy!r}, save_strategy={c.save_strategy!r}; "
                         f"set both to 'steps' (save_steps a multiple of eval_steps) or both to 'epoch', or save_strategy='best'.")
    if c.eval_strategy != "steps" or c.save_steps % c.eval_steps == 0:
        return
    if (c.eval_steps < 1) != (c.save_steps < 1):
        raise ValueError(f"load_best_model_at_end=True needs save_steps to be a multiple of eval_steps, which save_steps={c.save_steps} "
                         f"and eval_steps={c.eval_steps} cannot guarantee, one a fraction of the run and the other steps (transformers' "
                         "rule); give both as steps or both as fractions.")
    # transformers' arithmetic for two fractions, scaled by 1e6: 0.6 and 0.2 pass (0.6 % 0.2 alone is 0.19999…), 0.5 and 0.3 do
    # not. Odd, matched: a passing pair need not give multiples once rounded up to steps (0.5 and 0.25 of 10 steps: 5 and 3).
    if c.eval_steps >= 1 or (c.save_steps * 1_000_000) % (c.eval_steps * 1_000_000) != 0:
        raise ValueError(f"load_best_model_at_end=True needs save_steps to be a multiple of eval_steps (transformers' rule: each "
                         f"checkpoint holds an evaluated step), but save_steps={c.save_steps} is not a multiple of eval_steps="
                         f"{c.eval_steps}; set save_steps to a multiple of {c.eval_steps}.")


def check_async(c) -> None:
    """The overlap's fields (TRL's AsyncGRPOConfig names; rollout/async_producer.py), checked before any model loads.

    Raises:
        ValueError: a negative max_staleness, weight_sync_steps or heartbeat below 1 / 0; max_staleness set without
            the vLLM server (TRL's async trainer samples from one; a colocated engine or the own sampler shares this
            process), with more than one process or with filter_groups (both would run collectives or the policy's
            forward in the producer's thread); max_inflight_tasks (other than -1) or queue_maxsize below one rollout.
    """
    if c.weight_sync_steps < 1:
        raise ValueError(f"weight_sync_steps={c.weight_sync_steps}: use 1 or more optimizer steps between weight pushes.")
    if c.heartbeat_stale_after_s <= 0:
        raise ValueError(f"heartbeat_stale_after_s={c.heartbeat_stale_after_s}: use a positive number of seconds, e.g. 300.")
    if c.max_staleness is None:
        return
    if c.max_staleness < 0:
        raise ValueError(f"max_staleness={c.max_staleness}: use 0 or more weight versions (None: the synchronous loop).")
    if c.generation_backend != "vllm" or c.vllm_mode != "server":
        raise ValueError(f"max_staleness={c.max_staleness} overlaps generation with training on a vLLM server; set use_vllm=True, "
                         "vllm_mode='server' (`fastgrpo vllm-serve`), or max_staleness=None for the synchronous loop.")
    if c.world_size > 1:
        raise ValueError(f"max_staleness={c.max_staleness} with world_size={c.world_size}: the overlap runs in one training process; "
                         "launch one process, or set max_staleness=None.")
    for name, value in (("max_inflight_tasks", c.max_inflight_tasks), ("queue_maxsize", c.queue_maxsize)):
        if value < c.generation_batch_size and not (name == "max_inflight_tasks" and value == -1):
            raise ValueError(f"{name}={value} holds less than one rollout of generation_batch_size={c.generation_batch_size} "
                             f"completions (fastgrpo sends a rollout's prompts together); use {c.generation_batch_size} or more.")
    if c.filter_groups:
        raise ValueError(f"max_staleness={c.max_staleness} with filter_groups=True: DAPO's carried groups need the policy's forward "
                         "in the producer's thread, so the overlap cannot filter groups; set filter_groups=False to overlap "
                         "(`--filter_groups false`: the built-in job of `fastgrpo train` turns it on), or max_staleness=None "
                         "to keep dynamic sampling.")


def warn_like_trl(c) -> None:
    """The questionable combinations TRL's GRPOTrainer warns about (and still runs)."""
    if c.loss_type == "luspo" and c.importance_sampling_level != "sequence":
        warnings.warn(
            "loss_type='luspo' scales GSPO's sequence-level loss by its length; set importance_sampling_level="
            "'sequence' to mirror the paper's setup (token level sums per-token clipped terms per sequence).",
            stacklevel=5,
        )
    if c.loss_type == "vespo" and c.importance_sampling_level != "token":
        warnings.warn("VESPO computes sequence-level importance weights internally. `importance_sampling_level` should be "
                      "set to `'token'` (the default).", stacklevel=5)
    if c.importance_sampling_level == "sequence" and c.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        warnings.warn(
            f"importance_sampling_level='sequence' with loss_type={c.loss_type!r} sums per-token contributions, which "
            "weights each sequence by its length instead of optimizing the per-sequence objective; GSPO's setup is "
            "loss_type='grpo'.",
            stacklevel=5,  # the caller of GRPOConfig(...)
        )


ALSO_ACCEPTED = {  # types a field takes beside its annotation (which HfArgumentParser needs to be one type)
    "scale_rewards": (bool,),  # TRL's older spelling
    "resume_from_checkpoint": (bool,),  # a TrlParser YAML `true`/`false` stays a bool: Trainer.train(True) resumes the latest
}


def _simple_types(annotation) -> tuple | None:
    """The runtime types an annotation like `int | None` or `list[float]` admits; None for anything else (not checked)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    kinds = []
    for arg in args:
        arg = typing.get_origin(arg) or arg  # list[float] → list
        if arg not in (int, float, bool, str, dict, list, type(None)):
            return None
        kinds.append(arg)
    return tuple(kinds)


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _group_sizes_that_fit(per_process: int) -> str:
    """The num_generations values (≥ 2) that split `per_process` completions into whole groups, as message text."""
    fits = [g for g in range(2, per_process + 1) if per_process % g == 0]
    return f", or num_generations in {{{', '.join(map(str, fits))}}}" if fits else ""
