"""Checking a run's adapter settings before any model loads: peft configs that cannot train the policy.

`check_peft_inputs` refuses what TRL refuses (a `peft_config` with a `PeftModel`, `sync_ref_model` with
adapters) and what would train nothing or something else (prompt learning, another task type, r < 1, α ≤ 0,
target_modules matching no layer). The last one is found without loading weights: the adapters are applied
to a weightless copy of the model (meta device) built from its config (`local_config`).

Not here: wrapping the loaded model (loading.prepare_adapters, loading.apply_adapters).
"""

from __future__ import annotations

import copy
import json
import os

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .loading import apply_adapters, cache_dir, is_peft_model
from .model_files import BUILTIN_MODELS


def check_peft_inputs(model, peft_config, sync_ref_model: bool) -> None:
    """Refuse adapter settings that cannot work, before any model is loaded (TRL refuses the first two too).

    Args:
        model: what the trainer was given (a name, a model or a `PeftModel`).
        peft_config: the trainer's `peft_config` or None.
        sync_ref_model: `GRPOConfig.sync_ref_model`.
    Raises:
        TypeError: a `peft_config` that is not a `peft.PeftConfig` (e.g. a dict).
        ValueError: a `PeftModel` together with a `peft_config`; `sync_ref_model` with adapters; a prompt-learning
            config (prefix or prompt tuning: the packed update runs the model's own layers on packed rows, which
            virtual tokens do not fit); a task_type other than CAUSAL_LM (peft would build another model class);
            a LoraConfig whose r < 1, lora_alpha ≤ 0 (nothing would train) or lora_dropout outside [0, 1); target_modules
            that match no module (`apply_adapters`'s error, found on a weightless copy where the config is local).
    """
    adapted = peft_config is not None or is_peft_model(model)
    if peft_config is not None:
        from peft import LoraConfig, PeftConfig

        if not isinstance(peft_config, PeftConfig):
            raise TypeError(f"peft_config must be a peft.PeftConfig such as peft.LoraConfig(r=16, lora_alpha=32), not {type(peft_config).__name__}; fastgrpo.model.loading.lora_config() builds one from TRL's names.")
        kind = type(peft_config).__name__
        if peft_config.is_prompt_learning:
            raise ValueError(f"peft_config is a {kind} (virtual tokens): fastgrpo's packed update runs the model's own layers; "
                             "use adapters that wrap its modules, e.g. peft.LoraConfig(r=16, lora_alpha=32).")
        task = getattr(peft_config.task_type, "value", peft_config.task_type)
        if task not in (None, "CAUSAL_LM"):
            raise ValueError(f"peft_config.task_type={task!r}: the policy is a causal LM; set task_type='CAUSAL_LM' (or leave it unset).")
        if isinstance(peft_config, LoraConfig) and (peft_config.r < 1 or peft_config.lora_alpha <= 0 or not 0 <= peft_config.lora_dropout < 1):
            raise ValueError(f"LoraConfig(r={peft_config.r}, lora_alpha={peft_config.lora_alpha}, lora_dropout={peft_config.lora_dropout}): "
                             "need r ≥ 1, α > 0 (α = 0 scales every adapter to zero: nothing trains) and 0 ≤ dropout < 1 (TRL's defaults: 16, 32, 0.05).")
        if is_peft_model(model):
            raise ValueError("model is already a PeftModel and peft_config was given too; pass the PeftModel alone (its adapters train) or a plain model with peft_config.")
        config = local_config(model)
        if config is not None:  # the adapters applied to a weightless copy (meta device): peft's own matching, no load
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
            apply_adapters(skeleton, copy.deepcopy(peft_config))  # peft fills in the config it is given: not the caller's
    if adapted and sync_ref_model:
        raise ValueError("sync_ref_model=True with adapters: π_ref lives in the same weights as the policy and cannot move apart from it; set sync_ref_model=False or train without peft.")


def local_config(model) -> PretrainedConfig | None:
    """A model's config without its weights: a built model's own, or a local folder's (or a converted built-in's)
    config.json; None where reading it would need the hub, a conversion or the model's own code (a hub id, a file
    not converted yet, a config with an `auto_map`)."""
    if isinstance(model, PreTrainedModel):
        return model.config
    if not isinstance(model, (str, os.PathLike)):
        return None
    name = os.fspath(model)
    folder = os.path.join(cache_dir(), name) if name in BUILTIN_MODELS else name
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        if "auto_map" in json.load(f):  # the model's own code (trust_remote_code): built when it loads, not here
            return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)
