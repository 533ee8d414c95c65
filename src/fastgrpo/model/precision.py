"""The run's number format: bf16 products where the hardware multiplies bf16 fast, fp32 elsewhere.

`bf16=None` (the default) asks the hardware:

- a CPU with AMX-BF16 or AVX512-BF16 (`torch.cpu.get_capabilities()`): on —
  oneDNN runs bf16 products on those units several times faster than fp32;
- a CPU without them: off — bf16 products are emulated there and run slower
  than fp32 (measured on an AVX2-only AMD EPYC: docs/benchmarks.md);
- CUDA: on where `torch.cuda.is_bf16_supported()`.

What bf16 changes is the products only (docs/design.md, "Precision"): master
weights, gradients and AdamW state stay fp32; the log-softmax, entropy and KL
of the LM head, the loss, advantages and KL are fp32. π_θ, π_old and π_ref all
run under the same autocast, so ρ = 1 and KL = 0 exactly where weights agree.

The autocast is fastgrpo's own (`autocast_for`), not accelerate's
`mixed_precision`: accelerate keeps one precision per process (its state is a
singleton), while a process may build trainers of both precisions.

Not here: where the autocast applies (every log-prob pass, logprobs.py; reward
models, reward_models.py); the sampler's bf16 weights (generation/weight_copy.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import NamedTuple

import torch

# x86 capabilities (torch.cpu.get_capabilities names) that multiply bf16 in hardware.
CPU_BF16_UNITS = ("amx_bf16", "avx512_bf16")


class Precision(NamedTuple):
    """What `resolve_bf16` decided."""

    bf16: bool  # run products in bf16 (autocast)
    notice: str | None  # one start-up line saying which and why; None when the user chose


def resolve_bf16(bf16: bool | None, use_cuda: bool, cpu_capabilities: Mapping | None = None, cuda_bf16: bool | None = None) -> Precision:
    """Decide bf16 for the run: the user's choice, else what the device multiplies fast.

    Args:
        bf16: GRPOConfig.bf16; True/False are kept as given (no notice).
        use_cuda: the run trains on a CUDA device.
        cpu_capabilities: `torch.cpu.get_capabilities()` (the default); tests pass a mapping.
        cuda_bf16: `torch.cuda.is_bf16_supported()` (the default when use_cuda).
    Returns:
        `Precision(bf16, notice)`.
    """
    if bf16 is not None:
        return Precision(bf16, None)
    if use_cuda:
        supported = torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16
        why = "this GPU supports bf16" if supported else "this GPU has no bf16 support"
        return Precision(supported, f"bf16 {'on' if supported else 'off'}: {why} (set bf16=True/False to choose).")
    caps = torch.cpu.get_capabilities() if cpu_capabilities is None else cpu_capabilities
    units = [name for name in CPU_BF16_UNITS if caps.get(name)]
    cpu = caps.get("cpu_name") or "this CPU"
    if units:
        return Precision(True, f"bf16 on: {cpu} multiplies bf16 in hardware ({', '.join(units)}); bf16=False for fp32.")
    return Precision(
        False,
        f"bf16 off: {cpu} has neither AMX-BF16 nor AVX512-BF16, so bf16 products would run slower than fp32; bf16=True forces it.",
    )


def autocast_for(device: torch.device, bf16: bool) -> Callable[[], AbstractContextManager]:
    """A zero-argument context factory: bf16 autocast on `device`'s type, or (fp32) one that changes nothing."""
    return partial(torch.autocast, device.type, dtype=torch.bfloat16) if bf16 else nullcontext
