"""Dynamic sampling on two processes (gloo) with the tiny model; run by tests/test_dynamic_sampling.py.

    torchrun --standalone --nproc_per_node 2 tests/dist_dynamic_script.py OUT            # groups with spread: n % 4 < 2
    torchrun --standalone --nproc_per_node 2 tests/dist_dynamic_script.py OUT --rank0_only   # spread only on process 0

Each rollout is 16 completions, 2 prompts × G = 4 per process, one optimizer step
(2 micro-batches). A round of n prompts per process draws 2n in data order:
process 0 takes the first n, process 1 the next n. Writes OUT/record_<rank>.pt:
the prompt numbers of each rollout's groups (every group's G rows checked to
be one prompt), the optimizer steps taken, the final weights, and the
warnings dynamic sampling gave (a rollout filled at the cap).
"""

import argparse
import os
import re
import sys
import warnings

import torch
from datasets import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_model  # noqa: E402

from fastgrpo import GRPOConfig, GRPOTrainer  # noqa: E402
from fastgrpo.model.loading import load_tokenizer  # noqa: E402

G = 4


def main(output_dir: str, rank0_only: bool) -> None:
    rank = int(os.environ.get("RANK", "0"))

    def reward(completion_ids, n, **kwargs):
        spread = (lambda k: rank == 0) if rank0_only else (lambda k: k % 4 < 2)
        return [float(sum(ids) % 997) if spread(k) else 0.0 for ids, k in zip(completion_ids, n)]

    args = GRPOConfig(
        output_dir=output_dir, seed=0, shuffle_dataset=False, max_steps=3, num_generations=G, generation_batch_size=16,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, max_prompt_length=32, max_completion_length=8,
        learning_rate=1e-3, scale_rewards="batch",  # the batch std: a gather over the kept groups of both processes
        filter_groups=True, max_num_gen_batches=2, logging_steps=1, save_strategy="no", disable_tqdm=True, bf16=False,
    )
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {n}."}], "n": n} for n in range(32)])
    trainer = GRPOTrainer(tiny_model(tokenizer), reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    groups, collect = [], trainer._collect

    def spy():
        rollout = collect()
        numbers = [int(re.search(r"\d+", p[0]["content"]).group()) for p in rollout.prompts]
        assert all(numbers[i : i + G] == [numbers[i]] * G for i in range(0, len(numbers), G)), numbers  # whole groups
        groups.append(numbers[::G])
        return rollout

    trainer._collect = spy
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in caught if "dynamic sampling" in str(w.message)]
    weights = {k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}
    torch.save({"groups": groups, "steps": trainer.state.global_step, "weights": weights, "warnings": said},
               os.path.join(output_dir, f"record_{rank}.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--rank0_only", action="store_true")
    ns = parser.parse_args()
    main(ns.output_dir, ns.rank0_only)
