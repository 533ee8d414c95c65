"""The entropy bonus's coefficient c, fixed or adapted once per optimizer step (Skywork-OR1).

`losses.grpo_loss` subtracts c·H (H: the micro-batch's mean entropy over the
policy tokens); this module says which c every micro-batch of a step applies
and moves it between steps, as TRL 1.16's `entropy_coef` /
`use_adaptive_entropy` do:

- fixed (`use_adaptive_entropy=False`): c = `entropy_coef` throughout;
- adaptive (Skywork-OR1, arXiv 2505.22312, MAGIC's "adaptive entropy control"):
  after each optimizer step, with H_k the step's entropy (token mean over the
  policy tokens of every micro-batch on every process),

      c_{k+1} = min(c_k + Δ, c_max)  if H_k ≤ H_target,  else max(c_k − Δ, c_min)

  and the next step applies c_{k+1} only while H_k ≤ H_target (0 otherwise,
  and 0 on the first step, before any H is measured).

The state (c, last H) is saved in every checkpoint and restored on resume.

Not here: the bonus term itself (`losses.entropy_bonus`), the entropies
(logprobs.py, with gradient when the bonus is on).
"""

from __future__ import annotations

import math

import torch


def adaptive_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, coef_min: float, coef_max: float) -> float:
    """One Skywork-OR1 update of the coefficient: up by Δ while H ≤ target (entropy collapsing), else down; clamped.

    Args:
        coef: c_k. entropy: H_k, nats. target, delta, coef_min, coef_max: TRL's
            entropy_target, entropy_coef_delta, entropy_coef_min, entropy_coef_max.
    Returns:
        c_{k+1}, in [coef_min, coef_max] once any update has moved it there.
    """
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


class EntropyControl:
    """The coefficient of the entropy bonus across optimizer steps (fixed or adaptive), with its checkpoint state.

    Args:
        coef: the initial c (`entropy_coef`).
        adaptive: `use_adaptive_entropy`.
        target, delta, coef_min, coef_max: as `adaptive_entropy_coef`.
    Attributes:
        coef: c after the last update (TRL's logged `entropy_coef`).
        last_entropy: H of the last step, nats (inf before the first).
    """

    def __init__(self, coef: float, adaptive: bool, target: float, delta: float, coef_min: float, coef_max: float):
        self.coef, self.adaptive, self.last_entropy = coef, adaptive, math.inf
        self.bounds = {"target": target, "delta": delta, "coef_min": coef_min, "coef_max": coef_max}

    @classmethod
    def from_config(cls, args) -> EntropyControl | None:
        """From a GRPOConfig; None when the bonus is off (entropy_coef = 0, not adaptive), as TRL's `_entropy_bonus_enabled`."""
        if args.entropy_coef == 0 and not args.use_adaptive_entropy:
            return None
        return cls(args.entropy_coef, args.use_adaptive_entropy, args.entropy_target, args.entropy_coef_delta,
                   args.entropy_coef_min, args.entropy_coef_max)

    def applied(self) -> float:
        """The c every micro-batch of this step multiplies H by: c, or 0 while adaptive and the last H was above target."""
        if self.adaptive and not self.last_entropy <= self.bounds["target"]:
            return 0.0
        return self.coef

    def update(self, entropy_sum: float, tokens: float) -> float:
        """After an optimizer step: the step's Σ H and token count over all processes → the new c (returned, to log).

        A fixed coefficient stays as it is.
        """
        if self.adaptive:
            self.last_entropy = entropy_sum / max(tokens, 1.0)
            self.coef = adaptive_entropy_coef(self.coef, self.last_entropy, **self.bounds)
        return self.coef

    def step_end(self, sums: dict, accelerator) -> float:
        """`update` from one step's metric sums of this process (`bonus_entropy`, `bonus_tokens`), summed over all processes."""
        if not self.adaptive:
            return self.coef
        stats = torch.stack([torch.as_tensor(sums["bonus_entropy"]), torch.as_tensor(sums["bonus_tokens"])]).double()
        if accelerator.num_processes > 1:  # a token mean over all processes: the same c on each
            stats = accelerator.reduce(stats.to(accelerator.device), reduction="sum")
        return self.update(float(stats[0]), float(stats[1]))

    def state_dict(self) -> dict:
        return {"entropy_coef": self.coef, "last_world_entropy": self.last_entropy}  # TRL's entropy_ctrl_state.json keys

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = state["entropy_coef"], state["last_world_entropy"]
