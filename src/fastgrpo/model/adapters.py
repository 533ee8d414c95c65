"""LoRA adapters on a loaded model: wrapping it (`prepare_adapters`, peft's `get_peft_model` as TRL calls it), π_ref of
an adapted policy, merged copies and loading saved adapters.

π_ref of an adapted policy is the same model run as its initial self (`as_reference`): adapters disabled for fresh
ones, or a frozen copy of adapters that came already trained (TRL's "ref" adapter); never a second copy of the base.
A head tied to an adapted input embedding reads the base weight, so merged copies untie it
(`head_on_adapted_embedding`). peft is imported only when adapters are used.

Not here: `lora_config` and loading the model (loading.py), checking adapter settings before a load (peft_checks.py).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from contextlib import contextmanager

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .loading import decoder_of, is_peft_model


def head_on_adapted_embedding(lm: torch.nn.Module) -> str | None:
    """The name of `lm`'s output head weight when it is tied to an input embedding carrying LoRA adapters; else None.

    peft's embedding LoRA adds ΔW to the lookup only, so the tied head keeps reading the base weight. Merging ΔW
    into the shared tensor (peft's `merge_and_unload`, or a plain tied copy) would move the head too: a merged
    model of such a policy runs untied, its head holding the base weight.
    """
    embedding, head = lm.get_input_embeddings(), lm.get_output_embeddings()
    if head is None or not getattr(embedding, "lora_embedding_A", None):
        return None
    if getattr(head, "weight", None) is not getattr(embedding, "base_layer", embedding).weight:
        return None
    return next(n for n, m in lm.named_modules() if m is head) + ".weight"


def untie_config(config) -> PretrainedConfig:
    """A copy of `config` whose output head is not tied to the input embedding (its text config's too)."""
    config = copy.deepcopy(config)
    for c in {id(config): config, id(config.get_text_config()): config.get_text_config()}.values():
        c.tie_word_embeddings = False
    return config


def prepare_adapters(model: torch.nn.Module, peft_config, reference: bool) -> torch.nn.Module:
    """The policy to train: `model` wrapped in adapters if `peft_config` is given (`peft.get_peft_model`, as TRL does).

    Args:
        model: the loaded model, or a `PeftModel` the user built.
        peft_config: a `peft.PeftConfig` or None (train `model` as it is).
        reference: π_ref is used (beta > 0). Adapters that may not start as a no-op, a given `PeftModel`'s (maybe
            trained, as TRL assumes) or fresh ones whose init is not one (`starts_as_base`), get a frozen copy as
            π_ref (`add_reference_adapter`); other fresh adapters are π_ref when disabled.
    Raises:
        ValueError: nothing in the result trains (`check_trainable`); with `reference`, a trained parameter outside
            the adapters (`check_fixed_reference`).
    """
    given = is_peft_model(model)
    if peft_config is not None:
        model = apply_adapters(model, peft_config)
    if reference and is_peft_model(model):
        check_fixed_reference(model)
    if reference and (given or (peft_config is not None and not starts_as_base(peft_config))):
        add_reference_adapter(model)
    check_trainable(model)
    return model


def check_fixed_reference(model: torch.nn.Module) -> None:
    """Refuse an adapted policy with trained parameters outside its active adapter, when π_ref is used (beta > 0).

    π_ref is the same weights with the adapter disabled or swapped for its frozen copy (`as_reference`); a base
    parameter that trains, e.g. the biases peft's `bias="all"` or `"lora_only"` unfreezes, or one the user unfroze,
    is in both, so π_ref would move with the policy (peft only warns; TRL trains so).

    Raises:
        ValueError: naming the first such parameters and the fixes.
    """
    name = model.active_adapter
    outside = [n for n, p in model.named_parameters() if p.requires_grad and f".{name}." not in n]
    if not outside:
        return
    bias = getattr(model.peft_config[name], "bias", "none")
    fix = f"set bias='none' in the peft_config (it is {bias!r}: peft trains the base model's biases)" if bias != "none" else \
        "freeze them (requires_grad_(False)) or name their modules in the peft_config's modules_to_save"
    raise ValueError(f"beta > 0 with {len(outside)} trained parameters outside the adapters ({', '.join(outside[:3])}{', …' if len(outside) > 3 else ''}): "
                     f"π_ref is the same model with its adapters disabled, so it would move with them; {fix}, or set beta=0.")


def apply_adapters(model: torch.nn.Module, peft_config, given=None) -> torch.nn.Module:
    """`peft.get_peft_model(model, peft_config)`, TRL's wrapping (peft fills in `peft_config`, as under TRL).

    Args:
        given: the config the user gave, when `peft_config` is a copy of it (the message quotes the user's values).
    Raises:
        ValueError: peft's NoMatchingPeftModuleError (target_modules match no module of `model`, or every match is
            excluded), or peft's refusal of a matched module it cannot wrap (a norm layer, e.g. "input_layernorm"),
            with the names of the layers adapters can wrap here and the fix.
    """
    from peft import get_peft_model
    from peft.utils.error import NoMatchingPeftModuleError

    given = given if given is not None else peft_config
    targets, exclude = copy.deepcopy((given.target_modules, getattr(given, "exclude_modules", None)))  # before peft expands them
    layers = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)
    names = lambda: ", ".join(dict.fromkeys(name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, layers)))  # noqa: E731
    try:
        adapted = get_peft_model(model, peft_config)
    except NoMatchingPeftModuleError as err:
        excluded = f", exclude_modules={exclude!r}" if exclude else ""
        raise ValueError(
            f"peft_config.target_modules={targets!r}{excluded} adapts nothing in this model ({str(err).rstrip('.')}). "
            f"Its layers: {names()}; name some of them (TRL's default: ['q_proj', 'v_proj']) or target_modules='all-linear'."
        ) from None
    except ValueError as err:
        if not str(err).startswith("Target module"):  # peft's "Target module X is not supported": a matched module LoRA cannot wrap
            raise
        raise ValueError(f"peft_config.target_modules={targets!r} matches a module LoRA cannot wrap ({' '.join(str(err).split())[:300]}). "
                         f"The layers it can wrap here: {names()}; target those.") from None
    check_tied_head(adapted, targets)
    return adapted


