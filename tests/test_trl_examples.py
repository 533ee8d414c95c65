"""TRL 1.16's own GRPO examples (docs/source/grpo_trainer.md, rewards.md, examples/scripts) with only the import changed,
on a tiny local model and local rows of the example dataset's columns. The examples other tests already run (custom,
async and None rewards: test_rewards.py; tools: test_agents.py; trl/scripts/grpo.py: test_scripts.py) are not repeated."""

import pytest
import trl.import_utils as trl_import_utils
from datasets import Dataset
from trl.rewards import (accuracy_reward, get_cosine_scaled_reward, get_repetition_penalty_reward, get_soft_overlong_punishment,
                         think_format_reward)

from fastgrpo import GRPOConfig, GRPOTrainer


def deepmath(n=8, chat=True):
    """Rows shaped as trl-lib/DeepMath-103K's (the docs' quick-start dataset): a chat prompt and a LaTeX "solution"."""
    ask = lambda i: f"What is {i} + {i}? Put the answer in \\boxed{{}}."  # noqa: E731
    return Dataset.from_list([{"prompt": [{"role": "user", "content": ask(i)}] if chat else ask(i), "solution": f"${2 * i}$"} for i in range(n)])


def test_trls_quick_start_without_math_verify_is_refused_when_built_and_builds_with_it(tmp_path, monkeypatch, tokenizer, make_model):
    # TRL's first example, `GRPOTrainer(model=…, reward_funcs=accuracy_reward, train_dataset=DeepMath)`, without math_verify
    # installed: fastgrpo's Python API (as TRL's) loaded the model, sampled a rollout, then raised TRL's ImportError at the
    # first scoring; `fastgrpo train --reward_funcs accuracy_reward` refused it at once. The callable
    # get_cosine_scaled_reward returns calls accuracy_reward too; think_format_reward over text prompts failed at the first
    # scoring with "string indices must be integers". Each is refused when the trainer is built, before the model loads.
    monkeypatch.setattr(trl_import_utils, "is_math_verify_available", lambda: False)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1)
    for reward, name in ((accuracy_reward, "accuracy_reward"), (get_cosine_scaled_reward(max_len=64), "cosine_scaled_reward")):
        with pytest.raises(ValueError, match=f"TRL's {name} .* checks answers with math_verify, which is not installed"):
            GRPOTrainer(model="./no-such-model", reward_funcs=reward, args=args, train_dataset=deepmath())
    with pytest.raises(ValueError, match=r"TRL's think_format_reward reads chat completions .* but train_dataset has text prompts \('What is 0"):
        GRPOTrainer(model="./no-such-model", reward_funcs=think_format_reward, args=args, train_dataset=deepmath(chat=False))
    with pytest.raises(ValueError, match=r"but eval dataset has text prompts"):
        GRPOTrainer(model="./no-such-model", reward_funcs=think_format_reward, args=args, train_dataset=deepmath(),
                    eval_dataset=deepmath(chat=False))
    monkeypatch.setattr(trl_import_utils, "is_math_verify_available", lambda: True)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=[accuracy_reward, think_format_reward], args=args, train_dataset=deepmath(),
                          processing_class=tokenizer)
    assert trainer.reward_names == ["accuracy_reward", "think_format_reward"]


@pytest.mark.parametrize("reward,name,chat,expected", [
    (think_format_reward, "think_format_reward", True, 0.0),  # a random model writes no <think>…</think>
    (get_soft_overlong_punishment(max_completion_len=8, soft_punish_cache=4), "soft_overlong_punishment_reward", False, -1.0),  # 8 > 8 − 4: (4 − 8) / 4
    (get_repetition_penalty_reward(ngram_size=1, max_penalty=-1.0), "repetition_penalty_reward", False, None),
], ids=["think_format_reward", "get_soft_overlong_punishment", "get_repetition_penalty_reward"])
def test_trls_reward_helpers_train_under_trls_names(tmp_path, tokenizer, make_model, reward, name, chat, expected):
    # rewards.md's helpers as the trainer calls them (keywords only): two are callable objects TRL names by a class-level
    # __name__, logged by TRL under rewards/<that name>/mean. max_completion_length=8 and a random model: every completion
    # runs to 8 tokens (min_length 8), so the soft overlong punishment is −1 for each.
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      logging_steps=1, bf16=False)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=args, train_dataset=deepmath(4, chat), processing_class=tokenizer)
    trainer.train()
    record = trainer.state.log_history[0]
    assert trainer.reward_names == [name] and record["completions/min_length"] == 8
    mean = record[f"rewards/{name}/mean"]
    if expected is None:  # 1-grams: 1 − distinct/8 tokens of each completion, times −1: in [−7/8, 0]
        assert -7 / 8 <= mean <= 0
    else:
        assert mean == expected
