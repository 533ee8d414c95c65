"""Completion masks, micro-batch views and collect() on hand-made tensors."""

from contextlib import nullcontext

import torch

from fastgrpo.rollout import Rollout, SingleTurn, collect, completion_mask

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
        return torch.tensor([[8, EOS, PAD], [8, 8, EOS], [9, EOS, 9], [9, 9, 9]])

    def decode(ids, mask, prompts):
        return [" ".join(str(t) for t in row[m.bool()].tolist()) for row, m in zip(ids, mask)]

    def score(prompts, completions, completion_ids, answer):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=answer)
        return torch.tensor([[1.0], [0.0], [2.0], [2.0]])

    rollout = collect(rows, num_generations=2, produce=SingleTurn(encode, generate, decode, [EOS]), score=score,
                      advantages=lambda r: r[:, 0] - r[:, 0].view(-1, 2).mean(1).repeat_interleave(2),
                      timer=lambda phase: nullcontext())
    assert seen["prompts"] == ["p0", "p0", "p0", "p0"] and seen["answer"] == ["x", "x", "y", "y"]
    assert seen["completion_ids"] == [[8, EOS], [8, 8, EOS], [9, EOS], [9, 9, 9]]
    assert rollout.is_truncated.tolist() == [False, False, False, True]
    assert rollout.advantages.tolist() == [0.5, -0.5, 0.0, 0.0]  # the two "p0" groups are separate
