"""FSDP2 on two CPU processes (gloo) trains exactly as one process with the same global batch.

tests/dist_script.py (fixed completions, 16 per optimizer step, μ = 2) runs:

- full fine-tuning with β = 0.04 (π_ref a frozen copy, sharded like the policy):
  1 process for 4 steps, against 2 FSDP processes (torchrun with the variables
  `examples/accelerate/fsdp.yaml` sets) stopped after step 3 with sharded
  checkpoints at steps 2 and 3, then resumed to step 4 twice: on 2 processes with
  `accelerate launch --config_file examples/accelerate/fsdp.yaml` from
  checkpoint-3 (inside a rollout's reuse window); the sharded checkpoint-2 is
  also loaded here, into one whole model and optimizer (the shards re-cut for
  one process);
- LoRA (β = 0.04 as adapters disabled, gradient checkpointing): 1 process against
  a 2-node launch simulated here (`torchrun --nnodes 2`, node ranks 0 and 1, one
  process each, rendezvous on 127.0.0.1), 2 steps.

tests/dist_best_script.py (sampled completions) checks on 2 FSDP processes what was first tested on one: the best
checkpoint loaded at the end, evaluate() after train(), stop strings and args changed on the built trainer.

Tolerance, as tests/test_distributed.py: fp32 sums in another order (two
processes each sum half the micro-batches' gradients, FSDP reduce-scatters
them), so losses and advantages agree at rel 1e-5 and weights at 1e-6 absolute,
a thousandth of one AdamW update (≈ lr = 1e-3). bf16 is off in these runs
(dist_script.py sets `bf16=False`, whatever this CPU's bf16 units); FSDP's bf16
policy is not compared here.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FULL_RUN, tiny_model
from test_distributed import SCRIPT, TIMEOUT_S, free_port, read_metrics, records, run
from transformers import AutoModelForCausalLM

from fastgrpo import GRPOConfig
from fastgrpo.model.optimizers import build_optimizer
from fastgrpo.model.launch import cpu_launch_error
from fastgrpo.model.sharding import fsdp_requested, load_sharded

HERE = os.path.dirname(os.path.abspath(__file__))
FSDP_CONFIG = os.path.join(HERE, "..", "examples", "accelerate", "fsdp.yaml")
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}  # what `accelerate launch` sets from fsdp.yaml
PYTHON = sys.executable


def torchrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", *args]


@pytest.fixture(scope="module")
def full(tmp_path_factory, full_one_process):
    """(one, two): 1 process to step 4 (conftest.full_one_process); 2 FSDP processes to step 3 (checkpoints 2 and 3),
    resumed to 4 on 2."""
    one, two = full_one_process, str(tmp_path_factory.mktemp("two"))
    run(torchrun("--nproc_per_node", "2", "--master_port", str(free_port()), SCRIPT, two, "--max_steps", "3", *FULL_RUN), **FSDP_ENV)
    accelerate = [PYTHON, "-m", "accelerate.commands.launch", "--config_file", FSDP_CONFIG, "--num_processes", "2",
                  "--main_process_port", str(free_port())]
    run([*accelerate, SCRIPT, two, "--max_steps", "4", "--resume", *FULL_RUN])
    return one, two


# The sharded run's whole-vocabulary head (logit − logsumexp, TRL's selective_log_softmax) and the one process's
# chunked head (an in-place log-softmax) round differently by ≈ 1e-7, which AdamW's m/√v enlarges where a gradient
# is near 0 (1.5e-6 seen after one step); a wrong shard or gradient is off by orders more.
WEIGHT_ATOL = 3e-6


def assert_weights(record: dict, reference: dict, steps) -> None:
    for step in steps:
        assert sorted(record["weights"][step]) == sorted(reference["weights"][step])
        for name, value in reference["weights"][step].items():
            torch.testing.assert_close(record["weights"][step][name], value, rtol=0, atol=WEIGHT_ATOL, msg=lambda m: f"step {step} {name}: {m}")


@pytest.mark.slow
def test_fsdp_on_two_processes_trains_as_one(full):
    one, two = full
    reference = torch.load(os.path.join(one, "record_0.pt"))
    rank0, rank1 = records(two)
    for k in range(2):  # process 0 holds prompts 0–1 of each rollout, process 1 prompts 2–3
        torch.testing.assert_close(torch.cat([rank0["advantages"][k], rank1["advantages"][k]]), reference["advantages"][k], rtol=1e-5, atol=1e-6)
    expected, logged = read_metrics(one), read_metrics(two)
    assert sorted(logged) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):  # step 4 ran after the resume
        for key in ("loss", "grad_norm", "kl_old", "clip_ratio/region_mean", "entropy", "kl"):
            assert logged[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert expected[2]["kl"] > 0  # π_θ has left π_ref: the sharded π_ref enters the loss
    for record in (rank0, rank1):  # every process gathers the whole weights: the 1-process ones after each step
        assert_weights(record, reference, (1, 2, 3))
        # The sampler's whole copy, gathered once per rollout: rollout 2 is sampled with the weights after step 2.
        assert len(record["sampled"]) == 2
        assert_weights({"weights": {2: record["sampled"][1]}}, reference, (2,))
    for record in records(two, "_resumed"):
        assert_weights(record, reference, (4,))
    moved = max((reference["weights"][1][n] - reference["weights"][2][n]).abs().max() for n in reference["weights"][1])
    assert moved > 1e-4  # the tolerance is small next to one update


@pytest.mark.slow
def test_fsdp_checkpoints_are_sharded_and_load_on_another_number_of_processes(full, tokenizer):
    one, two = full
    checkpoint = os.path.join(two, "checkpoint-3")
    with open(os.path.join(checkpoint, "manifest.json")) as f:
        files = json.load(f)["files"]
    # Each process's shards, torch.distributed.checkpoint's index, the config; no whole model file.
    for name in (".metadata", "__0_0.distcp", "__1_0.distcp", "config.json", "trainer_state.pt", "rng_state_1.pt", "process_state_1.pt"):
        assert name in files, name
    assert "model.safetensors" not in files
    assert torch.load(os.path.join(checkpoint, "trainer_state.pt"), weights_only=False)["optimizer"] is None  # it is in the shards
    assert not [n for n in os.listdir(two) if n.startswith(".tmp-")]

    # checkpoint-2's shards, read by this one process into a whole model and optimizer: step 2's weights, 2 Adam steps.
    model = tiny_model(tokenizer, seed=1)
    optimizer = build_optimizer(GRPOConfig(learning_rate=1e-3), model)
    load_sharded(os.path.join(two, "checkpoint-2"), model, optimizer)
    reference = torch.load(os.path.join(one, "record_0.pt"))
    for name, value in model.named_parameters():
        torch.testing.assert_close(value.detach(), reference["weights"][2][name], rtol=0, atol=WEIGHT_ATOL)
    for p in model.parameters():
        assert float(optimizer.state[p]["step"]) == 2 and optimizer.state[p]["exp_avg_sq"].shape == p.shape

    # save_model gathers the whole model: from_pretrained loads the 1-process weights of step 4.
    loaded = dict(AutoModelForCausalLM.from_pretrained(two).named_parameters())
    for name, value in reference["weights"][4].items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=WEIGHT_ATOL)


@pytest.mark.slow
def test_lora_under_fsdp_on_a_two_node_launch_trains_as_one_process_and_logs_once(tmp_path, lora_one_process):
    one, two = lora_one_process, str(tmp_path / "two")
    port = str(free_port())
    env = {**os.environ, **FSDP_ENV, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    nodes = [  # two torchrun agents, as on two machines: one process each, node 0 hosts the rendezvous
        subprocess.Popen(
            torchrun("--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
                     "--master_port", port, SCRIPT, two, "--max_steps", "2", "--lora"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=TIMEOUT_S)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-4000:] for o in outputs)

    reference = torch.load(os.path.join(one, "record_0.pt"))
    for record in records(two):
        assert_weights(record, reference, (1, 2))
        lora_names = [n for n in record["weights"][2] if "lora_" in n]
        assert lora_names and all(record["weights"][2][n].dtype == torch.float32 for n in lora_names)
    with open(os.path.join(two, "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]  # one line per step: written by one process only
    expected, logged = read_metrics(one), read_metrics(two)
    for step in (1, 2):
        for key in ("loss", "grad_norm", "kl"):
            assert logged[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)


def test_a_deepspeed_launch_on_cpus_and_fsdp_version_1_are_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets from a DeepSpeed file
    assert "DeepSpeed" in cpu_launch_error(True) and "fsdp.yaml" in cpu_launch_error(True)
    assert cpu_launch_error(False) is None  # a GPU run: accelerate reads the DeepSpeed file
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert cpu_launch_error(True) is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert fsdp_requested()
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="fsdp_version=1.*fsdp_version: 2"):
        fsdp_requested()


@pytest.mark.slow
def test_best_model_stop_strings_live_args_and_evaluate_after_train_on_two_fsdp_processes(tmp_path, tokenizer):
    """tests/dist_best_script.py on 2 FSDP processes (each a check that held when first run on two processes):

    - load_best_model_at_end: every process names checkpoint-2 (the step-dependent eval bonus makes it the best) and
      holds step 2's whole weights after train(), loaded from its own shards (exactly: the same fp32 values);
    - evaluate() after train(): the sampler's gathered copy is refreshed, to those best weights;
    - save_steps and eval_steps set to 1 on the built trainer: a checkpoint and an evaluation at every step;
    - stop strings with the own sampler: each process ends its own rows at the token completing "x" or "z" (kept), at
      EOS, or at T (truncated), pads after; completions.jsonl holds both processes' rows of each rollout.
    """
    from dist_best_script import STOP_STRINGS, T

    out = str(tmp_path / "two")
    run(torchrun("--nproc_per_node", "2", "--master_port", str(free_port()), os.path.join(HERE, "dist_best_script.py"), out), **FSDP_ENV)
    rank0, rank1 = records(out)
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert [r["step"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "eval_reward" in r] == [1, 2, 3, 3]  # + evaluate()
    for record in (rank0, rank1):
        assert record["best"] == os.path.join(out, "checkpoint-2")
        assert_weights({"weights": {2: record["final"]}}, record, (2,))
        torch.testing.assert_close(record["final"], rank0["final"], rtol=0, atol=0)
        torch.testing.assert_close(record["sampled"], record["final"], rtol=0, atol=0)
        assert max((record["weights"][3][n] - record["final"][n]).abs().max() for n in record["final"]) > 1e-4  # step 3 moved them

    ends = {"stop": 0, "eos": 0, "truncated": 0}
    for k in range(3):  # one rollout per step
        texts = []
        for record in (rank0, rank1):
            rollout = record["rollouts"][k]
            assert len(rollout["texts"]) == 8  # this process's half: 2 prompts × G = 4
            for ids, mask, truncated in zip(rollout["ids"].tolist(), rollout["mask"].tolist(), rollout["truncated"].tolist()):
                n = sum(mask)
                assert mask == [1] * n + [0] * (len(mask) - n) and ids[n:] == [tokenizer.pad_token_id] * (len(ids) - n)
                text, before = tokenizer.decode(ids[:n]), tokenizer.decode(ids[: n - 1])
                stopped = any(s in text and s not in before for s in STOP_STRINGS)
                end = "stop" if stopped else "eos" if ids[n - 1] == tokenizer.eos_token_id else "truncated"
                assert truncated == (end == "truncated") and (end != "truncated" or n == T)
                ends[end] += 1
            texts += rollout["texts"]
        logged = [r for r in map(json.loads, open(os.path.join(out, "completions.jsonl"))) if r["step"] == k + 1]
        assert sorted(r["completion"][0]["content"] for r in logged) == sorted(texts)
    assert ends["stop"] and ends["truncated"]
