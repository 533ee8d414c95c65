"""The public `fastgrpo.rewards` names (README, examples, `--reward module:function`): the built-in rewards
(tasks/rewards.py) and resolving a reward from a name (rollout/rewards.py, where the reward protocol is)."""

from .rollout.rewards import RESERVED_COLUMNS, RewardFunctionError, resolve_reward
from .tasks.rewards import BUILTIN_REWARDS, brevity_reward, exact_reward, format_reward, reasoning_gym_reward, reward_len

__all__ = [
    "BUILTIN_REWARDS", "RESERVED_COLUMNS", "RewardFunctionError", "brevity_reward", "exact_reward", "format_reward",
    "reasoning_gym_reward", "resolve_reward", "reward_len",
]
