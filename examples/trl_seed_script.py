"""The project's seed script, run on fastgrpo: TRL's GRPO quick-start (its `reward_len`, the `GRPOConfig` /
`GRPOTrainer` calls) with the seed configuration's fields (batch 4 × 4, G = 8, μ = 4, 64-token prompts and completions).

Against that script only the import line differs, and the model and dataset point at local ones (this machine
has no hub access). TRL's own quick-start sets fewer fields; `max_prompt_length` is one TRL 1.16 no longer has
(fastgrpo keeps it: README, "Differences from TRL"). Run it with `python examples/trl_seed_script.py` (about
200 optimizer steps; tests run it with max_steps reduced).
"""

import reasoning_gym
from datasets import Dataset

from fastgrpo import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

# was: dataset = load_dataset("trl-lib/tldr", split="train")
dataset = Dataset.from_list([{"prompt": x["question"]} for x in reasoning_gym.create_dataset("basic_arithmetic", size=400, seed=0)])


def reward_len(completions, **kwargs):
    return [-abs(100 - len(completion)) for completion in completions]


training_args = GRPOConfig(
    output_dir="SmolLM2-135M-GRPO",
    logging_steps=5,
    gradient_accumulation_steps=4,
    per_device_train_batch_size=4,
    num_generations=8,
    max_prompt_length=64,
    max_completion_length=64,
    log_completions=True,
    max_steps=200,
    num_iterations=4,
)
trainer = GRPOTrainer(
    model="smollm2-135m-instruct",  # was: model="Qwen/Qwen2-0.5B-Instruct"
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
