"""Choosing the generation backend once, from the config: fastgrpo's own sampler or transformers' `generate`.

`build_backend` is the one place that knows which backends exist; the loop then calls the chosen one through
the contract (contract.py) only.

Not here: the backends themselves (sampler.py, transformers_generate.py), their weight copies (weight_copy.py).
"""

from __future__ import annotations

import warnings

import torch

from ..config.checks import GENERATION_BACKENDS
from .contract import GenerationBackend, SamplingSettings
from .sampler import Sampler, unsupported_reason
from .transformers_generate import TransformersGenerator
from .weight_copy import GatheredCopy, MergedCopy


def build_backend(args, policy: torch.nn.Module, sampling: SamplingSettings, *, bf16: bool, gathered: GatheredCopy | None = None) -> GenerationBackend:
    """The `GenerationBackend` for `args.generation_backend`: fastgrpo's `Sampler`, or transformers' `generate`.

    Args:
        args: the GRPOConfig (`generation_backend`: "fastgrpo" or "transformers").
        policy: the policy (unwrapped from DDP; a peft model is fine).
        sampling: the `SamplingSettings` every backend samples with.
        bf16: the policy trains in bf16: fastgrpo's sampler samples from its own bf16 copy
            (`MergedCopy`, a second policy, updated once per rollout). `generate` runs the policy itself.
        gathered: under FSDP, the whole copy of the sharded policy (`GatheredCopy`) either backend runs;
            it takes the place of the bf16 copy.
    Returns:
        A `Sampler`, or a `TransformersGenerator` when asked for or when the
        sampler cannot run this model (a one-line `UserWarning` says why).
    Raises:
        ValueError: an unknown backend.
    """
    backend = args.generation_backend
    if backend not in GENERATION_BACKENDS:
        raise ValueError(f"generation_backend={backend!r}: use one of {', '.join(GENERATION_BACKENDS)}.")
    model = gathered.module if gathered is not None else policy
    if backend == "fastgrpo":
        reason = unsupported_reason(model)
        if reason is None:
            copy = gathered if gathered is not None else MergedCopy(policy, torch.bfloat16) if bf16 else None
            return Sampler(model, sampling, weight_copy=copy)
        warnings.warn(f"fastgrpo's sampler cannot run {reason}; generating with transformers' generate instead.", stacklevel=2)
    return TransformersGenerator(policy, sampling, weight_copy=gathered)
