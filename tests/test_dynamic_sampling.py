"""Dynamic sampling (filter_groups) end to end on the tiny model, with rewards that give spread only to known prompts.

The prompts are "Count to n." for n = 0, 1, 2, … in dataset order (shuffle_dataset=False), so the
prompts each round draws, the groups kept, the carry-over and every logged count can be worked out
by hand from the rules in rollout/group_filter.py. B = 2 prompts per rollout (8 completions, G = 4),
one optimizer step per rollout (2 micro-batches of 4, gradient_accumulation_steps = 2).
"""

import os
import re
import subprocess
import sys

import pytest
import torch
from datasets import IterableDataset

import fastgrpo.update.step as step_module
from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.rollout.group_filter import informative_groups
from fastgrpo.model.loading import lora_config

from test_distributed import TIMEOUT_S, free_port
from test_trainer import read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))


def spread_where(keep):
    """A reward with spread inside the group of prompt n exactly when keep(n): 0 for every completion elsewhere."""

    def reward(completion_ids, n, **kwargs):
        # the token ids' sum mod 997: four random completions practically never all agree
        return [float(sum(ids) % 997) if keep(k) else 0.0 for ids, k in zip(completion_ids, n)]

    return reward


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=2,
        num_generations=4, max_prompt_length=32, max_completion_length=8, max_steps=4, learning_rate=1e-3, logging_steps=1,
        save_steps=1000, disable_tqdm=True, seed=0, shuffle_dataset=False, bf16=False, filter_groups=True,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def trained_groups(trainer) -> list[list[int]]:
    """Wrap trainer._collect: the prompt numbers n of each rollout's groups, in row order (a group's G rows checked whole)."""
    seen, real = [], trainer._collect

    def spy():
        rollout = real()
        G = trainer.args.num_generations
        numbers = [int(re.search(r"\d+", p[0]["content"]).group()) for p in rollout.prompts]
        assert all(numbers[i : i + G] == [numbers[i]] * G for i in range(0, len(numbers), G))  # whole groups
        seen.append(numbers[::G])
        return rollout

    trainer._collect = spy
    return seen


# n % 3 != 0 has spread. By hand (keep rate starts at 1; a round samples ⌈need / last round's keep rate⌉):
# rollout 1: [0, 1] keeps 1 (rate 1/2); [2, 3] keeps 2 → trains [1, 2]
# rollout 2: ⌈2 / (1/2)⌉ = 4: [4, 5, 6, 7] keeps 4, 5, 7 → trains [4, 5], carries 7 (rate 3/4)
# rollout 3: carried 7, ⌈1 / (3/4)⌉ = 2: [8, 9] keeps 8 → trains [7, 8] (rate 1/2)
# rollout 4: 4: [10, 11, 12, 13] keeps 10, 11, 13 → trains [10, 11], carries 13
THIRDS = [[1, 2], [4, 5], [7, 8], [10, 11]]


def test_rollouts_hold_exactly_the_groups_with_spread_in_order_and_log_hand_counts(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path)
    trainer = GRPOTrainer(make_model(), spread_where(lambda n: n % 3 != 0), args=args, train_dataset=prompts, processing_class=tokenizer)
    seen = trained_groups(trainer)
    trainer.train()
    assert seen == THIRDS
    records = read_metrics(args.output_dir)
    expected = {  # per rollout: (rounds, prompts sampled, groups kept, carried groups, sampled groups without spread)
        1: (2, 4, 2, 0, 2), 2: (1, 4, 3, 0, 1), 3: (1, 2, 1, 1, 1), 4: (1, 4, 3, 0, 1),
    }
    for r in records:
        rounds, sampled, kept, carried, flat = expected[r["step"]]
        assert r["dynamic_sampling/rounds"] == rounds
        assert r["dynamic_sampling/keep_rate"] == pytest.approx(kept / sampled)
        assert r["dynamic_sampling/prompts_per_kept_group"] == pytest.approx(sampled / kept)
        assert r["dynamic_sampling/carried_fraction"] == pytest.approx(carried / 2)
        assert r["dynamic_sampling/frac_reward_zero_std_before"] == pytest.approx(flat / sampled)
        assert r["frac_reward_zero_std"] == 0.0  # after the filter
        assert r["dynamic_sampling/at_cap"] == 0.0


