"""The built-in agent task: multiply a 3-digit by a 2-digit number with a calculator tool.

SmolLM2-135M-Instruct gets such products right about never in its head; with
the `multiply` tool it only has to call it with the question's numbers and
copy the result. Untrained, with the prompt's three worked examples (user
question → tool call → tool reply → answer), about half its first turns
already parse as tool calls and about a third are exactly right, so GRPO has
a signal from the first rollout:

    fastgrpo train --model smollm2-135m-instruct --dataset calculator --environment calculator \
        --reward fastgrpo.tasks.calculator:answer_correct

Rewards: `answer_correct` (the final reply is the product) and the
environment's own `get_reward` (logged as rewards/Calculator: 1 when the tool
was called with the question's two numbers).

Not here: the loop (multiturn.py), the tool template (chat_format.py).
"""

from __future__ import annotations

import random

from datasets import Dataset

EXAMPLES = [(12, 34), (56, 78), (23, 91)]  # worked examples in every prompt: the format to copy


def _call(a: int, b: int) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]}


def calculator_prompt(a: int, b: int) -> list[dict]:
    """The chat for "What is a times b?": three worked examples with the tool, then the question."""
    shots = []
    for x, y in EXAMPLES:
        shots += [{"role": "user", "content": f"What is {x} times {y}?"}, _call(x, y),
                  {"role": "tool", "name": "multiply", "content": str(x * y)}, {"role": "assistant", "content": str(x * y)}]
    return shots + [{"role": "user", "content": f"What is {a} times {b}?"}]


def calculator_dataset(size: int = 1000, seed: int = 0) -> Dataset:
    """`size` rows of a 3-digit × 2-digit product: prompt (chat), a, b, answer (int), seeded."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        rows.append({"prompt": calculator_prompt(a, b), "a": a, "b": b, "answer": a * b})
    return Dataset.from_list(rows)


class Calculator:
    """One episode's calculator: the `multiply` tool, and a reward for calling it with the question's numbers."""

    def reset(self, a: int, b: int, **row) -> None:
        self.question, self.used = {a, b}, False

    def multiply(self, a: int, b: int) -> int:
        """
        Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product a × b.
        """
        self.used = self.used or {a, b} == self.question
        return a * b

    def get_reward(self) -> float:
        return float(self.used)


def answer_correct(completions, answer, **kwargs) -> list[float]:
    """1.0 when the final assistant reply is exactly the product (digits only, commas and spaces ignored), else 0.0."""
    out = []
    for messages, value in zip(completions, answer):
        reply = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
        out.append(float(reply.replace(",", "").strip().rstrip(".") == str(value)))
    return out
