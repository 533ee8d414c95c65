"""A backend's own weights, updated from the policy once per rollout (an inference engine's weight sync): one `update(policy)`.

An inference engine (vLLM, SGLang) samples from its own copy of the weights in
its own format and receives the trainer's weights once per rollout, after the
optimizer step. Two copies do the same in process, both behind `WeightCopy`
(`module`, `nbytes`, `update(policy)`), which a backend's `update_weights` calls:

- `MergedCopy`: a plain model of the policy's architecture in bf16 (no adapters,
  no gradients, eval mode); `update` writes `full_weights(policy)` into it, cast
  to bf16. The decode loop multiplies bf16 weights directly, never casting at
  each step. It is a second policy: its log-probs are corrected for.
- `GatheredCopy`: under FSDP, the whole unsharded policy (adapters kept as
  layers) in the dtype its sharded forward computes in; `update` gathers the
  shards, only the trainable ones after the first time (a LoRA base never
  moves, so its base is gathered once, where merging would gather it every
  rollout). It holds the trained weights themselves: no second policy.

`full_weights` is the one place that produces the policy's full weights:
LoRA adapters are merged there (W + ΔW, peft's own ΔW, in fp32 before the cast),
`modules_to_save` copies and trainable tokens put in place of what they train,
and a sharded parameter (an FSDP2 DTensor) is gathered there with `full_tensor()`
— one all-gather per rollout; the decode loop has no collectives.

Not here: sampling (sampler.py), deciding bf16 (model/precision.py), sharding (model/sharding.py).
"""

from __future__ import annotations

import copy
import time
from typing import Protocol

import torch
from torch import nn

from ..model.adapters import head_on_adapted_embedding, untie_config
from ..model.loading import decoder_of
from ..model.sharding import full_value
from ..model.working_copy import WorkingCopy


class WeightCopy(Protocol):
    """A backend's own copy of the policy's weights."""

    module: nn.Module  # the causal LM (or peft model around one) that samples
    nbytes: int  # its parameters' memory
    second_policy: bool  # its log-probs differ from the trained weights' (corrected for, importance sampling)

    def update(self, policy: nn.Module) -> None:
        """Write the policy's current weights into `module`."""
        ...

    def notices(self) -> list[str]:
        """One start-up sentence per thing worth knowing about the copy, else []."""
        ...