def test_carried_groups_keep_the_sampling_policys_logps_as_pi_old(tmp_path, monkeypatch, tokenizer, make_model, prompts):
    # n % 4 != 0 has spread. By hand: rollout 1: [0, 1] keeps 1 (rate 1/2); [2, 3] keeps both → trains [1, 2], carries 3.
    # Rollout 2: carried 3; [4] keeps none (rate → its floor 1/4); 4: [5, 6, 7, 8] keeps 5, 6, 7 → trains [3, 5] and
    # carries 6, 7 (sampled beside a carried group). Rollout 3: the two carried groups fill it, no sampling round.
    calls = []
    real = step_module.grpo_loss

    def spy(logps, old_logps, *args, **kwargs):
        calls.append((logps.detach().clone(), old_logps.detach().clone(), args[1].clone()))
        return real(logps, old_logps, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    args = config(tmp_path, max_steps=3, update_token_budget=0)  # one pass per micro-batch: a call per group
    trainer = GRPOTrainer(make_model(), spread_where(lambda n: n % 4 != 0), args=args, train_dataset=prompts, processing_class=tokenizer)
    seen = trained_groups(trainer)
    trainer.train()
    assert seen == [[1, 2], [3, 5], [6, 7]]
    assert [r["dynamic_sampling/rounds"] for r in read_metrics(args.output_dir)] == [2, 2, 0]
    # π_old of a carried group = the policy that sampled it (before the last update): its ratio is not 1, in both of
    # rollout 3's micro-batches (groups 6 and 7), and not in rollout 2's first (group 3).
    for logps, old, mask in (calls[2], calls[4], calls[5]):
        assert (logps - old).abs()[mask.bool()].max() > 1e-4
    fresh_logps, fresh_old, _ = calls[3]  # rollout 2's group 5, sampled now: π_old = π_θ, ratio exactly 1
    assert torch.equal(fresh_logps, fresh_old)


def test_carry_over_buffer_resumes_exactly(tmp_path, tokenizer, make_model, prompts):
    reward = spread_where(lambda n: n % 3 != 0)
    full = config(tmp_path, save_steps=2)
    GRPOTrainer(make_model(), reward, args=full, train_dataset=prompts, processing_class=tokenizer).train()
    reference = {r["step"]: r for r in read_metrics(full.output_dir)}
    os.rename(os.path.join(full.output_dir, "metrics.jsonl"), os.path.join(full.output_dir, "metrics-full.jsonl"))
    trainer = GRPOTrainer(make_model(), reward, args=config(tmp_path, save_steps=2), train_dataset=prompts, processing_class=tokenizer)
    seen = trained_groups(trainer)
    trainer.train(resume_from_checkpoint=os.path.join(full.output_dir, "checkpoint-2"))  # carries group 7
    assert seen == THIRDS[2:]
    for r in read_metrics(full.output_dir):
        assert r["loss"] == reference[r["step"]]["loss"]  # bit for bit: same carry, same RNG, same order
        assert r["dynamic_sampling/carried_fraction"] == reference[r["step"]]["dynamic_sampling/carried_fraction"]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo"])
def test_a_solved_task_trains_on_without_an_error(tmp_path, tokenizer, make_model, prompts, loss_type):
    # Issue 30 (kind 6): every completion right (reward 1), so no group ever has spread. At the cap (2 rounds) each
    # rollout is filled with the first share of groups it sampled, Â = 0: zero loss and no gradient; one warning for the run.
    args = config(tmp_path, max_num_gen_batches=2, loss_type=loss_type, max_steps=4)
    trainer = GRPOTrainer(make_model(), lambda completion_ids, **kw: [1.0] * len(completion_ids), args=args, train_dataset=prompts,
                          processing_class=tokenizer)
    seen = trained_groups(trainer)
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    with pytest.warns(UserWarning, match=r"max_num_gen_batches=2 rounds .* mean reward 1\) a process holds 0 group") as caught:
        trainer.train()
    assert sum("dynamic sampling" in str(w.message) for w in caught) == 1
    # rollout 1 samples 2 prompts, then (keep rate at its floor 1/4) 4; later ones 4 + 4; the first 2 of each fill it
    assert seen == [[0, 1], [6, 7], [14, 15], [22, 23]]
    records = read_metrics(args.output_dir)
    assert len(records) == 4 and all(r["loss"] == 0.0 and r["dynamic_sampling/filled_fraction"] == 1.0 for r in records)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.named_parameters())  # Â = 0 and β = 0: no gradient