def check_tied_head(model: torch.nn.Module, targets) -> None:
    """Refuse adapters on an output head that shares its weight with the input embedding (tie_word_embeddings).

    Its ΔW cannot be merged into the shared tensor without moving the embedding too: the merged save
    (`save_model(merge_adapters=True)`), the bf16 sampler's copy and the vLLM weights would be another model
    (logits off by ≈ 45–180 on the tiny test model). TRL refuses adapters on lm_head whether tied or not.

    Raises:
        ValueError: naming the head, the target_modules and the fixes.
    """
    lm = decoder_of(model)
    head, embedding = lm.get_output_embeddings(), lm.get_input_embeddings()
    base = getattr(head, "base_layer", None)
    if base is None or base.weight is not getattr(embedding, "base_layer", embedding).weight:
        return
    name = next(n for n, m in lm.named_modules() if m is head)
    raise ValueError(f"peft_config.target_modules={targets!r} puts adapters on {name!r}, whose weight is the input embedding's "
                     "(tie_word_embeddings=True): merging its ΔW (save_model(merge_adapters=True), the bf16 sampler's copy, vLLM) would "
                     f"move the embedding too. Drop {name!r} from target_modules (TRL refuses adapters on it), or train it in full "
                     f"with modules_to_save=[{name!r}].")


REFERENCE_ADAPTER = "ref"  # TRL's name for the frozen copy
# peft inits whose fresh adapters add nothing (B = 0, A = 0, or BA = 0) and leave the base weights as they were.
NO_OP_INITS = (True, "gaussian", "orthogonal", "mica")


def _init_field(peft_config) -> str | None:
    """The name of `peft_config`'s init setting (LoRA's `init_lora_weights`, LoHa/LoKr/OFT/… `init_weights`), or None."""
    names = {f.name for f in dataclasses.fields(peft_config)}
    return next((name for name in ("init_lora_weights", "init_weights") if name in names), None)


def starts_as_base(peft_config) -> bool:
    """Whether fresh adapters of `peft_config` leave the model computing what it did (`NO_OP_INITS`), so that the model with
    its adapters disabled is the initial policy. Not for init_lora_weights=False (random B) nor PiSSA, OLoRA, CorDA or LoftQ,
    which move part of each weight into the adapters: disabled, those leave a residual model, not π_ref.
    """
    field = _init_field(peft_config)
    return field is not None and getattr(peft_config, field) in NO_OP_INITS


def check_trainable(model: torch.nn.Module) -> None:
    """Refuse a model with nothing to train (a `PeftModel.from_pretrained` without `is_trainable=True`).

    Raises:
        ValueError: no parameter requires a gradient.
    """
    if not any(p.requires_grad for p in model.parameters()):
        fix = "load it with PeftModel.from_pretrained(base, path, is_trainable=True)" if is_peft_model(model) else \
            "unfreeze what should train (model.requires_grad_(True) for all of it), or pass a peft_config to train adapters"
        raise ValueError(f"the model has no trainable parameters (every requires_grad is False); {fix}.")


