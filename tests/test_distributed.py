"""Two CPU processes (gloo) train exactly as one process with the same global batch.

tests/dist_script.py runs a few GRPO steps on the tiny model with fixed
completions (no sampling), so a 1-process and a 2-process run see the same
tokens and every difference would come from the distributed maths: dapo's
token count over all processes, the batch reward std gathered from all
processes, DDP's gradient average, π_ref's log-probs (β = 0.04) and
per-process checkpoint state. The 1-process run is shared with the FSDP tests
(conftest.full_one_process).

The 2-process run is launched with torchrun and resumed with
`accelerate launch --config_file examples/accelerate/ddp.yaml` (a MULTI_GPU
launch, which runs on CPUs too), so both launchers are exercised. FSDP2 is
tested the same way in tests/test_fsdp.py; the DeepSpeed files are not run.

Tolerance: fp32 sums in another order. One process accumulates the four
micro-batches' gradients one after the other; two processes each sum two and
gloo adds the halves, so results agree to rounding (~1e-7 relative), not bit
for bit. Losses and advantages are compared at rel 1e-5; weights (AdamW moves
each by ≈ lr = 1e-3 per step) at 1e-6 absolute, a thousandth of one update.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
from conftest import FULL_RUN
from dist_script import SUBCLASS_MARKER

from fastgrpo import GRPOConfig

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "dist_script.py")
DDP_CONFIG = os.path.join(HERE, "..", "examples", "accelerate", "ddp.yaml")
TIMEOUT_S = 300  # a collective that never completes must fail the test, not hang it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(command: list[str], **extra_env: str) -> None:
    # CPUs only, one thread per process (2 processes on a 2-core machine), whatever this machine has.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **extra_env}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def read_metrics(output_dir: str) -> dict[int, dict]:
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return {record["step"]: record for record in map(json.loads, f)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, full_one_process):
    """(one-process dir, two-process dir, …): 4 steps on 1 process (conftest.full_one_process, shared with the FSDP
    tests); 3 steps on 2 processes with the same settings (β = 0.04, checkpoints at 2 and 3), then resumed to 4 on 2."""
    one, two = full_one_process, str(tmp_path_factory.mktemp("two"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    # A subclass's save_model that saves on the main process only (each checkpoint's and the final one): Trainer's DDP
    # save_model is not collective, so such an override works there and must work here (it hung at a barrier).
    run([*torchrun, SCRIPT, two, "--max_steps", "3", "--main_process_saves", *FULL_RUN])
    # Step 3 is the first of the second rollout's two (μ = 2): the checkpoint carries each process's share of it.
    with open(os.path.join(two, "metrics.jsonl")) as f:
        before_resume = f.read()
    files_before_resume = sorted(os.listdir(two))
    # The shipped DDP config file: a MULTI_GPU launch, which on a machine without GPUs runs on CPUs (gloo).
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", DDP_CONFIG, "--num_processes", "2",
                  "--main_process_port", str(free_port())]
    run([*accelerate, SCRIPT, two, "--max_steps", "4", "--resume", *FULL_RUN])
    return one, two, before_resume, files_before_resume


def records(output_dir: str, suffix: str = "") -> list[dict]:
    return [torch.load(os.path.join(output_dir, f"record_{rank}{suffix}.pt")) for rank in range(2)]


@pytest.mark.slow
def test_two_processes_train_as_one(runs):
    one, two, _, _ = runs
    reference = torch.load(os.path.join(one, "record_0.pt"))
    rank0, rank1 = records(two)

    # Advantages: process 0 holds prompts 0–1, process 1 prompts 2–3 of each rollout; together the 1-process rollout.
    # scale_rewards="batch" divides by the std of all 16 rewards, which neither process holds alone.
    assert len(rank0["advantages"]) == len(rank1["advantages"]) == 2
    for k in range(2):
        both = torch.cat([rank0["advantages"][k], rank1["advantages"][k]])
        torch.testing.assert_close(both, reference["advantages"][k], rtol=1e-5, atol=1e-6)

    # Loss and gradient norm of every step (steps 2 and 3 also test π_old and the clipped ratio), as logged.
    expected, logged = read_metrics(one), read_metrics(two)
    assert sorted(logged) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):  # step 4 ran after the resume
        for key in ("loss", "grad_norm", "kl", "kl_old", "clip_ratio/region_mean", "entropy"):
            assert logged[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    for key in ("reward", "reward_std", "completions/mean_length"):
        assert logged[3][key] == pytest.approx(expected[3][key], rel=1e-6)
    assert expected[1]["loss"] != 0  # lengths differ within groups: a real dapo loss

    # Updated weights: both processes hold the 1-process weights after every step.
    resumed = records(two, "_resumed")
    for step in (1, 2, 3, 4):
        for record in (*resumed,) if step == 4 else (rank0, rank1):
            for name, value in reference["weights"][step].items():
                torch.testing.assert_close(record["weights"][step][name], value, rtol=0, atol=1e-6, msg=lambda m: f"step {step} {name}: {m}")
    moved = max((reference["weights"][1][n] - reference["weights"][2][n]).abs().max() for n in reference["weights"][1])
    assert moved > 1e-4  # the tolerance is small next to one update


@pytest.mark.slow
def test_two_processes_write_one_set_of_files_and_resume(runs):
    _, two, before_resume, files_before_resume = runs
    assert [n for n in files_before_resume if n.endswith(".jsonl")] == ["completions.jsonl", "metrics.jsonl"]
    assert [n for n in files_before_resume if "checkpoint" in n] == ["checkpoint-2", "checkpoint-3"]  # no .tmp- left behind
    checkpoint = os.path.join(two, "checkpoint-3")
    for name in ("model.safetensors", "trainer_state.pt", "rng_state_0.pt", "rng_state_1.pt", "process_state_0.pt", "process_state_1.pt"):
        assert os.path.exists(os.path.join(checkpoint, name)), name
    assert [json.loads(line)["step"] for line in before_resume.splitlines()] == [1, 2, 3]  # one line per step: main process only
    # The main-process-only save_model override ran into each checkpoint (listed in its manifest) and at the end.
    for folder, step in ((os.path.join(two, "checkpoint-2"), "2"), (checkpoint, "3")):
        with open(os.path.join(folder, "manifest.json")) as f:
            assert SUBCLASS_MARKER in json.load(f)["files"]
        with open(os.path.join(folder, SUBCLASS_MARKER)) as f:
            assert f.read() == step
    with open(os.path.join(two, SUBCLASS_MARKER)) as f:
        assert f.read() == "3"  # the 3-step launch's final save_model

    # Resumed on 2 processes: step 4 continues the saved rollout (no new one: no reward logged) and the log goes on.
    logged = read_metrics(two)
    assert sorted(logged) == [1, 2, 3, 4]
    assert "reward" not in logged[4]
    resumed = records(two, "_resumed")
    assert [r["advantages"] for r in resumed] == [[], []]  # no rollout generated after the resume
    assert sorted(n for n in os.listdir(two) if "checkpoint" in n) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    with open(os.path.join(two, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2 * 16  # both rollouts, every completion of both processes, once
    assert sorted({row["prompt"][0]["content"] for row in rows}) == sorted(f"Count to {n}." for n in range(8))

    # TRL's tables: at each log the latest generation batch, both processes' rows in process order, as the one process
    # wrote them; step 4 (after the resume, no new rollout) writes the batch the checkpoint carried.
    import pandas as pd
    one = runs[0]
    assert sorted(os.listdir(os.path.join(two, "completions"))) == [f"completions_{s:05d}.parquet" for s in range(1, 5)]
    for step in range(1, 5):
        ours, alone = (pd.read_parquet(os.path.join(d, "completions", f"completions_{step:05d}.parquet")) for d in (two, one))
        assert len(ours) == 16 and list(ours["step"]) == [step] * 16
        assert list(ours["prompt"].astype(str)) == list(alone["prompt"].astype(str))
        assert list(ours["completion"].astype(str)) == list(alone["completion"].astype(str))
        assert list(ours["advantage"]) == pytest.approx(list(alone["advantage"]), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "fields, fix",
    [
        # 4 prompts' worth of completions (16) cannot give each of 8 processes whole groups of 4.
        (dict(num_generations=4, generation_batch_size=16, per_device_train_batch_size=2, world_size=8), 32),
        # The default rollout (one optimizer step: 2 × 3 × 2 = 12) is 1.5 groups of 8 per process.
        (dict(num_generations=8, per_device_train_batch_size=2, gradient_accumulation_steps=3, world_size=2), 48),
    ],
)
def test_rollout_that_splits_groups_across_processes_is_refused_with_a_size_that_works(fields, fix):
    with pytest.raises(ValueError, match=rf"× {fields['world_size']} process\(es\)\) does not split into whole groups .* generation_batch_size "
                                         rf"that is a multiple of {fix}\b.* unset, a per_device_train_batch_size that is a multiple of (\d+)") as info:
        GRPOConfig(**fields)
    per_device = int(re.search(r"per_device_train_batch_size that is a multiple of (\d+)", str(info.value)).group(1))
    unset = {k: v for k, v in fields.items() if k != "generation_batch_size"}
    for fixed in ({**fields, "generation_batch_size": fix}, {**unset, "per_device_train_batch_size": per_device}):  # each number in it works
        config = GRPOConfig(**fixed)
        assert config.generation_batch_size // config.world_size % config.num_generations == 0
        assert config.steps_per_generation % config.gradient_accumulation_steps == 0


def test_fastgrpo_train_on_two_processes_ends_with_its_process_group_freed(tmp_path, tokenizer, make_model):
    """The command frees the process group before it returns, its gloo threads joined: a thread still releasing the last
    collective's tensors at interpreter exit needs the GIL there and aborts the process (SIGABRT) after the run is saved."""
    model_dir = str(tmp_path / "tiny")
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with open(tmp_path / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": [{"role": "user", "content": f"Count to {i}."}]}) + "\n" for i in range(16))
    out = str(tmp_path / "out")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    run([*torchrun, os.path.join(HERE, "cli_exit_script.py"), "train", "--model", model_dir, "--dataset", str(tmp_path / "prompts.jsonl"),
         "--reward", "length", "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4",
         "--max_completion_length", "4", "--logging_steps", "1", "--output_dir", out, "--disable_tqdm", "true"])
    assert [r["step"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))] == [1, 2]
    assert os.path.exists(os.path.join(out, "config.json"))  # the final model, saved before the group was freed
