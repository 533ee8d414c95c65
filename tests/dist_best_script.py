"""Best-model loading, stop strings, args changed on the built trainer and evaluate() after train(), on several processes.

    ACCELERATE_USE_FSDP=true FSDP_VERSION=2 torchrun --nproc_per_node 2 tests/dist_best_script.py OUT

Run by tests/test_fsdp.py. Three steps of 16 sampled completions (the own sampler, `stop_strings` "x" and "z": each
process samples its share and must end its own rows), an eval set of 4 prompts evaluated at every step. The eval
reward has a bonus that depends on the step only (+1000 at step 2, +500 at step 3), so the best checkpoint is checkpoint-2
whatever was sampled; `load_best_model_at_end` must put step 2's weights back on every process (each loads its
shards). eval_steps, save_steps and max_grad_norm are changed on the built trainer (every process runs this script,
so each changes its own args alike). After train(), `trainer.evaluate()` refreshes the sampler's gathered copy (a
collective) from the loaded best weights.

Writes OUT/record_<rank>.pt: this process's rollouts (completion ids, mask, truncation, texts), its whole weights after
each optimizer step and after train(), state.best_model_checkpoint, and the sampler copy's weights after evaluate().
"""

import argparse
import os
import sys

import torch
from datasets import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_model  # noqa: E402

from fastgrpo import GRPOConfig, GRPOTrainer  # noqa: E402
from fastgrpo.model.loading import load_tokenizer  # noqa: E402
from fastgrpo.model.sharding import full_value  # noqa: E402

T = 12  # max completion tokens
STOP_STRINGS = ["x", "z"]  # rare enough in the tiny model's random tokens that some rows run to T
BONUS = {2: 1000.0, 3: 500.0}  # reward bonus per step, far above any length difference: step 2 is the best


def reward(completions, trainer_state, **kwargs):
    """The completion's length in characters, plus the step's bonus (the same for every row of a step)."""
    return [len(c[0]["content"]) + BONUS.get(trainer_state.global_step, 0.0) for c in completions]


def whole_weights(trainer) -> dict:
    """name → the whole tensor (under FSDP an all-gather per parameter: every process calls it)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {name: full_value(p.detach()).cpu().clone() for name, p in model.named_parameters()}


def main(output_dir: str) -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args = GRPOConfig(
        output_dir=output_dir, seed=0, shuffle_dataset=False, max_steps=3, num_generations=4, generation_batch_size=16,
        per_device_train_batch_size=4, gradient_accumulation_steps=4 // world_size, max_prompt_length=64,
        max_completion_length=T, learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, log_completions=True,
        num_completions_to_print=0, disable_tqdm=True, bf16=False, per_device_eval_batch_size=4,
        generation_kwargs={"stop_strings": STOP_STRINGS},
        eval_strategy="steps", eval_steps=100, save_steps=100,  # changed below, on the built trainer
        metric_for_best_model="reward", load_best_model_at_end=True,
    )
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    prompts = [{"prompt": [{"role": "user", "content": f"Count to {n}."}]} for n in range(8)]
    evals = [{"prompt": [{"role": "user", "content": f"Count to {n}."}]} for n in range(100, 104)]
    trainer = GRPOTrainer(tiny_model(tokenizer), reward, args=args, train_dataset=Dataset.from_list(prompts),
                          eval_dataset=Dataset.from_list(evals), processing_class=tokenizer)
    trainer.args.eval_steps = trainer.args.save_steps = 1
    trainer.args.max_grad_norm = 0.5

    rollouts, weights = [], {}
    collect, optimizer_step = trainer._collect, trainer._optimizer_step

    def recording_collect():
        rollout = collect()
        rollouts.append({"ids": rollout.completion_ids.cpu(), "mask": rollout.completion_mask.cpu(),
                         "truncated": rollout.is_truncated.cpu(), "texts": [c[0]["content"] for c in rollout.completions]})
        return rollout

    def recording_optimizer_step(*a, **k):
        kl_old = optimizer_step(*a, **k)
        weights[trainer.step + 1] = whole_weights(trainer)
        return kl_old

    trainer._collect, trainer._optimizer_step = recording_collect, recording_optimizer_step
    trainer.train()
    final = whole_weights(trainer)
    metrics = trainer.evaluate()
    copy = trainer.backend.weight_copy  # FSDP: the sampler's whole copy, refreshed by evaluate()
    sampled = {n: p.detach().cpu().clone() for n, p in copy.module.named_parameters()} if copy is not None else None
    torch.save({"rollouts": rollouts, "weights": weights, "final": final, "best": trainer.state.best_model_checkpoint,
                "eval_reward": metrics["eval_reward"], "sampled": sampled},
               os.path.join(output_dir, f"record_{trainer.accelerator.process_index}.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    main(parser.parse_args().output_dir)
