"""fastgrpo: GRPO fine-tuning of language models with multi-step rollout reuse.

`from fastgrpo import GRPOConfig, GRPOTrainer` is the whole API a TRL script
needs (TRL's names and semantics; see README "Differences from TRL").
"""

from .config import GRPOConfig
from .trainer import GRPOTrainer, TrainOutput

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput"]
__version__ = "0.1.0"
