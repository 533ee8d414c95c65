"""Prompt rendering and tokenisation, dataset loading and the prompt order."""

import json
import re

import pytest
import torch
from datasets import Dataset

from fastgrpo.rollout.prompts import PromptEncoder
from fastgrpo.run.datasets import PromptOrder, check_dataset, load_dataset_spec


def test_chat_prompt_has_one_bos_and_the_generation_prompt(tokenizer):
    ids, mask, truncated = PromptEncoder(tokenizer, None)([[{"role": "user", "content": "hi"}]])
    text = tokenizer.decode(ids[0])
    assert text.endswith("<|im_start|>assistant\n")
    assert ids[0].tolist().count(tokenizer.bos_token_id) == text.count("<|im_start|>")  # no extra BOS added
    assert truncated == 0 and mask.all()


def test_long_prompts_lose_their_left_part_and_are_counted(tokenizer):
    encode = PromptEncoder(tokenizer, max_prompt_length=4)
    long_text = "one two three four five six seven eight"
    ids, mask, truncated = encode([long_text, "hi"])
    assert truncated == 1
    full = tokenizer(long_text, add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == full[-4:]  # the end of the prompt is kept
    assert mask[1].tolist() == [0, 0, 0, 1] and ids[1, 0].item() == tokenizer.pad_token_id  # left padding


def test_reasoning_gym_spec_with_difficulty(tmp_path):
    ds = load_dataset_spec("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1", size=6, seed=1)
    assert len(ds) == 6 and set(ds.column_names) == {"prompt", "answer", "task", "entry"}
    assert ds[0]["prompt"][-1]["role"] == "user"
    assert json.loads(ds[0]["entry"])["answer"] == ds[0]["answer"]
    shots = load_dataset_spec("reasoning-gym:basic_arithmetic?max_terms=2&few_shot=2", size=2, seed=1)[0]["prompt"]
    assert [m["role"] for m in shots] == ["system", "user", "assistant", "user", "assistant", "user"]
    # the built-in job's spec: "+" escaped as %2B, true/false read as booleans ("false" as text would be truthy)
    sums = load_dataset_spec("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1&operators=%2B"
                             "&allow_parentheses=false&allow_negation=false", size=20, seed=1)
    assert all(re.fullmatch(r"Calculate \d+ \+ \d+\.", r["prompt"][-1]["content"]) for r in sums)
    with pytest.raises(ValueError, match="reasoning-gym has no task 'nope'"):
        load_dataset_spec("reasoning-gym:nope", size=2)


def test_local_files_and_missing_prompt_column(tmp_path):
    good = tmp_path / "d.jsonl"
    good.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 2}\n')
    assert load_dataset_spec(str(good))["prompt"] == ["a", "b"]
    bad = tmp_path / "e.jsonl"
    bad.write_text('{"question": "a"}\n')
    with pytest.raises(ValueError, match="no 'prompt' column"):
        load_dataset_spec(str(bad))
    text = tmp_path / "d.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match="use a .json, .jsonl, .csv or .parquet"):
        load_dataset_spec(str(text))
    with pytest.raises(ValueError, match="is empty"):
        check_dataset(Dataset.from_dict({"prompt": []}), "train_dataset")


def test_prompt_order_is_a_seeded_permutation_per_epoch_and_resumable():
    order = PromptOrder(5, seed=3)
    first = order.take(3) + order.take(3)  # wraps into epoch 1 after 5
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]
    state = order.state_dict()
    again = PromptOrder(5, seed=3)
    again.load_state_dict(state)
    assert again.take(4) == order.take(4)
    assert PromptOrder(4, seed=0, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]


def test_a_pass_is_whole_batches_as_trls_sampler_drops_an_incomplete_one():
    # 5 prompts in batches of 2: each pass draws 2 batches and leaves its permutation's last prompt out (TRL's
    # RepeatSampler drops the incomplete batch), so a batch never spans two passes; smaller than a batch: cycled.
    order = PromptOrder(5, seed=0, shuffle=False, batch=2)
    assert [order.take(2) for _ in range(3)] == [[0, 1], [2, 3], [0, 1]] and order.state_dict() == {"epoch": 1, "position": 2}
    shuffled = PromptOrder(5, seed=0, batch=2)
    passes = [shuffled.take(2) + shuffled.take(2) for _ in range(3)]
    generator = torch.Generator().manual_seed(0)  # TRL's RepeatSampler: one generator, a new permutation each pass
    permutations = [torch.randperm(5, generator=generator).tolist() for _ in range(3)]
    assert passes == [p[:4] for p in permutations] and shuffled.per_pass == 4
    assert PromptOrder(3, seed=0, shuffle=False, batch=4).take(4) == [0, 1, 2, 0]


def test_three_passes_draw_trls_repeat_sampler_order_and_a_resume_draws_it_again():
    # TRL builds its RepeatSampler once, with one seeded generator, and each pass (DataLoader iteration) draws a new
    # permutation from it: pass 2 is the generator's second randperm, not a permutation seeded anew (seed 42, 10 rows:
    # pass 2 starts 3, 5, 8, 9 — fastgrpo's seed + epoch gave 8, 4, 9, 0).
    pytest.importorskip("trl")
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(list(range(10)), mini_repeat_count=1, batch_size=3, seed=42)
    trl_passes = [list(sampler) for _ in range(3)]  # 3 whole batches of 3 a pass; the permutation's last row left out
    order = PromptOrder(10, seed=42, batch=3)
    ours = [order.take(3) + order.take(3) + order.take(3) for _ in range(3)]
    assert ours == trl_passes and trl_passes[1][:4] == [3, 5, 8, 9]
    resumed = PromptOrder(10, seed=42, batch=3)
    resumed.load_state_dict({"epoch": 2, "position": 3})  # a checkpoint in the third pass, after its first batch
    assert resumed.take(6) == trl_passes[2][3:]
    resumed.load_state_dict({"epoch": 1, "position": 0})  # back to an earlier pass: drawn again from the seed
    assert resumed.take(9) == trl_passes[1]
