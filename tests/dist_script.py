"""A few GRPO steps on the tiny model with fixed completions; run by tests/test_distributed.py.

    python tests/dist_script.py OUT --max_steps 4           # one process
    torchrun --standalone --nproc_per_node 2 tests/dist_script.py OUT --max_steps 3
    accelerate launch --config_file examples/accelerate/ddp.yaml --num_processes 2 tests/dist_script.py OUT --max_steps 4 --resume
    ... --lora                                               # rank-8 adapters, beta 0.04, gradient checkpointing
    ... --beta 0.04 --save_steps 2                           # π_ref a frozen copy; checkpoints at steps 2, 4, …
    ... --main_process_saves                                 # a subclass whose save_model runs on the main process only (not FSDP)
    ACCELERATE_USE_FSDP=true FSDP_VERSION=2 torchrun ...     # FSDP2 (tests/test_fsdp.py)

The global batch is the same on any number of processes (16 completions per
rollout and per optimizer step: 4 prompts × G = 4), so every number the run
produces must not depend on how many processes share it. Completions are not
sampled: `fixed_completions` makes completion j of a group depend only on the
prompt and j, so a 1-process and a 2-process run train on the same tokens and
the comparison tests the distributed maths (dapo's global token count, the
batch reward std, DDP's gradient average, per-process checkpoints), not sampling.

Prompts 4k, 4k+1 get long completions and 4k+2, 4k+3 short ones; without
shuffling, the first two prompts of each rollout go to process 0, so the two
processes hold different token counts (a local dapo normaliser would show).

Writes OUT/record_<rank>.pt: this process's advantages per rollout, its
weights after each optimizer step (name → tensor) and under FSDP the sampler
copy's weights per rollout, besides the trainer's own
metrics.jsonl, completions.jsonl and checkpoint-<step>.
"""

import argparse
import os
import re
import sys

import torch
from datasets import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_model  # noqa: E402

from fastgrpo import GRPOConfig, GRPOTrainer  # noqa: E402
from fastgrpo.model.loading import load_tokenizer, lora_config  # noqa: E402
from fastgrpo.generation.contract import Samples  # noqa: E402
from fastgrpo.model.sharding import full_value  # noqa: E402

G, T = 4, 12  # completions per prompt, max completion tokens


def fixed_completions(tokenizer, eos_token_id: int):
    """A generator (prompt_ids (B, P), prompt_mask (B, P), G) → Samples of (B·G, T) ids whose row i depends only on its prompt and i mod G."""

    def generate(prompt_ids, prompt_mask, num_generations):
        prompt_ids = prompt_ids.repeat_interleave(num_generations, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
        out = torch.full((len(prompt_ids), T), tokenizer.pad_token_id)
        for i, (ids, mask) in enumerate(zip(prompt_ids, prompt_mask)):
            n = int(re.search(r"Count to (\d+)", tokenizer.decode(ids[mask.bool()])).group(1))
            j = i % G  # rows of a group are contiguous, and every process holds whole groups
            length = (8 if n % 4 < 2 else 2) + j  # tokens including EOS: 8–11 or 2–5
            out[i, : length - 1] = 200 + (n * 31 + j * 17 + torch.arange(length - 1) * 7) % 500
            out[i, length - 1] = eos_token_id
        return Samples(out.to(prompt_ids.device), None)  # no sampler log-probs: sampled as by π_old

    return generate


def reward_fixed(completion_ids, **kwargs):
    """Longer is better, plus a token-dependent part: unequal rewards within every group."""
    return [len(ids) + 0.1 * (ids[0] % 5) for ids in completion_ids]


class MainProcessSaves(GRPOTrainer):
    """A subclass whose save_model (each checkpoint's and the final one) saves on the main process alone, and leaves a
    marker there: with Trainer's save_model, which is collective only under FSDP/DeepSpeed, this works under DDP."""

    def save_model(self, output_dir=None, _internal_call=False):
        if self.is_world_process_zero():
            super().save_model(output_dir, _internal_call)
            with open(os.path.join(output_dir or self.args.output_dir, SUBCLASS_MARKER), "w") as f:
                f.write(str(self.state.global_step))


SUBCLASS_MARKER = "saved_by_subclass.txt"


def train(output_dir: str, max_steps: int, resume: bool = False, lora: bool = False, save_steps: int = 1000, beta: float = 0.0,
          main_process_saves: bool = False) -> None:
    """Train to `max_steps` (resuming from the latest checkpoint if asked) and write OUT/record_<rank>[_resumed].pt."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args = GRPOConfig(
        output_dir=output_dir, seed=0, shuffle_dataset=False, max_steps=max_steps,
        num_generations=G, generation_batch_size=16, per_device_train_batch_size=4,
        gradient_accumulation_steps=4 // world_size,  # 16 completions per optimizer step on any world size
        num_iterations=2,  # step 2 of each rollout sees ratio ≠ 1 and π_old captured at step 1
        max_prompt_length=64, max_completion_length=T, learning_rate=1e-3,
        loss_type="dapo", scale_rewards="batch",  # the two quantities that need all processes
        lr_scheduler_type="constant",  # the same learning rate whatever max_steps a run is given
        logging_steps=1, save_steps=save_steps, log_completions=True, num_completions_to_print=0, disable_tqdm=True,
        bf16=False,  # runs on each world size are compared to fp32 tolerances, whatever this CPU's bf16 units
        beta=0.04 if lora else beta,  # π_ref: adapters disabled (LoRA) or a frozen copy, sharded too under FSDP
        gradient_checkpointing=lora,
        update_token_budget=0,  # one pass per micro-batch on any world size (several processes never merge): the same sums
    )
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {n}."}]} for n in range(32)])
    peft_config = lora_config(lora_r=8, lora_alpha=16, lora_target_modules="all-linear") if lora else None
    trainer_class = MainProcessSaves if main_process_saves else GRPOTrainer
    trainer = trainer_class(tiny_model(tokenizer), reward_fixed, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config)
    trainer.backend.sample = fixed_completions(tokenizer, tokenizer.eos_token_id)

    advantages, weights, sampled = [], {}, []
    collect, optimizer_step = trainer._collect, trainer._optimizer_step

    def recording_collect():
        rollout = collect()
        advantages.append(rollout.advantages.cpu().clone())
        if trainer.backend.weight_copy is not None:  # FSDP: the whole weights this rollout was sampled with
            sampled.append({name: p.detach().clone() for name, p in trainer.backend.weight_copy.module.named_parameters()})
        return rollout

    def recording_optimizer_step(*a, **k):
        kl_old = optimizer_step(*a, **k)
        model = trainer.accelerator.unwrap_model(trainer.model)
        # Under FSDP every process gathers each whole parameter (an all-gather, so all processes call it).
        weights[trainer.step + 1] = {name: full_value(p.detach()).cpu().clone() for name, p in model.named_parameters()}
        return kl_old

    trainer._collect, trainer._optimizer_step = recording_collect, recording_optimizer_step
    trainer.train(resume_from_checkpoint=True if resume else None)
    trainer.save_model()  # after train(): the process group must still be up
    rank = trainer.accelerator.process_index
    name = f"record_{rank}{'_resumed' if resume else ''}.pt"
    torch.save({"advantages": advantages, "weights": weights, "sampled": sampled}, os.path.join(output_dir, name))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--save_steps", type=int, default=1000)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--main_process_saves", action="store_true")
    cli = parser.parse_args()
    train(cli.output_dir, cli.max_steps, cli.resume, cli.lora, cli.save_steps, cli.beta, cli.main_process_saves)
