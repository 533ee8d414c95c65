"""Gradient checkpointing (model/checkpointing.py): checkpointed layers recompute as their forward ran.

A pass that runs shared-prompt rows through grouped attention keeps doing so under checkpointing, and
the bf16 working copy stays on: the gradients are those of the same pass without checkpointing, bit for bit.
"""

from contextlib import contextmanager
from types import SimpleNamespace
import warnings

import pytest
import torch

from fastgrpo.model.checkpointing import attention_implementation, enable_gradient_checkpointing, is_checkpointed, recomputes_as_forward
from fastgrpo.model.working_copy import WorkingCopy
from fastgrpo.update import grouped_attention as ga
from fastgrpo.update import packing
from fastgrpo.update.logprobs import LogProbs


def shared_prompts():
    # Two groups of 3 completions, each group one prompt of 5 tokens: one packed row, each prompt once.
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 500, (2, 5), generator=g).repeat_interleave(3, 0)
    completions = torch.randint(10, 500, (6, 4), generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    return SimpleNamespace(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts), completion_ids=completions * mask, completion_mask=mask)


@pytest.fixture
def grouped_calls(monkeypatch):
    """Counts grouped-attention calls (one per layer and forward); every shared row takes the layout, whatever its size."""
    calls, real = [], ga._GroupedAttention.apply
    monkeypatch.setattr(ga._GroupedAttention, "apply", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(packing, "use_layout", lambda layout, length: True)
    return calls


def gradients(model, mb, bf16: bool, calls: list, grouped_attention: bool = True) -> dict:
    """One pass's Σ log-probs backward, as the update runs it (bf16: autocast and the working copy); → {name: grad}."""
    model.train()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else None
    log_probs = LogProbs(1.0, grouped_attention=grouped_attention, **({"autocast": autocast, "weights": WorkingCopy(model)} if bf16 else {}))
    log_probs(model, mb)  # the first pass of a model class also measures what it supports
    model.zero_grad(set_to_none=True)
    calls.clear()
    (log_probs(model, mb).logps * mb.completion_mask).sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("bf16", [False, True])
def test_checkpointed_layers_recompute_grouped_attention_and_give_the_same_gradients(make_model, grouped_calls, bf16):
    mb = shared_prompts()
    plain = gradients(make_model(), mb, bf16, grouped_calls)
    assert len(grouped_calls) == 2  # 2 layers, one forward
    model = make_model()
    enable_gradient_checkpointing(model)
    assert is_checkpointed(model) and recomputes_as_forward(model)
    checkpointed = gradients(model, mb, bf16, grouped_calls)
    assert len(grouped_calls) == 4  # and each layer again in backward
    assert model.config._attn_implementation == "sdpa"
    for name, grad in plain.items():
        assert torch.equal(checkpointed[name], grad), name  # the same products, in the same order


@pytest.mark.parametrize("bf16", [False, True])
def test_reentrant_checkpointing_keeps_the_dense_mask(make_model, grouped_calls, bf16):
    # Reentrant checkpointing takes no context_fn: its layers recompute under sdpa, so the pass never switches. Its
    # forward runs without a graph and its recomputation outside functional_call, under autocast: with the working
    # copy the gradients still equal the dense-mask pass's without checkpointing, bit for bit.
    mb = shared_prompts()
    plain = gradients(make_model(), mb, bf16, grouped_calls, grouped_attention=False)
    model = make_model()
    enable_gradient_checkpointing(model, {"use_reentrant": True})
    assert not recomputes_as_forward(model)
    reentrant = gradients(model, mb, bf16, grouped_calls)
    assert not grouped_calls
    for name, grad in plain.items():
        assert torch.equal(reentrant[name], grad), name


def test_checkpointing_enabled_by_the_caller_keeps_the_dense_mask(make_model, grouped_calls):
    model = make_model()
    model.gradient_checkpointing_enable()  # without our recompute context
    assert not recomputes_as_forward(model)
    gradients(model, shared_prompts(), False, grouped_calls)
    assert not grouped_calls
    assert recomputes_as_forward(make_model())  # nothing is recomputed without checkpointing


def test_a_callers_context_fn_runs_around_the_forward_and_the_recomputation(make_model, grouped_calls):
    entered = []

    @contextmanager
    def note(what):
        entered.append(what)
        yield

    model = make_model()
    enable_gradient_checkpointing(model, {"context_fn": lambda: (note("forward"), note("recompute"))})
    gradients(model, shared_prompts(), False, grouped_calls)
    assert entered.count("forward") == 2 * 2 and entered.count("recompute") == 2  # 2 passes × 2 layers; 1 backward
    assert len(grouped_calls) == 4


def test_a_pass_in_another_thread_waits_for_the_switch_to_end(make_model):
    # The config is shared: a forward in another thread (the async producer's) must not run under this one's switch.
    import threading

    model, seen = make_model(), []
    inside, release = threading.Event(), threading.Event()

    def switched():
        with attention_implementation(model, ga.IMPLEMENTATION):
            inside.set()
            release.wait(10)

    def other_pass():
        with attention_implementation(model, None):
            seen.append(model.config._attn_implementation)

    first = threading.Thread(target=switched)
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=other_pass)
    second.start()
    second.join(0.3)
    assert second.is_alive() and not seen  # waiting: the switch is not its own
    release.set()
    first.join(10)
    second.join(10)
    assert seen == ["sdpa"]


@pytest.mark.parametrize("kwargs", [{"use_reentrant": None}, {"debug": True}])
def test_checkpointing_that_takes_no_context_keeps_the_dense_mask(make_model, grouped_calls, kwargs):
    # use_reentrant=None is torch's reentrant default; debug=True refuses a context_fn: both recompute under sdpa.
    mb = shared_prompts()
    plain = gradients(make_model(), mb, False, grouped_calls, grouped_attention=False)
    model = make_model()
    enable_gradient_checkpointing(model, kwargs)
    assert is_checkpointed(model) and not recomputes_as_forward(model)
    checkpointed = gradients(model, mb, False, grouped_calls)
    assert not grouped_calls
    for name, grad in plain.items():
        assert torch.equal(checkpointed[name], grad), name


@pytest.mark.parametrize("kwargs,message", [
    ({"use_reentrat": False}, "gradient_checkpointing_kwargs has 'use_reentrat', which torch.utils.checkpoint does not take; use use_reentrant"),
    ({"use_reentrant": "false"}, "use_reentrant='false': use True or False"),
])
def test_checkpointing_kwargs_torch_would_misread_are_refused(make_model, kwargs, message):
    model = make_model()
    with pytest.raises(ValueError, match=message):
        enable_gradient_checkpointing(model, kwargs)
    assert not is_checkpointed(model)


def test_checkpointing_is_set_and_read_through_the_installed_transformers_own_names(make_model):
    # transformers 5.25 renamed gradient checkpointing to activation checkpointing; the old names warn (FutureWarning)
    # and go in v6: on either side of the rename, enabling and reading it warns nothing and reads what was set.
    model = make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert not is_checkpointed(model) and recomputes_as_forward(model)
        enable_gradient_checkpointing(model)
        assert is_checkpointed(model) and recomputes_as_forward(model)
    assert sum(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()) >= 1
