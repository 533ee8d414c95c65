"""The sampler's own weights: a bf16 copy of the policy, refreshed once per rollout (an inference engine's weight sync).

An inference engine (vLLM, SGLang) samples from its own copy of the weights in
its own format and receives the trainer's weights once per rollout, after the
optimizer step. `WeightSync` does the same in process: the copy is a plain
model of the policy's architecture in bf16 (no adapters, no gradients, eval
mode) and `refresh()` writes `full_weights(policy)` into it, cast to bf16. The
decode loop then multiplies bf16 weights directly, never casting at each step.

`full_weights` is the one place that produces the policy's full weights:
LoRA adapters are merged there (W + ΔW, peft's own ΔW, in fp32 before the cast),
`modules_to_save` copies and trainable tokens put in place of what they train,
and a sharded parameter (an FSDP2 DTensor) is gathered there with `full_tensor()`
— one all-gather per rollout; the decode loop has no collectives.

Not here: sampling (sampler.py), deciding bf16 (precision.py).
"""

from __future__ import annotations

import torch
from torch import nn

from .models import decoder_of


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
        same architecture (tied weights once); the policy's dtype.
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
    return out


class WeightSync:
    """The sampler's bf16 copy of `policy`, refreshed from `full_weights(policy)`.

    Args:
        policy: the trained model (unwrapped; a peft model is fine).
        dtype: the copy's dtype (torch.bfloat16).
    Attributes:
        model: the copy, a plain model of the policy's architecture (eval, no grad).
        nbytes: bytes its parameters hold (the copy's memory).
    The copy is allocated once; its buffers (rotary frequencies) are the
    policy's own, in their own dtype.
    """

    def __init__(self, policy: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.policy, self.dtype = policy, dtype
        lm = decoder_of(policy)
        device = next(lm.parameters()).device
        with torch.device("meta"):  # no fp32 allocation nor random init: every value is written below
            copy = type(lm)(lm.config)
        copy.to_empty(device=device).tie_weights()  # to_empty unties shared parameters; the config says which to share
        for _, param in copy.named_parameters():
            param.data = torch.empty(param.shape, dtype=dtype, device=device)
        buffers = dict(lm.named_buffers())
        for name, buffer in copy.named_buffers():
            module, _, leaf = name.rpartition(".")
            copy.get_submodule(module)._buffers[leaf] = buffers[name].clone()
        self.model = copy.eval().requires_grad_(False)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Write the policy's current full weights into the copy (rounded to `dtype`, as `Tensor.to` rounds)."""
        weights = full_weights(self.policy)
        for name, param in self.model.named_parameters():
            param.copy_(weights[name])
