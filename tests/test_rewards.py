"""Reward calling: the TRL protocol, None handling, and clear errors naming the function."""

import json
import math

import pytest
import torch

from fastgrpo.advantages import weighted_rewards
from fastgrpo.rewards import brevity_reward, format_reward, reasoning_gym_reward, resolve_reward, reward_len, score


def call(*funcs, n=3):
    return score(list(funcs), prompts=["p"] * n, completions=["a" * 90, "b" * 100, "c" * 110][:n], completion_ids=[[1]] * n)


def test_values_none_and_weighted_sum():
    def only_first(completions, **kw):
        return [1.0, None, None]

    table = call(reward_len, only_first)
    assert table[:, 0].tolist() == [-10.0, 0.0, -10.0]
    assert math.isnan(table[1, 1])
    assert weighted_rewards(table, torch.tensor([1.0, 2.0])).tolist() == [-8.0, 0.0, -10.0]  # None skipped


def test_wrong_count_names_the_function():
    def two_values(completions, **kw):
        return [1.0, 2.0]

    with pytest.raises(ValueError, match="'two_values' returned 2 values for 3 completions"):
        call(two_values)


def test_non_number_names_the_function_and_value():
    def stringy(completions, **kw):
        return [1.0, "0.5", 1.0]

    with pytest.raises(TypeError, match=r"'stringy' returned '0.5' \(str\) for completion 1"):
        call(stringy)


def test_no_applicable_reward_is_an_error():
    def never(completions, **kw):
        return [None] * len(completions)

    with pytest.raises(ValueError, match="completion 0 got None from every reward function \\(never\\)"):
        call(never)


def test_builtin_rewards():
    assert reward_len(["x" * 100, [{"role": "assistant", "content": "x" * 97}]]) == [0, -3]
    assert format_reward(["<answer>4</answer>", "so <answer>4</answer> ok", "4"]) == [1.0, 0.5, 0.0]
    assert brevity_reward(["", " 42 ", "x" * 150]) == [1.0, 0.98, 0.0]  # 1 − characters/100, stripped, floored
    entry = json.dumps({"question": "Calculate 2 + 2.", "answer": "4", "metadata": {"source_dataset": "basic_arithmetic"}})
    # exact answer 1.0; tags win; "the answer is 4" holds "4" in 15 characters: 1/15 (reasoning-gym's partial credit)
    got = reasoning_gym_reward(["4", "<answer>4</answer>", "the answer is 4", "5"], entry=[entry] * 4)
    assert got == pytest.approx([1.0, 1.0, 1 / 15, 0.0])
    with pytest.raises(ValueError, match="needs the dataset column 'entry'"):
        reasoning_gym_reward(["4"])


def test_resolve_reward():
    assert resolve_reward("length") is reward_len
    assert resolve_reward("fastgrpo.rewards:format_reward") is format_reward
    with pytest.raises(ValueError, match="unknown; use one of length, format, brevity, reasoning_gym"):
        resolve_reward("lenght")
    with pytest.raises(ValueError, match="cannot import"):
        resolve_reward("fastgrpo.rewards:nope")
