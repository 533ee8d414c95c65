"""Checking a run's adapter settings before any model loads: peft configs that cannot train the policy.

`check_peft_inputs` refuses what TRL refuses (a `peft_config` with a `PeftModel`, `sync_ref_model` with
adapters) and what would train nothing or something else (a folder of saved adapters as the model, prompt learning,
another task type, r < 1, α ≤ 0, target_modules matching no layer). The last one is found without loading weights: the adapters are applied
to a weightless copy of the model (meta device) built from its config (`check_targets`).

Not here: wrapping the loaded model (adapters.prepare_adapters, adapters.apply_adapters).
"""

from __future__ import annotations

import copy
import json
import os

import torch
from transformers import AutoModelForCausalLM

from .adapters import apply_adapters
from .loading import cache_dir, is_peft_model
from .model_files import BUILTIN_MODELS, check_model_config, check_model_name


def check_peft_inputs(model, peft_config, sync_ref_model: bool) -> None:
    """Refuse adapter settings that cannot work, before any model is loaded (TRL refuses the first two too).

    Args:
        model: what the trainer was given (a name, a model or a `PeftModel`).
        peft_config: the trainer's `peft_config` or None.
        sync_ref_model: `GRPOConfig.sync_ref_model`.
    Raises:
        TypeError: a `peft_config` that is not a `peft.PeftConfig` (e.g. a dict).
        ValueError: a folder of saved adapters as `model` (`check_adapter_folder`); a `PeftModel` together with a `peft_config`; `sync_ref_model` with adapters; a prompt-learning
            config (prefix or prompt tuning: the packed update runs the model's own layers on packed rows, which
            virtual tokens do not fit); a task_type other than CAUSAL_LM (peft would build another model class);
            a LoraConfig whose r < 1, lora_alpha ≤ 0 (nothing would train) or lora_dropout outside [0, 1); target_modules
            that match no module (`check_targets`: found on a weightless copy where the model is a local folder).
    """
    check_adapter_folder(model)
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
        check_targets(model, peft_config)
    if adapted and sync_ref_model:
        raise ValueError("sync_ref_model=True with adapters: π_ref lives in the same weights as the policy and cannot move apart from it; set sync_ref_model=False or train without peft.")


def check_adapter_folder(model) -> None:
    """Refuse a local folder of saved peft adapters (adapter_config.json, no config.json) as the policy's name.

    transformers loads such a folder as its base model with the adapters attached frozen, so nothing would train (TRL
    fails on its missing model_type); the message names the base model and both ways to train.

    Raises:
        ValueError: naming the folder, its base model and the fixes.
    """
    if not isinstance(model, (str, os.PathLike)):
        return
    folder = os.path.expanduser(os.fspath(model))
    path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(path) or os.path.isfile(os.path.join(folder, "config.json")):
        return
    try:
        with open(path) as f:
            base = json.load(f).get("base_model_name_or_path") or "<its base model>"
    except (ValueError, AttributeError):  # not JSON, or not an object: the base model cannot be named
        base = "<its base model>"
    raise ValueError(f"model {os.fspath(model)!r} is a folder of peft adapters (adapter_config.json, base model {base!r}), which would load "
                     f"frozen onto the base, training nothing. To train these adapters further pass model=PeftModel.from_pretrained("
                     f"AutoModelForCausalLM.from_pretrained({base!r}), {os.fspath(model)!r}, is_trainable=True); to train new adapters pass "
                     f"model={base!r} with peft_config.")


def check_targets(model, peft_config) -> None:
    """For a model still to load from a local folder (or the converted built-in): peft's own adapter injection on a
    weightless copy built from its config (meta device, ≈ 0.01 s), so target_modules that match no layer fail
    before the weights load. A built model is left to the wrapping itself (nothing to load first: its own modules,
    added ones included, are what peft matches); so is a config the Auto classes cannot build, or a peft feature
    that needs real weights (both named by the load or the wrapping).

    Raises:
        ValueError: `adapters.apply_adapters`'s error (target_modules match no layer), or the folder's own
            (`model_files.check_model_name`: no weights, a config.json that is not JSON, …).
    """
    if not isinstance(model, (str, os.PathLike)):
        return
    name = os.fspath(model)
    folder = os.path.join(cache_dir(), name) if name in BUILTIN_MODELS else name
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):  # a hub id, a file not converted yet, an adapters folder
        return
    if name not in BUILTIN_MODELS:
        check_model_name(name)
        check_model_config(name)
    with open(path) as f:
        if "auto_map" in json.load(f):  # the model's own code (trust_remote_code): built when it loads, not here
            return
    from transformers import AutoConfig

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    except ValueError:  # not a causal LM the Auto classes know: the load says so
        return
    probe = copy.deepcopy(peft_config)  # peft fills in the config it is given: not the caller's
    if hasattr(probe, "init_lora_weights"):
        probe.init_lora_weights = False  # PiSSA, OLoRA, LoftQ, EVA initialise from weights, which a meta copy has none of
    try:
        apply_adapters(skeleton, probe, given=peft_config)
    except (RuntimeError, NotImplementedError):  # a peft feature that needs real tensors: the wrapping after the load checks it
        return
