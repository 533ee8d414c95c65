"""TRL's script arguments beside GRPOConfig, as `fastgrpo train` takes them (cli.py): `ModelConfig`'s LoRA options
(`LoraOptions`), loading options (`ModelOptions`) and bitsandbytes options (`QuantizationOptions`, `quantization_config`), and `trl grpo`'s `GRPOScriptArguments` (`ScriptOptions`: the reward functions, reward model, dataset
configuration, splits and streaming), with how TRL's grpo script reads its reward names (`reward_specs`).

Not here: parsing and running the command (cli.py), loading datasets (run/datasets.py), resolving a reward spec (rollout/rewards.py),
what TRL's rewards need from the data (rollout/trl_rewards.py).
"""

from __future__ import annotations

import dataclasses
import json
import warnings

# tasks/rewards.BUILTIN_REWARDS' names (`--reward`), listed here so that --help needs no torch (a test keeps them equal).
BUILTIN_REWARD_NAMES = ("length", "format", "brevity", "reasoning_gym", "exact")


@dataclasses.dataclass
class LoraOptions:
    """TRL's `ModelConfig` LoRA options (names and defaults); used only when use_peft is true."""

    use_peft: bool = dataclasses.field(default=False, metadata={"help": "train LoRA adapters instead of every weight (peft)"})
    lora_r: int = dataclasses.field(default=16, metadata={"help": "LoRA rank r"})
    lora_alpha: int = dataclasses.field(default=32, metadata={"help": "LoRA alpha: the update is scaled by alpha / r"})
    lora_dropout: float = dataclasses.field(default=0.05, metadata={"help": "dropout on the adapters' input"})
    lora_target_modules: list[str] | None = dataclasses.field(
        default=None, metadata={"help": "modules to adapt, e.g. q_proj v_proj, or all-linear (default: peft's for the model)"}
    )
    lora_task_type: str = dataclasses.field(default="CAUSAL_LM", metadata={"help": "peft task type"})
    lora_target_parameters: list[str] | None = dataclasses.field(
        default=None, metadata={"help": "parameters to adapt that are not in a Linear module, e.g. an MoE's experts (peft's target_parameters)"})
    lora_modules_to_save: list[str] | None = dataclasses.field(
        default=None, metadata={"help": "modules trained in full beside the adapters, e.g. lm_head (peft's modules_to_save)"})
    use_rslora: bool = dataclasses.field(default=False, metadata={"help": "rank-stabilised LoRA: scale the update by alpha / sqrt(r)"})
    use_dora: bool = dataclasses.field(default=False, metadata={"help": "DoRA (arXiv 2402.09353): a learnt magnitude per output beside the adapters"})


LORA_KEYS = tuple(f.name for f in dataclasses.fields(LoraOptions))


@dataclasses.dataclass
class ModelOptions:
    """TRL's `ModelConfig` loading options (names and choices), which `trl grpo` turns into model_init_kwargs
    (`revision`, `attn_implementation`, `dtype`; a model_init_kwargs given too wins, as there): `model_init_kwargs`."""

    model_revision: str | None = dataclasses.field(default=None, metadata={"help": "TRL's: the hub model's branch, tag or commit (default: main)"})
    dtype: str | None = dataclasses.field(default=None, metadata={
        "help": "TRL's: the dtype the model loads in", "choices": ["auto", "bfloat16", "float16", "float32"]})
    attn_implementation: str | None = dataclasses.field(default=None, metadata={"help": "TRL's: transformers' attention implementation (sdpa, eager, …)"})


MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelOptions))


def model_init_kwargs(options: dict, given) -> dict | str:
    """GRPOConfig's model_init_kwargs for a `trl grpo` command line: the `ModelOptions` given (`options`, by field name) as
    transformers' keywords (model_revision → revision), then the `given` model_init_kwargs over them (None, a dict, or JSON
    text: read here, or left as it is for GRPOConfig's own error when it is not JSON)."""
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except ValueError:
            return given
    return {**{"revision" if k == "model_revision" else k: v for k, v in options.items()}, **(given if isinstance(given, dict) else {})}


@dataclasses.dataclass
class QuantizationOptions:
    """TRL's `ModelConfig` bitsandbytes options (names, defaults and choices), which `trl grpo` turns into the trainer's
    `quantization_config` (`quantization_config`): QLoRA, with --use_peft."""

    load_in_8bit: bool = dataclasses.field(default=False, metadata={"help": "TRL's: load the base model in 8 bits (bitsandbytes; needs --use_peft)"})
    load_in_4bit: bool = dataclasses.field(default=False, metadata={"help": "TRL's: load the base model in 4 bits (bitsandbytes; needs --use_peft)"})
    bnb_4bit_quant_type: str = dataclasses.field(default="nf4", metadata={"help": "TRL's: the 4-bit type", "choices": ["fp4", "nf4"]})
    use_bnb_nested_quant: bool = dataclasses.field(default=False, metadata={"help": "TRL's: quantize the 4-bit constants too (double quantization)"})
    bnb_4bit_quant_storage: str | None = dataclasses.field(default=None, metadata={"help": "TRL's: the dtype the 4-bit weights are stored in"})


QUANTIZATION_KEYS = tuple(f.name for f in dataclasses.fields(QuantizationOptions))


