"""TRL 1.16 `GRPOConfig` fields that fastgrpo does not honour as its own: accepted or refused.

`GRPOConfig` (config/grpo_config.py) honours most of TRL's fields. The
rest of TRL's `GRPOConfig` (the ~190 fields it has with the
`transformers.TrainingArguments` it inherits) is listed here (`TRL_FIELDS`), each with TRL's
default and the values that describe what fastgrpo does anyway:

- `ANY`: the field changes nothing a fastgrpo run computes (names, hub and
  logging-verbosity settings, data-loader and DDP tuning, options read only by
  a feature that is off), so every value is accepted;
- a tuple: the values fastgrpo already behaves as; any other value raises a
  `ValueError` naming the field and what to do instead.

`TrlFields` is the table as a dataclass, GRPOConfig's base: each entry is a real field, typed as TRL
types it (so transformers' `HfArgumentParser` and TRL's `TrlParser` parse `--run_name x`, `--use_cpu true`
or a YAML `log_level: info` as for TRL's GRPOConfig, and `to_dict()` keeps them), with TRL's default;
GRPOConfig.__post_init__ then checks each value with `check_trl_field`, from Python or from a parser alike.
A name in neither config/grpo_config.py nor this table keeps config/grpo_config.py's `TypeError`
naming the closest field.

Not here: fields fastgrpo honours (config/grpo_config.py), warnings about combinations
(config/grpo_config.py, where the fields live).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

ANY = object()  # sentinel: every value is accepted


class TrlField(NamedTuple):
    """One TRL field fastgrpo does not honour: TRL's default, the accepted values, what to do instead."""

    default: object
    accepts: object  # ANY or a tuple of accepted values
    instead: str = ""  # the fix, for a refused value


_ENGINE = "fastgrpo samples with its own sampler, transformers generate or vLLM (use_vllm=True); remove it"
# transformers' `trainer_log_levels` (TrainingArguments' choices for log_level and log_level_replica).
LOG_LEVELS = ("passive", "detail", "debug", "info", "warning", "error", "critical")
_LOG_LEVEL = f"use one of {', '.join(LOG_LEVELS)} (transformers' log levels)"
_ACCELERATE = "configure it with `accelerate launch --config_file …` (examples/accelerate/); remove it here"

