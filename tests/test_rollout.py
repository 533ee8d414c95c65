"""Completion masks, micro-batch views, take/concat and collect() on hand-made tensors."""

from types import SimpleNamespace
import dataclasses
from contextlib import nullcontext

import pytest
import torch

from fastgrpo.rollout.record import Rollout, completion_mask, concat, micro_batch_rows
from fastgrpo.rollout.collect import SingleTurn, collect
from fastgrpo.generation.contract import Samples

EOS, PAD = 2, 2  # pad == EOS, as in SmolLM2 and many chat models


def test_mask_covers_tokens_up_to_and_including_the_first_eos():
    ids = torch.tensor([
        [5, 6, EOS, PAD, PAD],  # EOS at 2; pads after it (same id) are masked
        [5, EOS, 7, EOS, 9],  # tokens after the first EOS are masked even if not pad
        [5, 6, 7, 8, 9],  # no EOS: truncated, all ones
        [EOS, PAD, PAD, PAD, PAD],  # empty answer: just the EOS
    ])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert torch.equal(completion_mask(ids, [EOS]), expected)


def test_mask_with_several_eos_ids():
    ids = torch.tensor([[5, 11, 6, EOS], [5, 6, EOS, 11]])  # 11 ends a turn too
    assert torch.equal(completion_mask(ids, [EOS, 11]), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]))


def make_rollout():
    # 4 completions: left-padded prompts, right-padded completions.
    prompt_ids = torch.tensor([[0, 0, 3, 4], [0, 0, 3, 4], [0, 5, 6, 7], [0, 5, 6, 7]])
    prompt_mask = (prompt_ids != 0).long()
    completion_ids = torch.tensor([[8, EOS, PAD, PAD], [8, 8, EOS, PAD], [9, 9, 9, 9], [9, EOS, PAD, PAD]])
    mask = completion_mask(completion_ids, [EOS])
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=mask,
        is_truncated=torch.tensor([False, False, True, False]), rewards=torch.zeros(4, 1),
        advantages=torch.tensor([1.0, -1.0, 1.0, -1.0]), prompts=["a", "a", "b", "b"], completions=["", "", "", ""],
        old_logps=torch.arange(16.0).view(4, 4),
    )


def test_micro_batches_trim_padding_and_keep_rows_aligned():
    first, second = make_rollout().micro_batches(2)
    # rows 0–1: prompt columns 0–1 are all padding; completions end by column 2 (EOS of row 1).
    assert first.prompt_ids.tolist() == [[3, 4], [3, 4]]
    assert first.completion_ids.tolist() == [[8, EOS, PAD], [8, 8, EOS]]
    assert first.old_logps.tolist() == [[0.0, 1.0, 2.0], [4.0, 5.0, 6.0]]
    # rows 2–3: one prompt padding column stays trimmed off; the truncated row keeps all 4 tokens.
    assert second.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7]]
    assert second.completion_ids.shape == (2, 4)
    assert second.advantages.tolist() == [1.0, -1.0] and second.prompts == ["b", "b"]


def test_collect_repeats_prompts_in_contiguous_groups_and_scores_text_up_to_eos():
    rows = [{"prompt": "p0", "answer": "x"}, {"prompt": "p0", "answer": "y"}]  # identical prompts: two groups
    seen = {}

    def encode(prompts):
        return torch.tensor([[3, 4]] * len(prompts)), torch.ones(len(prompts), 2, dtype=torch.long), 0

    def generate(ids, mask, G):
        return Samples(torch.tensor([[8, EOS, PAD], [8, 8, EOS], [9, EOS, 9], [9, 9, 9]]), None)

    def decode(ids, mask, prompts):
        return [" ".join(str(t) for t in row[m.bool()].tolist()) for row, m in zip(ids, mask)]

    def score(prompts, completions, completion_ids, columns):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=columns["answer"])
        return torch.tensor([[1.0], [0.0], [2.0], [2.0]])

    rollout = collect(rows, num_generations=2, produce=SingleTurn(encode, SimpleNamespace(sample=generate), decode, [EOS]), score=score,
                      timer=lambda phase: nullcontext())
    assert seen["prompts"] == ["p0", "p0", "p0", "p0"] and seen["answer"] == ["x", "x", "y", "y"]
    assert seen["completion_ids"] == [[8, EOS], [8, 8, EOS], [9, EOS], [9, 9, 9]]
    assert rollout.is_truncated.tolist() == [False, False, False, True]
    assert rollout.rewards[:, 0].tolist() == [1.0, 0.0, 2.0, 2.0] and rollout.advantages is None  # Â: on the assembled rollout


def test_micro_batch_rows_split_evenly_and_match_full_micro_batches():
    assert micro_batch_rows(8, 2) == [slice(0, 4), slice(4, 8)]  # a full rollout: per_device_train_batch_size each
    assert micro_batch_rows(6, 4) == [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 6)]  # 1, 2, 1, 2 rows
    with pytest.raises(ValueError, match="3 completions do not fill 4 micro-batches"):
        micro_batch_rows(3, 4)


def test_take_and_concat_keep_whole_rows_and_pad_on_the_right_sides():
    r = make_rollout()
    group_b = r.take(torch.tensor([2, 3]))
    assert group_b.prompts == ["b", "b"] and group_b.old_logps[0].tolist() == [8.0, 9.0, 10.0, 11.0]
    short = dataclasses.replace(r.select(slice(0, 2)), old_logps=None)  # prompt width 2, completion width 3, no π_old yet
    both = concat([group_b, short])
    assert both.prompts == ["b", "b", "a", "a"] and both.num_truncated_prompts == 0
    assert both.prompt_ids[2].tolist() == [0, 0, 3, 4] and both.prompt_mask[2].tolist() == [0, 0, 1, 1]  # left-padded
    assert both.completion_ids[2].tolist() == [8, EOS, PAD, 0] and both.completion_mask[2].tolist() == [1, 1, 0, 0]
    assert both.old_logps[0].tolist() == [8.0, 9.0, 10.0, 11.0]  # kept
    assert torch.isnan(both.old_logps[2, :3]).all() and both.old_logps[2, 3] == 0  # to compute; padding 0
    with pytest.raises(ValueError, match="without ref_logps"):
        concat([dataclasses.replace(r, ref_logps=r.old_logps)])
