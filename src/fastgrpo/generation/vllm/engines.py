"""What the vLLM backend needs from an engine, whichever process runs it: the contract of colocate.py and server.py.

Not here: the backend built on it (backend.py), the engines themselves (colocate.py, server.py).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class Completion(NamedTuple):
    """One sampled completion: its tokens (the stop token included when one ended it) and each token's log-prob."""

    tokens: list[int]
    logps: list[float]  # vLLM's processed log-prob of each sampled token (`LOGPROBS_MODE` below); [] when none were asked for
    stop_string: bool = False  # a stop string ended it (vLLM's stop_reason is the string): its last token completes it


class PushSeconds(NamedTuple):
    """One weight push's wall-clock seconds by part, under TRL 1.16 AsyncGRPOTrainer's weight-sync phases (`_sync_weight`)."""

    transfer: float  # the weights into the engine: the folder written and reloaded, or the NCCL broadcast (TRL's transfer)
    pause: float  # the prefix cache dropped, running requests preempted: TRL's pause, which freezes them and clears the caches


# vLLM's log-probs after its logits processing (temperature, penalties, truncation), as TRL's server runs it:
# with no truncation and no penalty that is log softmax(logits / T), the distribution π_old is taken over.
LOGPROBS_MODE = "processed_logprobs"


class Engine(Protocol):
    """A vLLM engine holding one model: samples token-id prompts, reloads its weights from a folder."""

    description: str  # where it runs, for messages ("vLLM in this process", "the vLLM server at http://…")
    pushes_weights: bool  # this process writes the weights (False: another training process does, for a shared server)
    max_model_len: int | None  # the longest prompt + completion it takes, tokens (None: a server that does not say)

    def generate(self, prompts: list[list[int]], params: dict) -> list[list[Completion]]:
        """One list of `params["n"]` completions per prompt, in prompt order; `params` are vLLM `SamplingParams` fields."""
        ...

    def push(self, weights: dict[str, torch.Tensor]) -> PushSeconds:
        """Replace every weight with `weights` (a plain model's names, full tensors), then drop the prefix cache
        (it holds the old weights' keys and values); → the seconds each took."""
        ...

    def close(self) -> None:
        """Stop what this process started (the colocated engine); a server keeps running."""
        ...
