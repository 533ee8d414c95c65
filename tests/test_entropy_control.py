"""The entropy bonus's coefficient in a training run: logged every step, checkpointed, restored on resume (issue 23).

The maths is checked by hand in tests/test_parity_by_hand.py and against TRL's
own `_compute_loss` in tests/test_trl_parity.py; here the trainer runs the tiny
random model of conftest.py for a few steps (fp32: bf16=False, exact numbers).
"""

import os

import pytest
import torch
from test_trainer import config, read_metrics, reward_even_tokens

from fastgrpo import GRPOTrainer

# The tiny model's entropy is ≈ ln 49 152 ≈ 10.8 nats, always below a 20-nat target: the
# coefficient rises by Δ every step from 0 (0.01, 0.02, …) and, from step 2 on, is applied.
ADAPTIVE = dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_target=20.0, entropy_coef_delta=0.01, bf16=False)


def test_adaptive_coefficient_is_logged_checkpointed_and_restored(tmp_path, tokenizer, make_model, prompts):
    # vespo with μ = 2: the second pass is off policy, so φ(w) ≠ 1 is logged too.
    common = dict(loss_type="vespo", num_iterations=2, steps_per_generation=2, max_steps=4, save_steps=2, **ADAPTIVE)
    full = config(tmp_path, **common)
    GRPOTrainer(make_model(), reward_even_tokens, args=full, train_dataset=prompts, processing_class=tokenizer).train()
    reference = {r["step"]: r for r in read_metrics(full.output_dir)}
    assert [reference[s]["entropy_coef"] for s in (1, 2, 3, 4)] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    # step 1 applies c = 0 (no entropy measured yet): the loss is the policy loss; later steps subtract c·H ≈ c·10.8
    assert reference[1]["loss"] == pytest.approx(reference[1]["policy_loss"], abs=1e-7)
    assert reference[3]["policy_loss"] - reference[3]["loss"] == pytest.approx(0.02 * reference[3]["entropy"], rel=1e-3)
    assert any(abs(reference[s]["vespo/phi_seq_mean"] - 1) > 1e-6 for s in (2, 4))  # the μ = 2 passes
    state = torch.load(os.path.join(full.output_dir, "checkpoint-2", "trainer_state.pt"), weights_only=False)
    assert state["entropy_control"]["entropy_coef"] == pytest.approx(0.02)
    assert 5 < state["entropy_control"]["last_world_entropy"] < 20

    # Resume at step 2: steps 3–4 apply and log the same coefficients and losses as the run that never stopped
    # (a fresh controller would apply 0 at step 3 and log 0.01).
    os.rename(os.path.join(full.output_dir, "metrics.jsonl"), os.path.join(full.output_dir, "metrics-full.jsonl"))
    resumed = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, **common), train_dataset=prompts, processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=os.path.join(full.output_dir, "checkpoint-2"))
    after = {r["step"]: r for r in read_metrics(full.output_dir)}
    for step in (3, 4):
        assert after[step]["entropy_coef"] == pytest.approx(reference[step]["entropy_coef"])
        assert after[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-5, abs=1e-7)
    assert resumed.entropy_control.coef == pytest.approx(0.04)


def test_luspo_trains_at_sequence_level_with_a_fixed_bonus(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path, loss_type="luspo", importance_sampling_level="sequence", entropy_coef=0.01, max_steps=2, bf16=False)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    records = read_metrics(args.output_dir)
    assert [r["entropy_coef"] for r in records] == [0.01, 0.01]  # a fixed coefficient, applied from step 1
    for r in records:
        assert r["policy_loss"] - r["loss"] == pytest.approx(0.01 * r["entropy"], rel=1e-3)
