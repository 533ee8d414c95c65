"""A checkpoint's trainer_state.json holds what TRL 1.16's holds (transformers' `TrainerState.save_to_json`): the same
fields with the same values for the same run, but for the run's own numbers (log_history's values, total_flos: TRL's
GRPO reports 0) — eval_steps stays TrainerState's default without step evaluations, TrainerControl is among the
`stateful_callbacks`, and transformers reads it back."""

import json
import os
import warnings

import pytest
from transformers import TrainerState

from fastgrpo import GRPOConfig, GRPOTrainer


def reward_even(completion_ids, **kw):
    """Fraction of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def test_trainer_state_json_has_trls_fields_and_values(tmp_path, tokenizer, make_model, prompts):
    common = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=2, logging_steps=1, save_steps=2,
                  report_to="none", disable_tqdm=True, bf16=False)
    data = dict(train_dataset=prompts.select(range(8)), processing_class=tokenizer)
    ours = GRPOTrainer(make_model(), reward_even, args=GRPOConfig(str(tmp_path / "fg"), **common), **data)
    ours.train()
    path = os.path.join(ours.args.output_dir, "checkpoint-2", "trainer_state.json")
    with open(path) as f:
        got = json.load(f)
    assert got["eval_steps"] == 500 and got["logging_steps"] == 1 and got["save_steps"] == 2  # 500: TrainerState's default
    control = got["stateful_callbacks"]["TrainerControl"]["args"]
    assert control["should_save"] is True and control["should_training_stop"] is True  # the last step, a save
    assert TrainerState.load_from_json(path).global_step == 2

    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own warnings about this tiny setup
        theirs = trl.GRPOTrainer(model=make_model(), reward_funcs=reward_even, args=trl.GRPOConfig(str(tmp_path / "trl"), use_cpu=True, **common), **data)
        theirs.train()
    with open(os.path.join(theirs.args.output_dir, "checkpoint-2", "trainer_state.json")) as f:
        want = json.load(f)
    assert {k: v for k, v in got.items() if k not in ("log_history", "total_flos")} == {k: v for k, v in want.items() if k not in ("log_history", "total_flos")}
    assert [sorted(set(r) - set(g)) for r, g in zip(want["log_history"], got["log_history"])] == [[], []]  # TRL's keys, each record