TRL_FIELDS: dict[str, TrlField] = {
    # --- optimizer, precision, compilation --------------------------------------------
    "optim_target_modules": TrlField(None, (None,), "GaLore/APOLLO optimizers are not supported; use optim='adamw_torch'"),
    "average_tokens_across_devices": TrlField(True, (True,), "loss_type='dapo' always normalises by the step's tokens on all processes"),
    "label_smoothing_factor": TrlField(0.0, (0.0, 0), "GRPO has no labels to smooth; remove it"),
    "fp16": TrlField(False, (False,), "fp16 training is not supported; use bf16=True"),
    "bf16_full_eval": TrlField(False, (False,), "evaluation runs in the training precision; remove it"),
    "fp16_full_eval": TrlField(False, (False,), "evaluation runs in the training precision; remove it"),
    "torch_compile": TrlField(False, (False,), "torch.compile is not wired in; remove it"),
    "torch_compile_backend": TrlField(None, ANY),
    "torch_compile_mode": TrlField(None, ANY),
    "use_liger_kernel": TrlField(False, (False, True)),  # True: TRL's fused, chunked head + GRPO loss; fastgrpo's head is always chunked (logprobs.py)
    "liger_kernel_config": TrlField(None, ANY),
    "use_cache": TrlField(False, ANY),  # training forwards never use the KV cache; generation always does
    "neftune_noise_alpha": TrlField(None, (None,), "NEFTune noise is not supported in GRPO; remove it"),
    "torch_empty_cache_steps": TrlField(None, ANY),
    "auto_find_batch_size": TrlField(False, (False,), "a smaller batch would split groups (TRL refuses it too); lower per_device_train_batch_size instead"),
    "cast_lm_head_to_fp32": TrlField(False, (False,), "the LM head runs in the policy's precision and its logits are cast to float32 before the log-softmax; remove it"),
    # --- logging and trackers --------------------------------------------------------
    "log_on_each_node": TrlField(True, ANY),
    "logging_nan_inf_filter": TrlField(True, ANY),
    "include_num_input_tokens_seen": TrlField("no", ("no", False), "token counts are logged as generation/train tokens per second; remove it"),
    "log_level": TrlField("passive", LOG_LEVELS, _LOG_LEVEL),  # TrainingArguments' choices (get_process_log_level reads them)
    "log_level_replica": TrlField("warning", LOG_LEVELS, _LOG_LEVEL),
    "run_name": TrlField(None, ANY),
    "project": TrlField("huggingface", ANY),
    "trackio_space_id": TrlField(None, ANY),
    "trackio_bucket_id": TrlField(None, ANY),
    "trackio_static_space_id": TrlField(None, ANY),
    "log_multimodal": TrlField(True, ANY),
    "log_completions_hub_repo": TrlField(None, (None,), "completions are written to output_dir/completions.jsonl and output_dir/completions/*.parquet; upload them yourself"),
    "skip_memory_metrics": TrlField(True, ANY),
    # --- evaluation ------------------------------------------------------------------
    "prediction_loss_only": TrlField(False, ANY),
    "eval_do_concat_batches": TrlField(True, ANY),
    "eval_use_gather_object": TrlField(False, ANY),
    "eval_accumulation_steps": TrlField(None, ANY),
    "include_for_metrics": TrlField([], ANY),
    "batch_eval_metrics": TrlField(False, (False,), "evaluate() reports mean rewards, not compute_metrics; remove it"),
    # --- saving and the hub ----------------------------------------------------------
    "save_on_each_node": TrlField(False, (False,), "the main process writes every checkpoint to output_dir; use a shared file system"),
    "save_only_model": TrlField(False, ANY),  # checkpoints always hold the optimizer, for an exact resume
    "enable_jit_checkpoint": TrlField(False, (False,), "checkpoints are written every save_steps; remove it"),
    "push_to_hub": TrlField(False, (False,), "save with trainer.save_model() and upload the folder with huggingface_hub"),
    "hub_token": TrlField(None, ANY),
    "hub_private_repo": TrlField(None, ANY),
    "hub_model_id": TrlField(None, ANY),
    "hub_strategy": TrlField("every_save", ANY),
    "hub_always_push": TrlField(False, ANY),
    "hub_revision": TrlField(None, ANY),
    "ignore_data_skip": TrlField(False, ANY),  # resuming never re-reads skipped data: the prompt order is saved
    "restore_callback_states_from_checkpoint": TrlField(False, (False,), "callbacks start fresh on resume; remove it"),
    "resume_from_checkpoint": TrlField(None, ANY),  # read by scripts, passed to train() (as in transformers)
    # --- determinism, devices, distribution --------------------------------------------
    "accelerator_config": TrlField(None, (None,), _ACCELERATE),
    "parallelism_config": TrlField(None, (None,), _ACCELERATE),
    "fsdp": TrlField(None, (None, ""), _ACCELERATE),
    "fsdp_config": TrlField(None, (None,), _ACCELERATE),
    "deepspeed": TrlField(None, (None,), _ACCELERATE),
    "ddp_find_unused_parameters": TrlField(None, ANY),
    "ddp_bucket_cap_mb": TrlField(None, ANY),
    "ddp_broadcast_buffers": TrlField(None, ANY),
    "ddp_static_graph": TrlField(None, ANY),
    "ddp_backend": TrlField(None, ANY),  # accelerate picks nccl/gloo
    "ddp_timeout": TrlField(1800, ANY),
    "local_rank": TrlField(-1, ANY),
    "debug": TrlField("", ("", [], None), "remove it"),  # None: what HfArgumentParser gives when --debug is not given (TRL's too)
    "do_train": TrlField(False, ANY),
    "do_eval": TrlField(False, ANY),
    "do_predict": TrlField(False, ANY),
    "ds3_gather_for_generation": TrlField(True, ANY),
    # --- data loading (fastgrpo draws rows itself; no DataLoader) ------------------------
    "dataloader_drop_last": TrlField(False, ANY),
    "dataloader_num_workers": TrlField(0, ANY),
    "dataloader_pin_memory": TrlField(True, ANY),
    "dataloader_persistent_workers": TrlField(False, ANY),
    "dataloader_prefetch_factor": TrlField(None, ANY),
    "dataloader_multiprocessing_context": TrlField(None, ANY),
    "dataloader_in_order": TrlField(True, ANY),
    "remove_unused_columns": TrlField(False, ANY),  # every column reaches the reward functions
    "label_names": TrlField(None, ANY),
    "train_sampling_strategy": TrlField("random", ("random",), "use shuffle_dataset=False for the dataset's own order"),
    "length_column_name": TrlField("length", ANY),
    "pad_to_multiple_of": TrlField("auto", ANY),  # padding width only; no value changes a result
    # --- generation engines ----------------------------------------------------------
    "cache_implementation": TrlField(None, (None,), "generation uses transformers' default KV cache; remove it"),
    "use_transformers_continuous_batching": TrlField(False, (False,), _ENGINE),
    "transformers_continuous_batching_config": TrlField(None, ANY),
    "use_transformers_paged": TrlField(False, (False,), _ENGINE),
}


