"""The public `fastgrpo.data` names (README, examples): datasets from a spec, the built-in reasoning-gym task,
and the prompt encoder. They live in run/datasets.py, tasks/reasoning_gym.py and rollout/prompts.py."""

from .rollout.prompts import PromptEncoder, is_conversational
from .run.datasets import check_dataset, load_data_file, load_dataset_spec
from .tasks.reasoning_gym import reasoning_gym_dataset

__all__ = ["PromptEncoder", "check_dataset", "is_conversational", "load_data_file", "load_dataset_spec", "reasoning_gym_dataset"]
