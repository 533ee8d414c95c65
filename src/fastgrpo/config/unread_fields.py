"""Fields that only one feature reads, set while that feature is off: accepted with a warning.

TRL and transformers accept such settings silently (`vllm_mode='server'` without `use_vllm`,
`max_num_gen_batches` without `filter_groups`, `kl_estimator` at `beta=0`); a ported script that relies on
one would run without it unnoticed. Called once from `GRPOConfig.__post_init__` (config/grpo_config.py),
after `checks.validate`.

Not here: refusals (checks.py), TRL's own warnings (checks.warn_like_trl).
"""

from __future__ import annotations

import dataclasses
import warnings

# Fields that only one feature reads, each with the state that leaves that feature off: (off?, the state, the fields,
# how to turn it on).
VLLM_SERVER_FIELDS = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port")
VLLM_COLOCATE_FIELDS = ("vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size", "vllm_model_impl")
INERT_UNLESS = (
    (lambda c: c.generation_backend != "vllm", lambda c: f"use_vllm=False (generation_backend={c.generation_backend!r})",
     ("vllm_mode", "vllm_enable_sleep_mode", *VLLM_SERVER_FIELDS, *VLLM_COLOCATE_FIELDS), "set use_vllm=True to sample with vLLM"),
    (lambda c: c.generation_backend == "vllm" and c.vllm_mode == "colocate", lambda c: "vllm_mode='colocate'",
     VLLM_SERVER_FIELDS, "set vllm_mode='server' to sample on a `fastgrpo vllm-serve` server"),
    # TRL's rule: a base URL wins over host and port (AsyncGRPOConfig's default is one, TRL's "http://localhost:8000")
    (lambda c: c.generation_backend == "vllm" and c.vllm_mode == "server" and c.vllm_server_base_url is not None,
     lambda c: f"vllm_server_base_url={c.vllm_server_base_url!r} is set (it wins, as in TRL; AsyncGRPOConfig sets TRL's default)",
     ("vllm_server_host", "vllm_server_port"), "give the server's host and port in vllm_server_base_url"),
    (lambda c: c.generation_backend == "vllm" and c.vllm_mode == "server", lambda c: "vllm_mode='server' (a server takes these as "
     "its own flags: `fastgrpo vllm-serve --gpu-memory-utilization …`)", VLLM_COLOCATE_FIELDS,
     "set vllm_mode='colocate' to run the engine in the training process"),
    (lambda c: not c.filter_groups, lambda c: "filter_groups=False", ("filter_groups_metric", "max_num_gen_batches", "filter_groups_max_age"),
     "set filter_groups=True for dynamic sampling"),
    (lambda c: c.max_staleness is None, lambda c: "max_staleness=None (the synchronous loop)",
     ("max_inflight_tasks", "queue_maxsize", "heartbeat_stale_after_s"), "set max_staleness to overlap generation with training"),
    (lambda c: c.beta == 0, lambda c: "beta=0 (no KL term, no π_ref)", ("kl_estimator", "use_bias_correction_kl"),
     "set beta > 0 (e.g. 0.04) for the KL term"),
    (lambda c: not c.sync_ref_model, lambda c: "sync_ref_model=False", ("ref_model_mixup_alpha", "ref_model_sync_steps"),
     "set sync_ref_model=True to move π_ref towards π_θ"),
    (lambda c: c.loss_type != "sapo", lambda c: f"loss_type={c.loss_type!r}", ("sapo_temperature_pos", "sapo_temperature_neg"),
     "set loss_type='sapo'"),
    (lambda c: c.loss_type != "vespo", lambda c: f"loss_type={c.loss_type!r}",
     ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), "set loss_type='vespo'"),
    (lambda c: not c.use_adaptive_entropy, lambda c: "use_adaptive_entropy=False",
     ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"), "set use_adaptive_entropy=True"),
    (lambda c: not c.vllm_importance_sampling_correction, lambda c: "vllm_importance_sampling_correction=False",
     ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min"),
     "set vllm_importance_sampling_correction=True"),
    (lambda c: not c.log_completions, lambda c: "log_completions=False", ("num_completions_to_print", "log_unique_prompts"), "set log_completions=True"),
    (lambda c: c.log_completions and not {"wandb", "trackio"} & set(c.report_to),  # TRL's table goes to these two only
     lambda c: f"report_to={c.report_to} (the completions table is sent to W&B and Trackio only)", ("log_unique_prompts",),
     "add 'wandb' or 'trackio' to report_to"),
    (lambda c: c.warmup_steps > 0, lambda c: f"warmup_steps={c.warmup_steps:g} (it wins when > 0)", ("warmup_ratio",),
     "set warmup_steps=0 to warm up by ratio"),
    (lambda c: c.save_strategy != "steps", lambda c: f"save_strategy={c.save_strategy!r}", ("save_steps",), "set save_strategy='steps'"),
    (lambda c: c.eval_strategy != "steps", lambda c: f"eval_strategy={c.eval_strategy!r}", ("eval_steps",), "set eval_strategy='steps'"),
    (lambda c: c.eval_strategy == "no", lambda c: "eval_strategy='no'", ("eval_delay",), "set eval_strategy='steps' or 'epoch'"),
    # logging_steps is also eval_steps' default (eval_strategy="steps" without eval_steps): read then
    (lambda c: c.logging_strategy != "steps" and not (c.eval_strategy == "steps" and c.eval_steps == c.logging_steps),
     lambda c: f"logging_strategy={c.logging_strategy!r}", ("logging_steps",), "set logging_strategy='steps'"),
    (lambda c: c.save_strategy == "no", lambda c: "save_strategy='no' (no checkpoint to load)", ("load_best_model_at_end",),
     "set save_strategy and eval_strategy to 'steps' or 'epoch'"),
    (lambda c: c.save_strategy == "best" and c.eval_strategy == "no", lambda c: "eval_strategy='no' (no evaluation to find a best)",
     ("save_strategy",), "set eval_strategy='steps' or 'epoch'"),
    (lambda c: c.metric_for_best_model is None, lambda c: "metric_for_best_model=None", ("greater_is_better",),
     "name a metric_for_best_model"),
)


def warn_inert(c) -> None:
    """One `UserWarning` per feature that is off while fields only it reads are set away from their defaults.

    The rules are `INERT_UNLESS`: e.g. `vllm_mode='server'` with `use_vllm=False`, `max_num_gen_batches`
    without `filter_groups`, `kl_estimator` at `beta=0`. TRL and transformers accept such settings
    silently; a ported script that relies on one would run without it unnoticed. Nothing is refused.
    The defaults compared against are `type(c)`'s, so a subclass with other defaults (AsyncGRPOConfig) warns
    only about what its user set.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    for off, state, names, fix in INERT_UNLESS:
        if off(c):
            changed = [f"{name}={getattr(c, name)!r}" for name in names if getattr(c, name) != defaults[name]]
            if changed:
                warnings.warn(no_effect(changed, state(c), fix), stacklevel=5)


def no_effect(settings: list[str], state: str, fix: str) -> str:
    """The one wording of a setting-without-effect warning: "a=1, b=2 have no effect while <state>; <fix>, or drop them."."""
    verb, pronoun = ("has", "it") if len(settings) == 1 else ("have", "them")
    return f"{', '.join(settings)} {verb} no effect while {state}; {fix}, or drop {pronoun}."