def add_reference_adapter(model: torch.nn.Module) -> None:
    """Freeze a copy of a `PeftModel`'s active adapter as "ref", π_ref for adapters that may come already trained.

    As TRL does for a PeftModel passed with beta > 0: disabling such adapters
    would make π_ref the base model, not the initial policy (the same for fresh
    adapters that do not start as a no-op, `starts_as_base`). The copy is
    adapter-sized; it never trains and `as_reference` runs the model with it.
    It is added with peft's default init before the copy: PiSSA's or OLoRA's init
    would split the base weights a second time, changing the policy.
    """
    name = model.active_adapter
    config = model.peft_config[name]
    field = _init_field(config)
    fresh = dataclasses.replace(config, **{field: True}) if field is not None else config
    model.add_adapter(REFERENCE_ADAPTER, fresh)  # stays inactive and frozen
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if f".{name}." in param_name:
                model.get_parameter(param_name.replace(f".{name}.", f".{REFERENCE_ADAPTER}.")).copy_(param)


@contextmanager
def as_reference(model: torch.nn.Module):
    """Run an adapted model as π_ref inside the block: with its "ref" copy if it has one, else with adapters disabled.

    Args:
        model: a `PeftModel` (the unwrapped module, not a DDP wrapper).
    Yields:
        `model`, computing π_ref until the block ends (then the trained adapter is active again).
    """
    if REFERENCE_ADAPTER not in model.peft_config:
        with model.disable_adapter():  # fresh adapters start at B = 0: the base model is the initial policy
            yield model
        return
    trained = model.active_adapter
    model.set_adapter(REFERENCE_ADAPTER)  # peft also flips requires_grad; set back below
    try:
        yield model
    finally:
        model.set_adapter(trained)


@contextmanager
def reference_of(ref_model: torch.nn.Module | None, policy: torch.nn.Module):
    """The model to run for π_ref inside the block: the frozen copy `ref_model`, or (None: an adapted policy) the unwrapped
    `policy` as its initial self (`as_reference`)."""
    if ref_model is not None:
        yield ref_model
    else:
        with as_reference(policy) as model:
            yield model


def merged_copy(model: torch.nn.Module) -> PreTrainedModel:
    """A plain `PreTrainedModel` with the adapters merged into its weights (W + α/r·BA); `model` is left untouched.

    Merging in place and unmerging would not give the same bits back, so this merges a copy. A head tied to an
    adapted embedding (`head_on_adapted_embedding`) is untied first and keeps the base weight, as the policy's does.
    """
    merged = copy.deepcopy(model)
    lm = decoder_of(merged)
    if head_on_adapted_embedding(lm) is not None:
        head = lm.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        lm.config = untie_config(lm.config)
    return merged.merge_and_unload()


ADAPTER_FILE = "adapter_model.safetensors"  # what a peft model saves instead of model.safetensors


def adapter_file(model: torch.nn.Module) -> str:
    """Where `PeftModel.save_pretrained` puts `model`'s active (trained) adapter in the folder it writes: `ADAPTER_FILE` at
    the top for peft's "default", in a subfolder of the adapter's name for any other (e.g. "mine/adapter_model.safetensors")."""
    name = model.active_adapter
    return ADAPTER_FILE if name == "default" else os.path.join(name, ADAPTER_FILE)


def load_adapters(model: torch.nn.Module, folder: str, weights: dict | None = None) -> None:
    """Load the active adapter written by `PeftModel.save_pretrained` (`adapter_file`) into `model`'s active adapter.

    Args:
        folder: the folder `save_pretrained` wrote (named in errors).
        weights: its active adapter's tensors, already read (run/checkpoint_files.py reads every file first); None reads the file.
    Raises:
        ValueError: no adapter file (a checkpoint of a run without adapters), or its tensors are not exactly the model's.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    if weights is None:
        path = os.path.join(folder, adapter_file(model))
        if not os.path.isfile(path):
            raise ValueError(f"{folder!r} holds no adapters (no {adapter_file(model)}): it was saved by a run without peft_config; resume it without peft_config.")
        weights = load_file(path)
    name = model.active_adapter
    expected = set(get_peft_model_state_dict(model, adapter_name=name))
    if set(weights) != expected:
        raise ValueError(f"{folder!r} holds adapters that do not fit this model (missing {sorted(expected - set(weights))[:3]}, unexpected {sorted(set(weights) - expected)[:3]}); resume with the same peft_config.")
    set_peft_model_state_dict(model, weights, adapter_name=name)
