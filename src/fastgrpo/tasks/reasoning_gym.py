"""The reasoning-gym task: procedural questions with their own scorers, generated locally (no network).

`reasoning_gym_dataset` builds the rows (`fastgrpo train --dataset reasoning-gym:<task>`);
tasks/rewards.py's `reasoning_gym_reward` scores them with the task's own scorer.

Not here: loading other datasets (run/datasets.py).
"""

from __future__ import annotations

import json

from datasets import Dataset

REASONING_GYM_SYSTEM = "Reply with only the final answer, nothing else."


def reasoning_gym_dataset(
    tasks: list[str],
    size: int = 1000,
    seed: int = 0,
    system_prompt: str = REASONING_GYM_SYSTEM,
    task_kwargs: dict | None = None,
    few_shot: int = 0,
) -> Dataset:
    """Rows from reasoning-gym tasks, as chat prompts with scoring data.

    Args:
        tasks: reasoning-gym dataset names, e.g. ["basic_arithmetic"]; several
            are interleaved in equal parts.
        size: rows in all.
        seed: reasoning-gym's generation seed.
        system_prompt: the system message (asks for the bare answer, which
            reasoning-gym's scorers compare with the oracle answer).
        task_kwargs: difficulty settings passed to every task's generator,
            e.g. {"max_terms": 2, "max_digits": 1} for basic_arithmetic.
        few_shot: solved examples of the same task (drawn with another seed)
            put before each question as user/assistant turns, so a small model
            sees the answer format; 0 for none.
    Returns:
        A Dataset with columns prompt (messages), answer (str), task (str) and
        entry (the reasoning-gym entry as JSON, for the `reasoning_gym` reward).
    Raises:
        ValueError: an unknown task name (the message lists a few known ones).
    """
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if not tasks:
        raise ValueError("reasoning-gym: no task named; give one or more, e.g. reasoning-gym:basic_arithmetic.")
    unknown = [t for t in tasks if t not in DATASETS]
    if unknown:
        raise ValueError(f"reasoning-gym has no task {unknown[0]!r}; known tasks include {', '.join(sorted(DATASETS)[:12])}, …")
    if size < 1:
        raise ValueError(f"reasoning-gym: size={size}; give the number of rows to generate, 1 or more (--dataset_size).")
    reserved = {"size", "seed"} & set(task_kwargs or {})
    if reserved:
        raise ValueError(f"reasoning-gym: {sorted(reserved)[0]} is set by fastgrpo (--dataset_size, --seed); remove it from the settings after '?'.")
    per_task = max(size // len(tasks), 1)
    rows = []
    for task in tasks:
        try:
            items = reasoning_gym.create_dataset(task, size=per_task, seed=seed, **(task_kwargs or {}))
        except TypeError as err:
            raise ValueError(f"reasoning-gym task {task!r} does not take {task_kwargs}: {err}") from err
        except (AssertionError, ValueError) as err:  # reasoning-gym validates its settings with asserts
            raise ValueError(f"reasoning-gym task {task!r} refuses the settings {task_kwargs}: {err or type(err).__name__}; change them after '?'.") from err
        shots = []
        if few_shot:
            for example in reasoning_gym.create_dataset(task, size=few_shot, seed=seed + 10_000, **(task_kwargs or {})):
                shots += [{"role": "user", "content": example["question"]}, {"role": "assistant", "content": str(example["answer"])}]
        for item in items:
            rows.append(
                {
                    "prompt": [{"role": "system", "content": system_prompt}, *shots, {"role": "user", "content": item["question"]}],
                    "answer": str(item["answer"]),
                    "task": task,
                    "entry": json.dumps(item, default=str),
                }
            )
    interleaved = [rows[t * per_task + i] for i in range(per_task) for t in range(len(tasks))]
    return Dataset.from_list(interleaved)
