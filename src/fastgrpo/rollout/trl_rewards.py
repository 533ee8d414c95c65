"""TRL's shipped reward functions (`trl.rewards`): what each needs from the run, checked when the trainer is built.

TRL's accuracy rewards (`accuracy_reward`, `reasoning_accuracy_reward`, and the callable `get_cosine_scaled_reward`
returns) check answers with math_verify, and they and `think_format_reward` read chat completions
(`completion[0]["content"]`). Without math_verify, or over a dataset of text prompts (whose completions are text),
each failed at the first scoring, after the model loaded and sampled: an ImportError, or "string indices must be
integers" (TRL 1.16's trainer fails there too). TRL's docs' first example (`reward_funcs=accuracy_reward`) is one.

A function is known as TRL's by the module that defines it (an instance's module is its class's, so the callables
TRL's factories return are known too); no TRL import is needed to tell, and none is made unless one is present.

Not here: calling the rewards (rewards.py), the reward names TRL's grpo script takes (config/trl_script.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

MATH_MODULES = ("trl.rewards.accuracy_rewards",)  # every reward defined there calls math_verify's parse and verify
CHAT_MODULES = ("trl.rewards.accuracy_rewards", "trl.rewards.format_rewards")  # their rewards read completion[0]["content"]


def trl_module(fn) -> str | None:
    """The `trl.rewards` module that defines `fn` (a function, a `functools.partial` of one, or a callable object whose
    class is defined there), or None for any other callable."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    module = getattr(fn, "__module__", None)
    return module if isinstance(module, str) and module.startswith("trl.rewards.") else None


def check_trl_rewards(funcs: Sequence, names: Sequence[str], datasets: Sequence[tuple[str, object]]) -> None:
    """Refuse TRL's math rewards without math_verify installed, and its chat rewards over text prompts.

    Args:
        funcs, names: the R reward callables and their log names.
        datasets: (description, rows) pairs: the train and eval sets, each read from its first row (a stream's too).
    Raises:
        ValueError: naming the reward, the missing package or the dataset and its first prompt, and the fix.
    """
    for fn, name in zip(funcs, names):
        module = trl_module(fn)
        if module in MATH_MODULES:
            from trl.import_utils import is_math_verify_available  # noqa: PLC0415 (TRL is installed: its reward is here)

            if not is_math_verify_available():
                raise ValueError(f"TRL's {name} ({module}) checks answers with math_verify, which is not installed: the run would "
                                 "fail at its first scoring, after the model loaded and sampled; pip install math-verify, or give another reward.")
        if module in CHAT_MODULES:
            for where, rows in datasets:
                first = next(iter(rows), None)
                prompt = first.get("prompt") if isinstance(first, dict) else None
                if isinstance(prompt, str):
                    raise ValueError(f"TRL's {name} reads chat completions (completion[0]['content']), but {where} has text prompts "
                                     f"({prompt[:40]!r}), whose completions are text; give prompts as chat messages "
                                     "([{\"role\": \"user\", \"content\": …}]), or a reward that reads text.")