def test_rare_spread_trains_a_smaller_step_with_the_smaller_normaliser(tmp_path, monkeypatch, tokenizer, make_model, prompts):
    # Only prompt 5 has spread. Rollout 1: [0, 1] none (keep rate → its floor 1/4); ⌈2 / (1/4)⌉ = 8, at most
    # 2 × B = 4: [2, 3, 4, 5] keeps 5;
    # the cap (2 rounds): one group of 4 completions, still 2 micro-batches (2 + 2 rows) and one optimizer step.
    counts = []
    real = step_module.grpo_loss

    def spy(logps, old_logps, advantages, mask, step_counts, **kwargs):
        counts.append((len(logps), float(mask.sum()), step_counts))
        return real(logps, old_logps, advantages, mask, step_counts, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    args = config(tmp_path, max_steps=1, max_num_gen_batches=2, loss_type="dapo", update_token_budget=0)  # a call per micro-batch
    trainer = GRPOTrainer(make_model(), spread_where(lambda n: n == 5), args=args, train_dataset=prompts, processing_class=tokenizer)
    seen = trained_groups(trainer)
    trainer.train()
    assert seen == [[5]]
    assert [rows for rows, _, _ in counts] == [2, 2]
    tokens = sum(t for _, t, _ in counts)  # the 4 completions' loss tokens: dapo divides by them (1 step, 1 process)
    assert all(c.tokens == tokens and c.sequences == 4 and c.micro_batches == 2 for _, _, c in counts)
    record = read_metrics(args.output_dir)[0]
    assert record["dynamic_sampling/at_cap"] == 1.0 and record["dynamic_sampling/rounds"] == 2
    assert record["dynamic_sampling/keep_rate"] == pytest.approx(1 / 6)


def test_works_with_reuse_target_kl_streaming_and_eval(tmp_path, tokenizer, make_model, prompts):
    stream = IterableDataset.from_generator(lambda: iter(prompts))
    args = config(tmp_path, num_iterations=2, target_kl=1e-9, max_steps=6, eval_strategy="steps", eval_steps=2,
                  per_device_eval_batch_size=4)
    reward = spread_where(lambda n: n % 3 != 0)
    trainer = GRPOTrainer(make_model(), reward, args=args, train_dataset=stream, eval_dataset=prompts.select(range(3)), processing_class=tokenizer)
    seen = trained_groups(trainer)
    trainer.train()
    assert seen == THIRDS  # the stream gives the rows in the same order
    # μ = 2: two steps per rollout. A fresh rollout's first step has KL(π_θ‖π_old) = 0; rollout 3's carried group
    # was sampled before the previous rollout's updates, so its first step exceeds target_kl and ends its reuse.
    assert trainer.target_kl_stops == 1 and trainer.state.global_step == 6
    evals = [r for r in read_metrics(args.output_dir) if "eval_reward" in r]
    assert evals  # every eval prompt scored, no filtering: prompt 0 has reward 0 and still counts
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/reward/mean"])


def test_works_with_lora_adapters_and_a_filter_on_one_reward(tmp_path, tokenizer, make_model, prompts):
    # Two reward functions; the filter looks at "reward" alone (verl's filter_groups.metric), so the constant
    # "flat" function changes nothing: the same groups as THIRDS. The carried group's π_behaviour comes from the
    # adapted policy (adapters on), and only adapter weights train.
    def flat(completions, **kwargs):
        return [1.0] * len(completions)

    args = config(tmp_path, filter_groups_metric="reward", beta=0.04)
    model = make_model()
    trainer = GRPOTrainer(model, [spread_where(lambda n: n % 3 != 0), flat], args=args, train_dataset=prompts, processing_class=tokenizer,
                          peft_config=lora_config(lora_r=4, lora_alpha=8, lora_target_modules="all-linear"))
    seen = trained_groups(trainer)
    trainer.train()
    assert seen == THIRDS
    assert all(r["dynamic_sampling/at_cap"] == 0 for r in read_metrics(args.output_dir))


def test_informative_groups_follow_the_advantage_aggregation():
    # two functions, weights 1 and 1; group 0: totals equal (1+0, 0+1) but each function differs;
    # group 1: function 0 differs; group 2: everything equal; group 3: NaN (not applicable) beside equal values.
    rewards = torch.tensor([
        [[1.0, 0.0], [0.0, 1.0]],
        [[1.0, 0.0], [0.0, 0.0]],
        [[1.0, 1.0], [1.0, 1.0]],
        [[float("nan"), 1.0], [1.0, 1.0]],
    ])
    weights = torch.tensor([1.0, 1.0])
    assert informative_groups(rewards, weights, "sum_then_normalize").tolist() == [False, True, False, True]
    assert informative_groups(rewards, weights, "normalize_then_sum").tolist() == [True, True, False, False]


def test_bad_settings_are_refused_before_any_model_loads(tmp_path, prompts):
    with pytest.raises(ValueError, match="max_num_gen_batches=0"):
        config(tmp_path, max_num_gen_batches=0)
    with pytest.raises(ValueError, match="filter_groups_max_age=-1"):
        config(tmp_path, filter_groups_max_age=-1)
    with pytest.raises(ValueError, match="filter_groups_metric='acc' is neither a reward function \\(reward\\)"):
        GRPOTrainer("no-such-model-is-loaded", spread_where(bool), args=config(tmp_path, filter_groups_metric="acc"), train_dataset=prompts)


def torchrun(output_dir, *flags):
    """tests/dist_dynamic_script.py on 2 CPU processes (gloo), one thread each; a collective that never completes fails by timeout."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
               os.path.join(HERE, "dist_dynamic_script.py"), str(output_dir), *flags]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return [torch.load(os.path.join(output_dir, f"record_{rank}.pt")) for rank in range(2)]


@pytest.mark.slow
def test_two_processes_fill_their_own_share_with_whole_groups_in_step(tmp_path):
    # Spread where n % 4 < 2. A round of n prompts per process draws 2n: process 0 the first n, process 1 the rest.
    # Rollout 1: [0, 1] | [2, 3]: process 1 keeps nothing, so both sample again (keep rate 2/4 → 4 prompts each):
    # [4, 5, 6, 7] | [8, 9, 10, 11] → process 0 trains [0, 1] and carries 4, 5; process 1 trains [8, 9].
    # Rollouts 2, 3: process 0 starts full from its carry, process 1 needs 2 → one round of 4 each ([12 … 19], [20 … 27]).
    rank0, rank1 = torchrun(tmp_path)
    assert rank0["groups"] == [[0, 1], [4, 5], [12, 13]]
    assert rank1["groups"] == [[8, 9], [16, 17], [24, 25]]
    assert rank0["steps"] == rank1["steps"] == 3 and rank0["warnings"] == rank1["warnings"] == []
    for name, value in rank0["weights"].items():  # DDP's gradient average ran every step: the same weights on both
        assert torch.equal(value, rank1["weights"][name]), name


@pytest.mark.slow
def test_two_processes_at_the_cap_with_nothing_on_one_process_train_on_together(tmp_path):
    # Only process 0's groups have spread. Rollout 1: [0, 1] | [2, 3], then (keep rate 2/4) 4 prompts each: [4 … 7] |
    # [8 … 11]; the cap (2 rounds) with 0 groups on process 1: each trains a full share, process 0 its first two
    # groups with spread (carrying 4, 5), process 1 its first two without ([2, 3], Â = 0). Rollout 2: process 0 trains
    # its carry [4, 5]; process 1 [16, 17] of [16 … 19] | … Both make every step, in step (one warning each).
    rank0, rank1 = torchrun(tmp_path, "--rank0_only")
    assert rank0["groups"] == [[0, 1], [4, 5], [12, 13]]
    assert rank1["groups"][:2] == [[2, 3], [16, 17]] and len(rank1["groups"]) == 3
    assert rank0["steps"] == rank1["steps"] == 3
    for record in (rank0, rank1):
        assert len(record["warnings"]) == 1 and "a process holds 0 group(s) with reward spread" in record["warnings"][0]
    for name, value in rank0["weights"].items():
        assert torch.equal(value, rank1["weights"][name]), name


def test_a_carried_groups_pi_behaviour_and_kl_old_by_hand(tmp_path, monkeypatch, tokenizer, make_model, prompts):
    # Issue 30, kind 7. As in the test above, group 3 is sampled in rollout 1 and trained in rollout 2 (after one update).
    # Its π_old must be log π_behaviour: the initial weights (make_model() again: same seed, same weights) on its own
    # prompt and completion tokens, positions over the real tokens, logits / τ (τ = 0.7 here); and step 2's kl_old
    # must be the token mean of k3 = e^{old − logp} − (old − logp) − 1 over both of its micro-batches.
    calls = []
    real = step_module.grpo_loss

    def spy(logps, old_logps, *args, **kwargs):
        calls.append((logps.detach().clone(), old_logps.detach().clone(), args[1].clone()))
        return real(logps, old_logps, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    args = config(tmp_path, max_steps=2, temperature=0.7, update_token_budget=0)  # a call per micro-batch
    trainer = GRPOTrainer(make_model(), spread_where(lambda n: n % 4 != 0), args=args, train_dataset=prompts, processing_class=tokenizer)
    rollouts, collect = [], trainer._collect
    trainer._collect = lambda: rollouts.append(collect()) or rollouts[-1]
    trainer.train()
    carried = rollouts[1].select(slice(0, 4))  # group 3: rows 0–3 of rollout 2
    assert carried.prompts[0][0]["content"] == "Count to 3."
    ids = torch.cat([carried.prompt_ids, carried.completion_ids], 1)
    mask = torch.cat([carried.prompt_mask, carried.completion_mask], 1)
    with torch.no_grad():
        logits = make_model()(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    T = carried.completion_ids.shape[1]
    behaviour = torch.log_softmax(logits[:, -T - 1 : -1].float() / 0.7, -1).gather(-1, carried.completion_ids[..., None]).squeeze(-1)
    real_tokens = carried.completion_mask.bool()
    torch.testing.assert_close(carried.old_logps[real_tokens], behaviour[real_tokens], atol=1e-5, rtol=0)
    step2 = calls[2:4]  # rollout 2's two micro-batches (group 3, then group 5)
    torch.testing.assert_close(step2[0][1][real_tokens], behaviour[real_tokens], atol=1e-5, rtol=0)  # what the loss saw
    k3_sum = sum(float(((torch.exp(old - new) - (old - new) - 1) * m).sum()) for new, old, m in step2)
    tokens = sum(float(m.sum()) for _, _, m in step2)
    record = read_metrics(args.output_dir)[1]
    assert record["step"] == 2 and record["kl_old"] == pytest.approx(k3_sum / tokens, rel=1e-5)
    assert 0 < record["kl_old"] < 0.1  # one update of lr 1e-3 moves a lagging group's π by a little, not nats per token
