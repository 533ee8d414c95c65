"""The no-gradient log-prob passes of a rollout: π_old for the micro-batches used after an update, π_ref (k3 KL).

Both run the rows they are given as one pass each through `LogProbs` (logprobs.py), in the policy's precision:
the trainer gives the update's own passes (step.OptimizerStep.passes), so each token's log-prob is computed from
the same packed row as in the update. The rollout record itself is never changed (each returns the (N, T) tensor to set).

Not here: the policy pass with gradients (step.py), which π_old rows are needed (trainer.py's loop).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from ..rollout.record import Rollout
from .logprobs import LogProbs


class LogProbPasses:
    """π_old and π_ref log-probs of a rollout's completion tokens.

    Args:
        log_probs: the `LogProbs` pass (temperature, autocast).
        reference: () → a context yielding the model to run for π_ref.
        k3_reference: whether π_ref log-probs are stored (beta > 0 and kl_estimator "k3"); the exact KL needs π_ref's
            logits at update time instead.
        timer: phase timer; phases "old_logps" and "ref_logps".
    """

    def __init__(self, log_probs: LogProbs, reference: Callable[[], AbstractContextManager], k3_reference: bool, timer):
        self.log_probs, self.reference, self.k3_reference, self.timer = log_probs, reference, k3_reference, timer

    @torch.no_grad()
    def old(self, model, rollout: Rollout, batches: list[slice]) -> torch.Tensor:
        """(N, T) log π_θ of the rows in `batches` (one pass per slice), NaN elsewhere; entries of rollout.old_logps already set (a carried group's π_behaviour) stay."""
        old = torch.full(rollout.completion_ids.shape, float("nan"), device=rollout.completion_ids.device)
        old = rollout.old_logps.clone() if rollout.old_logps is not None else old
        with self.timer("old_logps"):
            for rows in batches:
                logps = self.log_probs(model, rollout.select(rows)).logps
                kept = old[rows, : logps.shape[1]]
                old[rows, : logps.shape[1]] = torch.where(torch.isnan(kept), logps, kept)
        return old

    @torch.no_grad()
    def ref(self, rollout: Rollout, batches: list[slice]) -> torch.Tensor | None:
        """(N, T) log π_ref per completion token, one pass per slice of `batches` (which cover the rollout); 0 past each
        row's trimmed length. None without a k3 KL."""
        if not self.k3_reference:
            return None
        ref = torch.zeros(rollout.completion_ids.shape, device=rollout.completion_ids.device)
        with self.timer("ref_logps"):
            for rows in batches:
                with self.reference() as ref_model:  # π_ref in the policy's precision (LogProbs' autocast): KL is 0 where they agree
                    logps = self.log_probs(ref_model, rollout.select(rows)).logps
                ref[rows, : logps.shape[1]] = logps
        return ref
