"""Datasets as TRL takes them: IterableDataset for training, dicts of eval datasets, evaluate(eval_dataset=…)."""

import pandas as pd
import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.run.dataset_kinds import StreamOrder


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=4, max_steps=3, learning_rate=1e-3, logging_steps=1, save_strategy="no", disable_tqdm=True,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def stream(n):
    return IterableDataset.from_generator(lambda: ({"prompt": f"Count to {i}.", "n": i} for i in range(n)))


def test_stream_order_reads_in_order_wraps_and_resumes():
    order = StreamOrder(stream(3))
    assert [r["n"] for r in order.take(2)] == [0, 1]
    assert [r["n"] for r in order.take(2)] == [2, 0]  # the stream ends: epoch 1 starts over
    state = order.state_dict()
    assert state == {"epoch": 1, "position": 1}
    resumed = StreamOrder(stream(3))
    resumed.load_state_dict(state)
    assert [r["n"] for r in resumed.take(2)] == [1, 2]


def test_iterable_dataset_trains(tmp_path, tokenizer, make_model):
    seen = []

    def spy(completions, n, **kwargs):
        seen.extend(n)
        return [0.5] * len(completions)

    # 1 prompt per rollout (4 completions, G = 4), 1 step per rollout: 3 steps read prompts 0, 1, 0.
    trainer = GRPOTrainer(make_model(), spy, args=config(tmp_path), train_dataset=stream(2), processing_class=tokenizer)
    trainer.train()
    assert seen == [0] * 4 + [1] * 4 + [0] * 4 and trainer.state.global_step == 3


def test_iterable_dataset_needs_max_steps(tmp_path, prompts):
    with pytest.raises(ValueError, match="IterableDataset, which has no length; set max_steps"):
        GRPOTrainer("/no/model", reward_even_tokens, args=config(tmp_path, max_steps=-1), train_dataset=stream(2))


@pytest.mark.parametrize(
    "train,match",
    [
        (DatasetDict({"train": Dataset.from_list([{"prompt": "a"}])}), r"DatasetDict of splits \['train'\]; pass one split"),
        (42, "train_dataset has type int"),
        ("prompts.jsonl", "train_dataset has type str"),
        # found by the session-29 sweep: a bare KeyError: '0' (a DataFrame's [0] is a column), and "a dict of splits" for columns
        (pd.DataFrame({"prompt": ["a", "b"]}), r"train_dataset has type DataFrame; .* \(a pandas DataFrame: datasets.Dataset.from_pandas\(df\)\)"),
        ({"prompt": ["a", "b"]}, r"train_dataset is a dict of columns \['prompt'\]; make it a dataset: datasets.Dataset.from_dict\(rows\)"),
    ],
)
def test_other_train_kinds_are_refused_naming_the_type(tmp_path, train, match):
    with pytest.raises(ValueError, match=match):
        GRPOTrainer("/no/model", reward_even_tokens, args=config(tmp_path), train_dataset=train)


def test_dict_of_eval_datasets_prefixes_metrics_and_evaluate_takes_a_dataset(tmp_path, tokenizer, make_model, prompts):
    evals = DatasetDict({"easy": prompts.select(range(2)), "hard": prompts.select(range(2, 3))})
    trainer = GRPOTrainer(
        make_model(), reward_even_tokens, args=config(tmp_path, max_steps=1, eval_strategy="steps", eval_steps=1),
        train_dataset=prompts, eval_dataset=evals, processing_class=tokenizer,
    )
    trainer.train()
    logged = [r for r in trainer.state.log_history if any(k.startswith("eval_") for k in r)]  # one record per set, as Trainer's evaluate
    assert ["eval_easy_reward" in r and "eval_hard_reward" not in r for r in logged] == [True, False]
    assert "eval_hard_reward" in logged[1] and "eval_hard_rewards/reward_even_tokens/mean" in logged[1]
    metrics = trainer.evaluate(eval_dataset=prompts.select(range(1)), metric_key_prefix="test")
    assert set(metrics) == {  # TRL 1.16's eval keys for the dapo loss at β = 0 (and transformers' test_model_preparation_time)
        *(f"test_{k}" for k in ("loss", "reward", "num_tokens", "reward_std", "frac_reward_zero_std", "frac_reward_none", "entropy", "runtime",
                                "samples_per_second", "steps_per_second", "rewards/reward_even_tokens/mean", "rewards/reward_even_tokens/std",
                                "model_preparation_time")),
        *(f"test_completions/{k}" for k in ("mean_length", "min_length", "max_length", "clipped_ratio", "mean_terminated_length",
                                            "min_terminated_length", "max_terminated_length")),
        *(f"test_clip_ratio/{k}" for k in ("low_mean", "low_min", "high_mean", "high_max", "region_mean")), "epoch",
    }
    assert metrics["test_clip_ratio/region_mean"] == 0.0 and metrics["test_samples_per_second"] > 0  # ρ = 1: nothing is clipped
    assert metrics["test_num_tokens"] == float(trainer.state.num_input_tokens_seen) and type(metrics["test_num_tokens"]) is float  # TRL's mean
    with pytest.raises(ValueError, match="eval dataset has type int"):
        trainer.evaluate(eval_dataset=3)


def test_iterable_eval_dataset_is_read_through(tmp_path, tokenizer, make_model, prompts):
    # TRL evaluates an IterableDataset by reading it through: the same metrics as the same rows in a Dataset;
    # num_generations_eval (TRL's) sets the completions per eval prompt.
    seen = []

    def count_eval(completion_ids, trainer_state, **kw):
        seen.append(len(completion_ids))
        return reward_even_tokens(completion_ids)

    args = config(tmp_path, max_steps=1, num_generations_eval=2, per_device_eval_batch_size=2)
    trainer = GRPOTrainer(make_model(), count_eval, args=args, train_dataset=prompts, eval_dataset=stream(3), processing_class=tokenizer)
    seen.clear()
    torch.manual_seed(0)
    streamed = trainer.evaluate()
    assert seen == [2, 2, 2]  # 3 prompts read through, 2 completions each, one prompt per eval batch
    torch.manual_seed(0)
    fixed = trainer.evaluate(eval_dataset=Dataset.from_list(list(stream(3))))
    speed = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")  # wall-clock: differs run to run
    assert {k: v for k, v in streamed.items() if k not in speed} == pytest.approx({k: v for k, v in fixed.items() if k not in speed})
    assert streamed["eval_samples_per_second"] == pytest.approx(3 / streamed["eval_runtime"], rel=0.05)  # 3 prompts
    for empty, match in [(stream(0), "yields no rows"), (IterableDataset.from_generator(lambda: iter([{"text": "x"}])), "without a prompt column")]:
        with pytest.raises(ValueError, match=match):
            GRPOTrainer("/no/model", count_eval, args=config(tmp_path), train_dataset=prompts, eval_dataset=empty)
