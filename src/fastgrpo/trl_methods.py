"""TRL's public `GRPOTrainer` helper methods that tests and users call directly, on a mixin.

`GRPOTrainer` inherits `TRLMethods`, so `GRPOTrainer.get_high_entropy_mask(trainer, …)`
works as in TRL (TRL's own tests call it on a `Mock(spec=GRPOTrainer)` that has
only an `accelerator`). Each method keeps TRL's signature and meaning; the maths
lives in losses.py.

Not here: the training loop (trainer.py), the loss terms (losses.py).
"""

from __future__ import annotations

import torch

from .algo.sampling_correction import off_policy_mask
from .algo.losses import entropy_threshold, high_entropy_mask


class TRLMethods:
    """TRL 1.16 `GRPOTrainer` helpers; the class using it provides `accelerator`."""

    get_off_policy_mask = staticmethod(off_policy_mask)  # TRL's static method, same signature (importance_sampling.py)

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's method: (B, T) bool, active tokens whose entropy is ≥ the `threshold` quantile (in [0, 1]) of the
        active tokens of this micro-batch on all processes, as if one process held them all.

        Args:
            entropies: (B, T) float, per-token entropy of the policy (nats).
            mask: (B, T) 0/1, the tokens that count.
            threshold: the quantile, 1 − top_entropy_quantile (TRL's argument).
        Source: Wang et al. 2025, "Beyond the 80/20 rule" (arXiv 2506.01939); TRL's `get_high_entropy_mask`.
        """
        acc = self.accelerator
        active = entropies[mask.bool()].float()
        if acc.num_processes > 1:  # -1: padding sentinel, entropies are ≥ 0
            active = acc.gather(acc.pad_across_processes(active, dim=0, pad_index=-1.0))
            active = active[active >= 0]
        return high_entropy_mask(entropies, mask, entropy_threshold(active, 1 - threshold)).bool()
