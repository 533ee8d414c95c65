"""`log_level` sets transformers' logging verbosity when the trainer is built, as Trainer's `__init__` does
(`logging.set_verbosity(args.get_process_log_level())`); "passive" leaves it as it is."""

import logging
import warnings

import pytest
from transformers.utils import logging as hf_logging

from fastgrpo import GRPOConfig, GRPOTrainer


def reward_even(completion_ids, **kw):
    """Fraction of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


@pytest.fixture
def verbosity():
    """transformers' verbosity, restored after the test."""
    before = hf_logging.get_verbosity()
    yield
    hf_logging.set_verbosity(before)


@pytest.mark.parametrize("log_level, want", [("error", logging.ERROR), ("info", logging.INFO), ("passive", logging.CRITICAL)])
def test_log_level_sets_transformers_verbosity_as_trl(tmp_path, tokenizer, make_model, prompts, verbosity, log_level, want):
    common = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=1, report_to="none", bf16=False,
                  log_level=log_level)
    data = dict(train_dataset=prompts.select(range(4)), processing_class=tokenizer)
    hf_logging.set_verbosity(logging.CRITICAL)  # what "passive" keeps
    GRPOTrainer(make_model(), reward_even, args=GRPOConfig(str(tmp_path / "fg"), **common), **data)
    assert hf_logging.get_verbosity() == want
    trl = pytest.importorskip("trl")
    hf_logging.set_verbosity(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own warnings about this tiny setup
        trl.GRPOTrainer(model=make_model(), reward_funcs=reward_even, args=trl.GRPOConfig(str(tmp_path / "trl"), use_cpu=True, **common), **data)
    assert hf_logging.get_verbosity() == want  # TRL's GRPOTrainer, the same
