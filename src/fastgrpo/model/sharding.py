"""FSDP2: the policy and π_ref sharded per decoder layer, gathered whole for sampling and for saving.

Asked for with `accelerate launch --config_file examples/accelerate/fsdp.yaml`
(or `torchrun` with `ACCELERATE_USE_FSDP=true FSDP_VERSION=2`, the variables
that file sets). On GPUs accelerate's FSDP plugin shards the model in
`accelerator.prepare`. On CPUs accelerate 1.15 makes no FSDP run (it sets up
FSDP only for GPU-like devices and leaves a CPU run as MULTI_CPU, i.e. DDP),
so `shard` applies the same `torch.distributed.fsdp.fully_shard` itself:
each decoder layer (`_no_split_modules`, accelerate's TRANSFORMER_BASED_WRAP),
then the root; fp32 master shards, and with bf16 `MixedPrecisionPolicy`
(bf16 parameters in the forward/backward, fp32 gradient reduction).

What crosses processes under FSDP2, besides what DDP sends (docs/distributed.md):
each layer's weights all-gathered in its forward and backward, gradients
reduce-scattered after each backward, and once per rollout the whole model
gathered into the sampler's copy (generation/weight_copy.GatheredCopy), so decoding runs with no
collective inside its loop (processes finish their completions at different
steps; a per-token all-gather would make them wait for each other or hang).

Not here: when checkpoints are written (run/checkpoint_files.py uses `save_sharded` /
`load_sharded`), the loop (trainer.py), anything DeepSpeed.
"""

from __future__ import annotations

import os

import torch
from torch import nn

# The launcher's request (accelerate launch sets these from its config file's fsdp_config).
_USE_FSDP, _VERSION, _RESHARD, _CHECKPOINTING = "ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_RESHARD_AFTER_FORWARD", "FSDP_ACTIVATION_CHECKPOINTING"


def _flag(name: str, default: str = "false") -> bool:
    return os.environ.get(name, default).lower() in ("1", "true", "yes")


def fsdp_requested() -> bool:
    """Whether the launcher asked for FSDP (`distributed_type: FSDP` in an accelerate config file).

    Raises:
        ValueError: FSDP version 1 (`fsdp_version: 1`), which fastgrpo does not run;
            `fsdp_activation_checkpointing: true` (use GRPOConfig's gradient_checkpointing).
    """
    if not _flag(_USE_FSDP):
        return False
    if os.environ.get(_VERSION, "2") != "2":
        raise ValueError(f"fsdp_version={os.environ[_VERSION]}: fastgrpo shards with FSDP2 only; set fsdp_version: 2 in the accelerate config.")
    if _flag(_CHECKPOINTING):
        raise ValueError("fsdp_activation_checkpointing: true is not read by fastgrpo; set it false and use gradient_checkpointing=True in GRPOConfig.")
    return True


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` (or, for DDP-like wrappers, its `.module`) is an FSDP2 module holding DTensor shards."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "module", model), FSDPModule)


def _layer_classes(model: nn.Module) -> set[str]:
    """Class names of the decoder layers transformers says must not be split (`_no_split_modules`)."""
    for module in model.modules():
        if getattr(module, "_no_split_modules", None):
            return set(module._no_split_modules)
    raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules); FSDP2 shards per decoder layer.")


@torch.no_grad()
def broadcast_weights(model: nn.Module) -> None:
    """Give every process process 0's weights and buffers, in place, as DDP does when it wraps a model.

    Weights drawn after the per-process seed (fresh LoRA adapters, a new head) differ
    between processes otherwise, and each FSDP shard would keep its own process's draw.
    Every process must call it: one broadcast per tensor.
    """
    import torch.distributed as dist

    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def shard(model: nn.Module, bf16: bool) -> nn.Module:
    """Shard `model` in place with FSDP2 over all processes: each decoder layer, then the root.

    Args:
        model: a transformers model or peft `PeftModel`, whole on every process (same
            weights: every process builds it from the same seed or files); adapters,
            dropout and gradient checkpointing already set up.
        bf16: compute in bf16 (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`);
            the shards, gradients and optimizer state stay fp32.
    Returns:
        The same object, now an `FSDPModule`: parameters are `DTensor`s of shape
        (⌈rows / world⌉, …) per process; forward and backward gather each layer as they go.
    Raises:
        ValueError: the model has weights on the meta device (accelerate's
            fsdp_cpu_ram_efficient_loading, which on CPU fastgrpo does not broadcast);
            no decoder layer class.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if any(p.is_meta for p in model.parameters()):
        raise ValueError(
            "the model was loaded without weights on this process (fsdp_cpu_ram_efficient_loading: true); on CPU every "
            "process loads the whole model before sharding: set fsdp_cpu_ram_efficient_loading: false "
            "(accelerate launch --fsdp_cpu_ram_efficient_loading false)."
        )
    reshard = _flag(_RESHARD, "true")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    classes = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in classes:
            fully_shard(module, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=policy)
    return model


def full_value(x):
    """A `DTensor`'s whole value as a plain tensor (an all-gather); anything else as it is.

    For the gradient norm `clip_grad_norm_` returns over sharded gradients (a replicated DTensor).
    """
    from torch.distributed.tensor import DTensor

    return x.full_tensor() if isinstance(x, DTensor) else x


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on process 0 as plain CPU tensors (name → tensor, the model's own names); {} elsewhere.

    Every process must call it (one all-gather per parameter). Memory: one whole
    copy of the model in its weights' dtype, on process 0 only.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(folder: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the model's and optimizer's shards to `folder` (torch.distributed.checkpoint); every process calls it.

    Files: `.metadata` and one `__<rank>_0.distcp` per process. Only trainable
    parameters are written (a LoRA run saves its adapters; the base loads from the model).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    weights, optim = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=folder)


def load_sharded(folder: str, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load `save_sharded`'s files into `model` and `optimizer`, resharded to this run's processes.

    The checkpoint may come from another number of processes, and `model` may be
    sharded or whole: torch.distributed.checkpoint reads each process's part from
    whichever files hold it. `optimizer` None: the weights alone (load_best_model_at_end's, as
    transformers' `Trainer._load_best_model` loads the model only).

    Raises:
        ValueError: the saved weights are not this model's trainable ones (e.g. adapters
            saved, a whole model to train now), naming the first differences; before anything is loaded.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(ignore_frozen_params=True, strict=False)  # frozen weights are neither saved nor loaded
    weights, optim = get_state_dict(model, () if optimizer is None else optimizer, options=options)
    saved = {key.removeprefix("model.") for key in dcp.FileSystemReader(folder).read_metadata().state_dict_metadata if key.startswith("model.")}
    if saved != set(weights):
        raise ValueError(f"it holds {len(saved)} trainable weights, this model {len(weights)} (only saved: "
                         f"{sorted(saved - set(weights))[:3]}, only here: {sorted(set(weights) - saved)[:3]}).")
    state = {"model": weights} if optimizer is None else {"model": weights, "optimizer": optim}  # the saved optimizer's keys are left unread
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, () if optimizer is None else optimizer, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}),
                   options=options)
