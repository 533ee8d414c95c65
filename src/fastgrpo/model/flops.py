"""Model FLOPs utilisation as TRL 1.16's AsyncGRPOTrainer computes it: a model's training FLOPs per token, a device's peak.

TRL logs `perf/mfu_fwd_bwd` and `perf/mfu_wall_clock` (`trl.trainer.utils`: `compute_flops_per_token`,
`get_peak_flops_per_device`, `compute_mfu`): 100 · FLOPs per token · tokens per second / (peak FLOP/s · devices).
The FLOPs are 3 × a forward's (backward = 2 forwards), with attention scored over the full sequence (the non-causal
convention of PaLM, Megatron, nanoGPT); the peak is a table of dense bf16/fp16 peaks looked up by the CUDA device's
name (TorchTitan's values). TRL has no peak for a device or dtype outside the table, a CPU among them, and then logs
no MFU; neither does fastgrpo (`peak_flops` is None).

Not here: timing the step (update/step.py), logging (run/overlap_metrics.py).
"""

from __future__ import annotations

import re

import torch
import transformers
from packaging.version import Version


# TRL 1.16's `_PEAK_FLOPS_BY_DEVICE` (dense FLOP/s by device name and dtype); more specific names before their prefixes.
PEAK_FLOPS_BY_DEVICE = (
    ("GB300", {"bfloat16": 2.5e15}), ("GB200", {"bfloat16": 2.5e15}), ("B300", {"bfloat16": 2.25e15}), ("B200", {"bfloat16": 2.25e15}),
    ("H100 NVL", {"float16": 835e12, "bfloat16": 835e12}), ("H100 PCIe", {"float16": 756e12, "bfloat16": 756e12}),
    ("H100", {"float16": 989e12, "bfloat16": 989e12}), ("H200 NVL", {"float16": 835e12, "bfloat16": 835e12}),
    ("H200", {"float16": 989e12, "bfloat16": 989e12}), ("H20", {"float16": 148e12, "bfloat16": 148e12}),
    ("RTX PRO 6000", {"float16": 500e12, "bfloat16": 500e12}), ("A100", {"float16": 312e12, "bfloat16": 312e12}),
    ("A6000", {"float16": 154.85e12, "bfloat16": 154.85e12}), ("A10G", {"float16": 125e12, "bfloat16": 125e12}),
    ("A10", {"float16": 125e12, "bfloat16": 125e12}), ("L40S", {"float16": 362e12, "bfloat16": 362e12}),
    ("L4", {"float16": 121e12, "bfloat16": 121e12}), ("T4", {"float16": 65e12}),
    ("MI355X", {"bfloat16": 2500e12}), ("MI325X", {"bfloat16": 1300e12}), ("MI300X", {"bfloat16": 1300e12}), ("MI250X", {"bfloat16": 191.5e12}),
)


def flops_per_token(config, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward = 3 forwards) of a causal LM at `seq_len` tokens per sequence.

    TRL 1.16's `compute_flops_per_token`, term for term: per layer the Q/K/V/O projections, the attention scores
    (2 · 2 · heads · head_dim · seq_len: QKᵀ and attention·V over the whole sequence) and the MLP (3 matmuls of
    hidden × intermediate; a mixture-of-experts layer: `num_experts_per_tok` experts of `moe_intermediate_size` and
    the router, every `decoder_sparse_step`-th layer), plus the LM head (2 · V · hidden). Where TRL's reading raises
    (Mixtral's config has no `moe_intermediate_size` nor `decoder_sparse_step`) the experts' size is `intermediate_size`
    and every layer is sparse, as Mixtral's are.

    Args:
        config: the model's text config (transformers' `PretrainedConfig.get_text_config()`).
        seq_len: tokens per sequence (TRL: the step's forwarded tokens per completion, rounded down).
    Returns:
        FLOPs per token, an int.
    """
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads  # Qwen2's config has none: transformers derives it so
    attention = 2 * h * (heads * head_dim + 2 * kv_heads * head_dim) + 2 * heads * head_dim * h + 2 * 2 * heads * head_dim * seq_len
    dense_mlp = 2 * 3 * h * config.intermediate_size
    experts_per_token = getattr(config, "num_experts_per_tok", None)  # the mixture-of-experts marker, as TRL reads it
    if experts_per_token is None:
        layer_flops = layers * (attention + dense_mlp)
    else:
        experts = config.num_local_experts if Version(transformers.__version__) >= Version("5.1.0") else config.num_experts
        expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size  # Mixtral's experts: TRL raises
        moe_mlp = experts_per_token * 2 * 3 * h * expert + 2 * h * experts
        step = getattr(config, "decoder_sparse_step", 1)
        layer_flops = sum(attention + (moe_mlp if i % step == 0 else dense_mlp) for i in range(layers))
    return 3 * (layer_flops + 2 * vocab * h)


def peak_flops_of(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of the device named `device_name` (as CUDA names it) in `dtype` ("bfloat16", "float16",
    "float32"): TRL 1.16's `get_peak_flops`, the first table entry whose name is a whole word of it; None for a device
    or dtype it does not list (float32 everywhere)."""
    name = device_name.casefold()
    for model, by_dtype in PEAK_FLOPS_BY_DEVICE:
        if re.search(rf"\b{re.escape(model.casefold())}\b", name):
            return by_dtype.get(dtype)
    return None


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """The training device's dense peak FLOP/s in `dtype` (`peak_flops_of` its CUDA name, TRL's
    `get_peak_flops_per_device`); None on a device that is not CUDA (TRL reads the name from CUDA only)."""
    return peak_flops_of(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation in percent: 100 · `flops` done in `seconds` / `peak` FLOP/s (TRL's `compute_mfu`, one device)."""
    return 100 * flops / seconds / peak