# TRL 1.16's annotations of the fields above whose default (None, 0, "") does not show the type, as
# `HfArgumentParser` reads them: `str | bool` is a bool flag, `str | list[str] | None` a list one, and a
# transformers enum (IntervalStrategy | str) or accelerate class (ParallelismConfig | None) is plain text here,
# so that config/ imports neither. tests/test_trl_fields.py compares each flag with TRL's.
TRL_TYPES = {
    "optim_target_modules": None | str | list[str], "torch_compile_backend": str | None,
    "torch_compile_mode": str | None, "liger_kernel_config": dict | str | None, "neftune_noise_alpha": float | None,
    "torch_empty_cache_steps": int | None, "include_num_input_tokens_seen": str | bool, "run_name": str | None,
    "trackio_space_id": str | None, "trackio_bucket_id": str | None, "trackio_static_space_id": str | None,
    "log_completions_hub_repo": str | None, "eval_accumulation_steps": int | None,
    "include_for_metrics": list[str], "hub_token": str | None, "hub_private_repo": bool | None, "hub_model_id": str | None,
    "hub_revision": str | None, "resume_from_checkpoint": str | None, "accelerator_config": dict | str | None,
    "parallelism_config": str | None, "fsdp": str | None, "fsdp_config": dict | str | None, "deepspeed": dict | str | None,
    "ddp_find_unused_parameters": bool | None, "ddp_bucket_cap_mb": int | None, "ddp_broadcast_buffers": bool | None,
    "ddp_static_graph": bool | None, "ddp_backend": str | None, "debug": None | str | list[str],
    "dataloader_prefetch_factor": int | None, "dataloader_multiprocessing_context": str | None,
    "remove_unused_columns": bool | None, "label_names": list[str] | None, "pad_to_multiple_of": int | str | None,
    "cache_implementation": str | None,
    "transformers_continuous_batching_config": dict | str | None,
}


def _as_field(name: str, entry: TrlField) -> tuple[str, object, dataclasses.Field]:
    """(name, TRL's type, a dataclass field with TRL's default and a help saying what fastgrpo does with the value)."""
    kind = TRL_TYPES.get(name) or type(entry.default)  # bool, int, float or str: the default shows it
    if entry.accepts is ANY:
        says = "changes nothing fastgrpo computes; any value is accepted"
    else:
        says = f"fastgrpo accepts {' or '.join(repr(v) for v in entry.accepts)}; otherwise {entry.instead}"
    default = {"default_factory": list} if entry.default == [] else {"default": entry.default}
    return name, kind, dataclasses.field(**default, metadata={"help": f"TRL's field (default {entry.default!r}): {says}"})


TrlFields = dataclasses.make_dataclass("TrlFields", [_as_field(name, entry) for name, entry in TRL_FIELDS.items()], kw_only=True)
TrlFields.__module__ = __name__
TrlFields.__doc__ = """GRPOConfig's base: TRL_FIELDS as keyword-only dataclass fields, so parsers and `to_dict()` see them.

Keyword-only, so GRPOConfig's own fields keep TRL's positional order (`GRPOConfig("out")` is output_dir).
The values are checked by GRPOConfig.__post_init__ (`check_trl_field`).
"""


def check_trl_field(name: str, value) -> None:
    """Accept `value` for the TRL field `name`, or refuse it.

    Raises:
        ValueError: a value fastgrpo cannot honour; the message names the field and the fix.
    """
    entry = TRL_FIELDS[name]
    if entry.accepts is ANY or any(type(value) is type(ok) and value == ok for ok in entry.accepts):  # False is not 0
        return
    accepted = " or ".join(repr(v) for v in entry.accepts)
    raise ValueError(f"{name}={value!r} is not supported by fastgrpo (accepted: {accepted}): {entry.instead}.")
