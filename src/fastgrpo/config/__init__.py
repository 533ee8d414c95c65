"""config/: `GRPOConfig` (TRL's fields and fastgrpo's own), its checks, the TRL field tables and the CLI flags.

Imports nothing else from fastgrpo and no torch (`fastgrpo --help` and building a config stay fast).
"""

from .grpo_config import GRPOConfig

__all__ = ["GRPOConfig"]
