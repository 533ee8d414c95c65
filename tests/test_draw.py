"""generation/draw.py: the two-level inverse-CDF draw and a decode step's token and log-prob.

Tokens by hand on small distributions (zero-probability tokens skipped, block boundaries, u next to 1,
vocabularies that 256 does not divide); the same tokens as one float64 cumulative sum over V on random
distributions; no rows, no tokens; log-probs equal float64 log-softmax, also for logits of 1e7; non-finite
logits refused, huge finite ones drawn from at T = 1 and refused with a clear error where T < 1 overflows them.
"""

import math

import pytest
import torch
from transformers import LogitsProcessorList

from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.generation.draw import draw, inverse_cdf
from fastgrpo.generation.processors import logits_processors

ONE_MINUS = 1 - 2**-53  # the largest float64 below 1: torch.rand's largest value


def tokens(probs, us):
    probs = torch.tensor(probs, dtype=torch.float32).expand(len(us), -1)
    return inverse_cdf(probs, torch.tensor(us, dtype=torch.float64)[:, None]).tolist()


def test_tokens_by_hand_skip_zero_probability():
    # cumulative: 0.1, 0.1, 0.4, 1.0 → [0, 0.1) is token 0, [0.1, 0.4) token 2 (token 1 has none), [0.4, 1) token 3
    assert tokens([0.1, 0.0, 0.3, 0.6], [0.0, 0.05, 0.1, 0.39, 0.4, 0.999, ONE_MINUS]) == [0, 0, 2, 2, 3, 3, 3]


def test_u_next_to_one_never_draws_the_zero_tail():
    assert tokens([0.5, 0.5, 0.0, 0.0], [ONE_MINUS, 0.75, 0.25]) == [1, 1, 0]
    assert tokens([1.0] + [0.0] * 511, [0.0, 0.5, ONE_MINUS]) == [0, 0, 0]  # two blocks, the second empty


def test_a_block_sum_above_its_cumulative_sum_stays_in_the_block():
    # torch's vectorised sum gathers the 200 tiny values before adding them to 1.0; the cumulative sum adds each to
    # 1.0 and loses it. u · (block sum) then lies past the block's last cumulative value: the draw keeps to the last
    # token that adds mass (token 0), not index 256 (outside the vocabulary) nor a zero-probability tail token.
    probs = [1.0] + [5e-17] * 200 + [0.0] * 55
    row = torch.tensor(probs)
    assert row.sum(dtype=torch.float64) > row.double().cumsum(-1)[-1]  # the case this test is about
    assert tokens(probs, [ONE_MINUS, 0.5]) == [0, 0]


def test_block_boundaries():
    probs = [0.0] * 512
    probs[255], probs[256] = 0.5, 0.5  # the last token of block 0 and the first of block 1
    assert tokens(probs, [0.0, 0.49, 0.5, ONE_MINUS]) == [255, 255, 256, 256]
    probs = [0.0] * 1024
    probs[3], probs[700] = 0.25, 0.75  # empty blocks between and after
    assert tokens(probs, [0.2, 0.25, 0.9]) == [3, 700, 700]


@pytest.mark.parametrize("vocab", [151936, 50257, 7])  # gcd with 256: 128 (blocks of 128), 1 and 1 (padded)
def test_vocabularies_256_does_not_divide(vocab):
    probs = [0.0] * vocab
    probs[-1] = 1.0
    assert tokens(probs, [0.0, 0.5, ONE_MINUS]) == [vocab - 1] * 3
    probs[0] = 1.0  # half each on the first and last token
    assert tokens(probs, [0.49, 0.5]) == [0, vocab - 1]


@pytest.mark.parametrize("vocab", [49152, 32000, 151936, 50257])
def test_same_tokens_as_one_float64_cumulative_sum(vocab):
    torch.manual_seed(vocab)
    probs = (torch.randn(64, vocab) * 4).softmax(-1)
    probs[:, ::3] = 0  # cut tokens, as top-k/top-p leave them
    for _ in range(10):
        u = torch.rand(64, 1, dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
        got = inverse_cdf(probs, u)
        assert torch.equal(got, expected)
        assert (probs.gather(1, got[:, None]) > 0).all()


def test_draw_logps_are_log_softmax_at_the_temperature():
    torch.manual_seed(0)
    logits = torch.randn(16, 4096) * 5
    history = torch.zeros(16, 1, dtype=torch.long)
    u = torch.rand(16, 1, dtype=torch.float64)
    token, logp = draw(logits.bfloat16(), history, u, LogitsProcessorList(), 0.7, "completion token 0")
    exact = (logits.bfloat16().double() / 0.7).log_softmax(-1).gather(1, token[:, None]).squeeze(1)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.double(), exact, atol=1e-5, rtol=0)
    # the token comes from the processors' distribution (none here: T = 1), the log-prob at T = 0.7
    assert torch.equal(token, inverse_cdf(logits.bfloat16().float().softmax(-1), u))


def test_no_rows_draw_nothing():
    assert inverse_cdf(torch.rand(0, 49152), torch.rand(0, 1, dtype=torch.float64)).shape == (0,)
    assert inverse_cdf(torch.rand(0, 50257), torch.rand(0, 1, dtype=torch.float64)).shape == (0,)


def test_large_logits_keep_their_log_prob():
    logits = torch.zeros(2, 300)
    logits[:, :2] = 1e7  # two tokens share the mass: log π = −log 2 for either, whatever the shift
    token, logp = draw(logits, torch.zeros(2, 1, dtype=torch.long), torch.tensor([[0.25], [0.75]], dtype=torch.float64), LogitsProcessorList(), 1.0, "x")
    assert token.tolist() == [0, 1]
    torch.testing.assert_close(logp, torch.full((2,), -math.log(2)), atol=1e-6, rtol=0)


def test_draw_refuses_inf_and_nan_and_keeps_huge_finite_logits():
    history = torch.zeros(2, 1, dtype=torch.long)
    u = torch.tensor([[0.25], [0.75]], dtype=torch.float64)
    for bad in (float("inf"), float("-inf"), float("nan")):
        logits = torch.zeros(2, 300)
        logits[1, 7] = bad
        with pytest.raises(ValueError, match="logits hold inf or NaN at turn token 5"):
            draw(logits, history, u, LogitsProcessorList(), 1.0, "turn token 5")
    logits = torch.full((2, 300), -3e38)
    logits[:, :2] = 3e38  # finite, but their sum overflows: drawn from, not refused
    token, logp = draw(logits, history, u, LogitsProcessorList(), 1.0, "turn token 5")
    assert token.tolist() == [0, 1]
    torch.testing.assert_close(logp, torch.full((2,), -math.log(2)), atol=1e-6, rtol=0)
    # at T = 0.7 the same logits overflow float32 inside the temperature warper: refused, not a broken draw
    warm = logits_processors(SamplingSettings(8, [0], 0, temperature=0.7))
    with pytest.raises(ValueError, match=r"distribution at turn token 5 is not finite although the logits are .* rows \[0, 1\]"):
        draw(logits, history, u, warm, 0.7, "turn token 5")
