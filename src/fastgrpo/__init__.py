"""fastgrpo: GRPO fine-tuning of language models with multi-step rollout reuse.

`from fastgrpo import GRPOConfig, GRPOTrainer` is the whole API a TRL script
needs (TRL's names and semantics; see README "Differences from TRL"). The
trainer (and torch) is imported on first use, so `fastgrpo --help` and
building a GRPOConfig stay fast.
"""

from .config import GRPOConfig

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("GRPOTrainer", "TrainOutput"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'fastgrpo' has no attribute {name!r}")
