"""The mixture-of-experts router's load-balancing loss, added to the GRPO loss as TRL 1.16 adds it.

A mixture-of-experts model (Qwen3-MoE, Mixtral, GPT-OSS, OLMoE, …) declares
`output_router_logits` in its config; with it, its forward returns `aux_loss`,
the Switch Transformer load-balancing loss (Fedus et al. 2021, eqs. 4–6),
E · Σ_e f_e · P_e over every layer's router logits, f_e the share of top-k
assignments to expert e and P_e its mean router probability, over the non-pad
tokens of the batch (transformers' `load_balancing_loss_func` in each model's
file). TRL's GRPOTrainer adds `router_aux_loss_coef · aux_loss` to each
micro-batch's loss (divided by the accumulation steps, as its policy loss is)
and logs `aux_loss`; `RouterAuxLoss` is that decision, made once per run.

The packed forward (logprobs.py) gives the model no 2-D mask: every packed token
is real, so the model's own function over the packed row counts the same tokens
as over TRL's padded micro-batch, each completion with its own copy of the
prompt (prompts are not shared while the loss is on: a shared prompt would
count once instead of once per completion). Every other forward passes
`output_router_logits=False` (`router_kwargs`), since with a 4-D mask, or the
cache's one new token per row, the model's own function reads a mask of the
wrong size (transformers 5.19).

Not here: the forward (update/logprobs.py), adding the loss and logging it (update/step.py).
"""

from __future__ import annotations

from dataclasses import dataclass


def declares_router_logits(config) -> bool:
    """Whether a model config (its text config for a multimodal one) is a mixture-of-experts one that can return router logits (TRL's test)."""
    return getattr(config.get_text_config(), "output_router_logits", None) is not None


def router_kwargs(config, on: bool) -> dict:
    """The forward keyword for a model with `config`: {"output_router_logits": on} for a mixture-of-experts model, else {}."""
    return {"output_router_logits": on} if declares_router_logits(config) else {}


@dataclass(frozen=True)
class RouterAuxLoss:
    """Whether the run adds the router's load-balancing loss, and its weight (TRL 1.16's `aux_loss_enabled`, `router_aux_loss_coef`)."""

    coef: float  # weight of aux_loss in the loss; 0.0: not added
    enabled: bool  # a mixture-of-experts model with coef ≠ 0

    @classmethod
    def from_config(cls, router_aux_loss_coef: float | None, model_config) -> RouterAuxLoss:
        """TRL's rule: the GRPOConfig's coefficient, or when None the model config's `router_aux_loss_coef` (0.0 when it declares none).

        Raises:
            ValueError: a non-zero coefficient for a model that returns no router logits (TRL raises the same).
        """
        text = model_config.get_text_config()
        coef = getattr(text, "router_aux_loss_coef", 0.0) if router_aux_loss_coef is None else router_aux_loss_coef
        moe = declares_router_logits(model_config)
        if router_aux_loss_coef and not moe:
            raise ValueError(
                f"router_aux_loss_coef={router_aux_loss_coef} but {text.model_type} is not a mixture-of-experts model that "
                "returns its router logits, so there is no auxiliary loss to weight; leave router_aux_loss_coef unset."
            )
        return cls(float(coef or 0.0), moe and bool(coef))
