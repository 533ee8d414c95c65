"""The built-in rewards (`fastgrpo train --reward NAME`): `length` (the TRL quick-start reward), `format` (answer
inside <answer>…</answer>), `brevity` (short replies), `reasoning_gym` (reasoning-gym's own scorer for the row's
task) and `exact` (the answer column, exactly); each follows the reward protocol of rollout/rewards.py.

Not here: calling reward functions and checking what they return (rollout/rewards.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

def completion_text(completion) -> str:
    """The text of a completion, whether a string or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"]


def reward_len(completions, **kwargs) -> list[float]:
    """−|100 − characters|: the TRL quick-start reward; peaks at 100-character completions."""
    return [-abs(100 - len(completion_text(c))) for c in completions]


def brevity_reward(completions, **kwargs) -> list[float]:
    """max(0, 1 − characters/100) of the stripped reply; 0 from 100 characters on, and 0 for an empty reply.

    Rewards following an instruction such as "reply with only the final
    answer"; pair it with a correctness reward so that terse and right beats
    terse and wrong. An empty reply answers nothing, so it scores 0, not the
    maximum: with 1.0 for it, GRPO at μ = 1 drove SmolLM2 to empty replies
    after ≈ 20–30 rollouts on the built-in job (docs/benchmarks.md, time to reward).
    """
    lengths = [len(completion_text(c).strip()) for c in completions]
    return [max(0.0, 1.0 - n / 100) if n else 0.0 for n in lengths]


ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The text inside the last <answer>…</answer> pair, stripped; None if there is none."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion gives its answer as <answer>…</answer> and stops there, 0.5 when it
    contains such a pair followed by more text, 0.0 otherwise.

    The half credit gives a tiny model a gradient towards the tags before it
    learns to stop after them.
    """
    scores = []
    for c in completions:
        text = completion_text(c).strip()
        if extract_answer(text) is None:
            scores.append(0.0)
        else:
            scores.append(1.0 if text.endswith("</answer>") else 0.5)
    return scores


def reasoning_gym_reward(completions, entry=None, **kwargs) -> list[float]:
    """reasoning-gym's own score (0…1) of the row's task for the completion's answer.

    The answer is the text inside <answer>…</answer> when present, else the
    whole completion, stripped. reasoning-gym's default scorer gives 1.0 for
    the exact answer and len(answer)/len(text) when the answer appears inside
    longer text, so terse correct replies score highest. Needs the `entry`
    column written by `data.reasoning_gym_dataset` (the entry as JSON).

    Raises:
        ValueError: no `entry` column.
    """
    import reasoning_gym

    if entry is None:
        raise ValueError(
            "reward 'reasoning_gym' needs the dataset column 'entry' (a reasoning-gym entry as JSON); "
            "load the data with --dataset reasoning-gym:<task> or data.reasoning_gym_dataset()."
        )
    scores = []
    for c, raw in zip(completions, entry):
        item = json.loads(raw)
        text = completion_text(c)
        answer = extract_answer(text)
        scorer = reasoning_gym.get_score_answer_fn(item["metadata"]["source_dataset"])
        scores.append(float(scorer(text.strip() if answer is None else answer, item)))
    return scores


def exact_reward(completions, entry=None, **kwargs) -> list[float]:
    """1.0 for the exact answer (reasoning-gym's full score), else 0.0: correctness alone, no partial credit.

    Same answer and `entry` column as `reasoning_gym_reward`. A 0/1 reward:
    a group whose completions are all right or all wrong has no spread, the
    case dynamic sampling (`filter_groups`) is for.

    Raises:
        ValueError: no `entry` column.
    """
    return [float(score == 1.0) for score in reasoning_gym_reward(completions, entry=entry)]


BUILTIN_REWARDS: dict[str, Callable[..., list]] = {
    "length": reward_len,
    "format": format_reward,
    "brevity": brevity_reward,
    "reasoning_gym": reasoning_gym_reward,
    "exact": exact_reward,
}