def full_weights(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights as its plain architecture names them: adapters merged, shards gathered.

    What `merge_and_unload()` would leave, for every peft construct, without touching the policy:
    a LoRA layer (Linear, or Embedding: `lora_embedding_A/B`) gives W + ΔW (peft's
    `get_delta_weight` for each active adapter); a `modules_to_save` copy gives the trained
    copy's weights under the module's own name and its `original_module` is left out (TRL's
    vLLM sync does the same); trainable tokens (`trainable_token_indices`) give the base
    embedding with the trained rows written in (peft's `get_merged_weights`). Adapter tensors
    themselves are left out; disabled adapters leave the base weights.

    Args:
        policy: a causal LM, or a peft model around one (the unwrapped module).
    Returns:
        {name: tensor} keyed like `named_parameters()` of a plain model of the
        same architecture (tied weights once; a head tied to an adapted embedding under its own name, the base
        weight: `head_on_adapted_embedding`); the policy's dtype.
    Raises:
        ValueError: a DoRA adapter (its merge is not W + ΔW).
    """
    lm = decoder_of(policy)
    out = {}
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if ".lora_" in name or ".trainable_tokens_delta." in name:  # adapter tensors: merged into their layer below
                continue
            weight = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP2: gather the shards
            if ".modules_to_save." in name or ".original_module." in name:  # peft's ModulesToSaveWrapper
                prefix, rest = name.split(".modules_to_save.", 1) if ".modules_to_save." in name else name.split(".original_module.", 1)
                wrapper = lm.get_submodule(prefix)
                trained = None if wrapper.disable_adapters else next((a for a in wrapper.active_adapters if a in wrapper.modules_to_save), None)
                if ".modules_to_save." in name:
                    adapter, rest = rest.split(".", 1)
                    if adapter != trained:
                        continue
                elif trained is not None:
                    continue
                name = f"{prefix}.{rest}"
            elif ".token_adapter.base_layer." in name:  # peft's TrainableTokensWrapper: the trained rows written in
                prefix, rest = name.split(".token_adapter.base_layer.", 1)
                layer = lm.get_submodule(f"{prefix}.token_adapter")
                if not layer.disable_adapters and layer.active_adapters and rest == "weight":
                    weight = layer.get_merged_weights(layer.active_adapters)
                name = f"{prefix}.{rest}"
            elif ".base_layer." in name:  # peft's LoRA layer: merge its active adapters in
                layer = lm.get_submodule(name.split(".base_layer.")[0])
                if not layer.disable_adapters and name.endswith("weight"):
                    weight = weight.clone()
                    for adapter in layer.active_adapters:
                        if getattr(layer, "use_dora", {}).get(adapter):
                            raise ValueError(
                                f"{name}: the sampler's bf16 copy merges adapters as W + ΔW, which DoRA (use_dora=True) is not; "
                                "use plain LoRA, bf16=False, or generation_backend='transformers'."
                            )
                        if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                            weight += layer.get_delta_weight(adapter).to(weight.dtype)
                name = name.replace(".base_layer.", ".")
            out[name] = weight.detach()
        head = head_on_adapted_embedding(lm)  # its tensor is the embedding's base: merged above, so given apart, unmerged
        if head is not None:
            out[head] = full_value(lm.get_output_embeddings().weight).detach()
    return out


class MergedCopy:
    """The sampler's bf16 copy of `policy` (a `WeightCopy`), updated from `full_weights(policy)`.

    Args:
        policy: the trained model (unwrapped; a peft model is fine).
        dtype: the copy's dtype (torch.bfloat16).
        working: the update's `WorkingCopy` of a plain policy (model/working_copy.py) in `dtype`:
            the copy's parameters are its tensors (the weights held in bf16 once, not twice) and
            `update` recasts only what changed; None: a copy of its own.
    Attributes:
        module: the copy, a plain model of the policy's architecture (eval, no grad); read when sampling.
        nbytes: bytes its parameters hold of their own (0 when they are the working copy's).
    The copy is allocated once; its buffers (rotary frequencies) are the
    policy's own, in their own dtype.
    """

    second_policy = True

    def __init__(self, policy: nn.Module, dtype: torch.dtype = torch.bfloat16, working: WorkingCopy | None = None):
        if working is not None and working.dtype != dtype:
            raise ValueError(f"MergedCopy(dtype={dtype}) cannot share a {working.dtype} WorkingCopy; pass one of {dtype}.")
        self.dtype, self.working = dtype, working
        lm = decoder_of(policy)
        device = next(lm.parameters()).device
        config = untie_config(lm.config) if head_on_adapted_embedding(lm) is not None else lm.config  # ΔW must not reach the head
        with torch.device("meta"):  # no fp32 allocation nor random init: every value is written below
            plain = type(lm)(config)
        plain.to_empty(device=device).tie_weights()  # to_empty unties shared parameters; the config says which to share
        own = dict(lm.named_parameters())
        for name, param in plain.named_parameters():
            param.data = working.cast(own[name]) if working is not None else torch.empty(param.shape, dtype=dtype, device=device)
        buffers = dict(lm.named_buffers())
        for name, buffer in plain.named_buffers():
            module, _, leaf = name.rpartition(".")
            plain.get_submodule(module)._buffers[leaf] = buffers[name].clone()
        self._module = plain.eval().requires_grad_(False)
        self.nbytes = 0 if working is not None else sum(p.numel() * p.element_size() for p in self._module.parameters())
        self.update(policy)

    @torch.no_grad()
    def update(self, policy: nn.Module) -> None:
        """Write the policy's current full weights into the copy (rounded to `dtype`, as `Tensor.to` rounds)."""
        if self.working is not None:  # the copy's tensors are the working copy's: recast what changed
            self.working.refresh()
            return
        weights = full_weights(policy)
        for name, param in self._module.named_parameters():
            param.copy_(weights[name])

    @property
    def module(self) -> nn.Module:
        """The copy. Sharing a working copy, its tensors are recast first where the policy changed or the update handed
        them back (model/working_copy.py's `release`): the sampler never reads a handed-back copy's zeros."""
        if self.working is not None:
            self.working.refresh()
        return self._module

    def notices(self) -> list[str]:
        """The copy's dtype and memory, as one start-up sentence."""
        if self.working is not None:
            return [f"the sampler and the update share one {str(self.dtype).removeprefix('torch.')} copy of the weights "
                    f"({self.working.nbytes / 2**20:.0f} MiB), recast once per optimizer step."]
        return [f"the sampler samples from its own {str(self.dtype).removeprefix('torch.')} copy of the weights "
                f"({self.nbytes / 2**20:.0f} MiB), refreshed once per rollout."]


class GatheredCopy:
    """The sampler's own whole, unsharded copy of a sharded policy (a `WeightCopy`), updated by one gather per rollout.

    Args:
        model: the policy before `shard` (whole weights); it is deep-copied, frozen and put in eval mode.
        dtype: the copy's dtype (bf16 under bf16: half the memory of an fp32 copy; None: the weights' own).
    Attributes:
        module: the copy the sampler runs; no parameter of it is a DTensor, so decoding sends nothing.
        seconds: wall-clock seconds of the last `update`.
        nbytes: the copy's parameter memory.
    Memory: one whole model per process in `dtype`, plus one gathered fp32 parameter at a time.
    """

    second_policy = False  # the weights the sharded forward computes with (param_dtype), gathered

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        if dtype is not None:
            self.module.to(dtype)
        self.params = dict(self.module.named_parameters())
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params.values())
        self.seconds, self.updated = 0.0, False

    @torch.no_grad()
    def update(self, policy: nn.Module) -> None:
        """Copy the sharded policy's current weights into `module`; every process calls it, once per rollout.

        Only trainable parameters change between rollouts (the base of a LoRA policy
        never does), so after the first update only they are gathered: one
        all-gather per trainable parameter, each freed after its copy.
        """
        start = time.perf_counter()
        for name, param in policy.named_parameters():
            if param.requires_grad or not self.updated:
                self.params[name].copy_(full_value(param.detach()))
        self.seconds, self.updated = time.perf_counter() - start, True

    def notices(self) -> list[str]:
        """Nothing at start-up (docs/distributed.md describes the gathered copy)."""
        return []
