"""Gradient checkpointing whose recomputed layers run as their forward ran; the attention switch both read.

transformers checkpoints each decoder layer (`gradient_checkpointing_enable`,
torch.utils.checkpoint): backward runs the layer a second time, after the pass
that first ran it has returned. A pass that switched the model's attention for
its forward (`attention_implementation`: update/logprobs.py runs shared-prompt
rows through grouped attention) has switched it back by then, so the recomputed
layer would attend through another function. `enable_gradient_checkpointing`
gives torch's non-reentrant checkpoint a `context_fn` whose recompute context
sets the attention the layer ran with: the recomputation is the forward again,
and `recomputes_as_forward` tells the pass it may switch.

The bf16 working copy (working_copy.py) needs nothing of this: the recomputation
runs under the forward's autocast (torch.utils.checkpoint restores it), whose
cast of an fp32 weight equals the copy bit for bit, and backward runs the
forward's graph, so the gradients still reach the fp32 weights through the copy.

Reentrant checkpointing (`use_reentrant=True`) takes no `context_fn`: its
layers recompute under the model's own attention, and the pass keeps that one.

The switch is the model config's attribute, read by every thread that runs the
model: blocks under `attention_implementation` run one at a time, so the async
producer's pass never runs a layer under the update's switch, nor the reverse.

Not here: which passes switch attention and why (update/logprobs.py, update/grouped_attention.py).
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from transformers import PreTrainedModel

from ..config.checks import check_checkpointing_kwargs
from .loading import is_peft_model

# transformers 5.25 renamed gradient checkpointing to activation checkpointing: the old methods and property warn
# (FutureWarning) and go in v6, so the installed version's own name is called; read once, from the class.
_ACTIVATION_NAMES = "activation_checkpointing_enable" in vars(PreTrainedModel)

# Models whose checkpointed layers recompute under the forward's attention (`enable_gradient_checkpointing`).
_RECOMPUTED_AS_FORWARD: weakref.WeakSet = weakref.WeakSet()

# Held by every block that runs a model under `attention_implementation`, switched or not: the config is one object
# that every thread running the model reads (the async producer's π_behaviour pass runs beside the update).
_SWITCH = threading.RLock()


@contextmanager
def attention_implementation(model, name: str | None):
    """Run `model` (its config, as transformers' layers read it at each call) with attention `name` for the block; None: unchanged.

    The name is one registered with transformers' `AttentionInterface` (or a built-in one); the
    model's previous implementation is restored on leaving, also when the block raises. One block
    runs at a time in the process (`_SWITCH`, re-entrant in one thread): a forward in another thread
    never reads a switch that is not its own.
    """
    with _SWITCH:
        if name is None:
            yield
            return
        config = getattr(model, "module", model).config
        before = config._attn_implementation
        config._attn_implementation = name
        try:
            yield
        finally:
            config._attn_implementation = before


def enable_gradient_checkpointing(model: torch.nn.Module, kwargs: dict | None = None) -> None:
    """Recompute activations in the backward pass, each layer under the attention it ran with; with adapters, make the
    input embeddings' output need gradients.

    Args:
        model: a transformers model, or a peft model around one.
        kwargs: GRPOConfig's gradient_checkpointing_kwargs, for torch.utils.checkpoint through
            `gradient_checkpointing_enable`. None, or no `use_reentrant`: non-reentrant, as transformers
            chooses for None; `use_reentrant=None` is torch's reentrant default. A `context_fn` of the
            caller's still runs, inside ours; with `debug=True` (which takes no `context_fn`) the layers
            recompute under the model's own attention, as reentrant ones do.
    Raises:
        ValueError: kwargs torch.utils.checkpoint would misread or refuse (config/checks.check_checkpointing_kwargs:
            an unknown key, a value of the wrong kind, a pair torch refuses); GRPOConfig checked them already.

    The frozen embedding of an adapted model gives hidden states that need no gradient; reentrant
    checkpointing would then record no graph inside a checkpointed layer and the adapters there would
    get no gradient (what TRL and peft do for the same reason).
    """
    check_checkpointing_kwargs(kwargs)
    kwargs = {"use_reentrant": False, **(kwargs or {})}
    # torch: None is reentrant (its default).
    as_forward = kwargs["use_reentrant"] is not None and not kwargs["use_reentrant"] and not kwargs.get("debug", False)
    if as_forward:
        kwargs["context_fn"] = partial(_as_forward, getattr(model, "module", model), kwargs.get("context_fn"))
    if _ACTIVATION_NAMES:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    (_RECOMPUTED_AS_FORWARD.add if as_forward else _RECOMPUTED_AS_FORWARD.discard)(model)
    if is_peft_model(model):
        model.enable_input_require_grads()


def recomputes_as_forward(model: torch.nn.Module) -> bool:
    """Whether `model`'s layers, if checkpointed, recompute under the attention their forward ran with.

    True without gradient checkpointing (nothing is recomputed) and where `enable_gradient_checkpointing`
    set it up non-reentrant; False where checkpointing was enabled otherwise (reentrant, or by
    `gradient_checkpointing_enable` directly), so a pass must not switch attention for its forward.
    """
    return not is_checkpointed(model) or model in _RECOMPUTED_AS_FORWARD


def is_checkpointed(model: torch.nn.Module) -> bool:
    """Whether any of `model`'s modules recomputes in backward: transformers' own test (a module whose
    `gradient_checkpointing` is True), read directly because its name moved (`is_gradient_checkpointing`,
    deprecated for `is_activation_checkpointing` in transformers 5.25, which `make train` installs; gone in v6)."""
    return any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())


def _as_forward(model, context_fn) -> tuple:
    """torch.utils.checkpoint's `context_fn`: (forward context, recompute context), the latter setting the attention read now."""
    forward, recompute = context_fn() if context_fn is not None else (nullcontext(), nullcontext())
    name = model.config._attn_implementation

    @contextmanager
    def as_forward():
        with recompute, attention_implementation(model, name):
            yield

    return forward, as_forward()