def quantization_config(options: dict, dtype: str | None):
    """The trainer's `quantization_config` for a `trl grpo` command line, as TRL's `get_quantization_config` builds it: a
    `transformers.BitsAndBytesConfig` for --load_in_4bit (compute dtype = --dtype, as there; `auto`, which names no dtype
    before the checkpoint is read and which bitsandbytes cannot take, is its default, fp32) or --load_in_8bit, else None.

    Args:
        options: the `QuantizationOptions` given, by field name.
        dtype: the --dtype given, or None.
    Raises:
        ValueError: --load_in_4bit and --load_in_8bit together (TRL's ModelConfig refuses it too); a
            --bnb_4bit_quant_storage bitsandbytes cannot store in (transformers' message, naming the choices).
    Warns:
        UserWarning: 4-bit options set without --load_in_4bit (TRL ignores them silently), naming them and the fix.
    """
    o = {**dataclasses.asdict(QuantizationOptions()), **options}
    if o["load_in_4bit"] and o["load_in_8bit"]:
        raise ValueError("--load_in_4bit and --load_in_8bit were both given; choose one (TRL refuses both too).")
    four_bit = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")  # read only with load_in_4bit
    unread = [f"{k}={options[k]!r}" for k in four_bit if k in options and options[k] != getattr(QuantizationOptions, k)]
    if unread and not o["load_in_4bit"]:
        from .unread_fields import no_effect

        warnings.warn(no_effect(unread, "load_in_4bit is off", "add --load_in_4bit (with --use_peft) for QLoRA"), stacklevel=2)
    if not (o["load_in_4bit"] or o["load_in_8bit"]):
        return None
    from transformers import BitsAndBytesConfig

    if o["load_in_8bit"]:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=None if dtype == "auto" else dtype,
                              bnb_4bit_quant_type=o["bnb_4bit_quant_type"], bnb_4bit_use_double_quant=o["use_bnb_nested_quant"],
                              bnb_4bit_quant_storage=o["bnb_4bit_quant_storage"])


@dataclasses.dataclass
class ScriptOptions:
    """TRL's `trl grpo` script arguments (`GRPOScriptArguments`: names, types and defaults), so its command lines and
    recipes run here; `--model_name_or_path` and `--dataset_name` are `--model` and `--dataset` (TRL_SCRIPT_KEYS)."""

    reward_funcs: list[str] | None = dataclasses.field(default=None, metadata={
        "help": "TRL's: accuracy_reward, reasoning_accuracy_reward, think_format_reward, get_soft_overlong_punishment "
                "(trl.rewards; TRL installed), a dotted import path module.function, or a --reward name"})
    reward_model_name_or_path: str | None = dataclasses.field(default=None, metadata={"help": "TRL's: a reward model (folder or hub id), scored first"})
    dataset_config: str | None = dataclasses.field(default=None, metadata={"help": "TRL's: the configuration (load_dataset's name) of a hub dataset or dataset folder"})
    dataset_train_split: str = dataclasses.field(default="train", metadata={"help": "TRL's: the split to train on (a hub dataset or dataset folder)"})
    dataset_test_split: str = dataclasses.field(default="test", metadata={"help": "TRL's: the split evaluated when eval_strategy is not 'no'"})
    dataset_streaming: bool = dataclasses.field(default=False, metadata={"help": "TRL's: stream the hub dataset or dataset folder (needs max_steps)"})


SCRIPT_KEYS = tuple(f.name for f in dataclasses.fields(ScriptOptions))
# TRL's grpo script's reward registry (trl.scripts.grpo), read from trl.rewards as the script reads it
TRL_SCRIPT_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
TRL_MATH_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward")  # call math_verify: an ImportError at the first scoring without it


def reward_specs(job: dict) -> list:
    """The run's rewards, each a spec for `resolve_reward` or a function: `--reward`'s, then TRL's script's
    (`--reward_model_name_or_path`, then `--reward_funcs`, in trl grpo's order).

    A `--reward_funcs` entry is read as TRL's grpo script reads it: a name of its registry (`TRL_SCRIPT_REWARDS`, from
    trl.rewards, `get_soft_overlong_punishment` with the script's max_completion_len=1280, soft_punish_cache=256), or a
    dotted import path `module.function`; a `--reward` name or module:function works too.

    Raises:
        ValueError: a TRL registry name without TRL installed (naming the install and fastgrpo's own rewards);
            accuracy_reward or reasoning_accuracy_reward without math_verify, which they call (it was an ImportError
            at the first scoring, after the model loaded and sampled); a dotted path with an empty module or function
            name (`./rm`, `rewards.`).
    """
    specs = list(job["reward"]) + [job["reward_model_name_or_path"]] * bool(job["reward_model_name_or_path"])
    for name in job["reward_funcs"]:
        if name in TRL_SCRIPT_REWARDS:
            try:
                import trl.rewards
                from trl.import_utils import is_math_verify_available
            except ImportError:
                raise ValueError(f"--reward_funcs {name}: that is TRL's reward (trl.rewards.{name}); pip install trl to use it, "
                                 f"or give one of fastgrpo's: {', '.join(BUILTIN_REWARD_NAMES)}.") from None
            if name in TRL_MATH_REWARDS and not is_math_verify_available():
                raise ValueError(f"--reward_funcs {name}: TRL's {name} checks answers with math_verify, which is not installed; "
                                 "pip install math-verify, or give another reward.")
            fn = getattr(trl.rewards, name)
            specs.append(fn(max_completion_len=1280, soft_punish_cache=256) if name == "get_soft_overlong_punishment" else fn)
        elif ":" not in name and name not in BUILTIN_REWARD_NAMES and "." in name:  # TRL's module.function
            module, _, attr = name.rpartition(".")
            if not all(module.split(".")) or not attr:
                raise ValueError(f"--reward_funcs {name!r} is not a dotted import path: give module.function (e.g. my_rewards.short, "
                                 f"my_lib.rewards.short, imported from the current folder), a name of TRL's ({', '.join(TRL_SCRIPT_REWARDS)}) "
                                 "or, for a reward model folder, --reward_model_name_or_path.")
            specs.append(f"{module}:{attr}")
        else:
            specs.append(name)
    return specs

