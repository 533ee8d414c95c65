"""A colocated-vLLM run that learns, pressed Ctrl-C in a terminal while it samples; run by tests/test_vllm.py in a
session of its own.

    python tests/vllm_ctrl_c_script.py MODEL_DIR OUT

The suite's learning settings for vLLM (test_vllm.LEARNING: 24 steps, one rollout per 4 optimizer steps, the even-token
reward). A terminal's Ctrl-C is SIGINT to every process of its foreground group: here `os.killpg` of the script's own
group, sent while the sixth and last rollout's request is in the engine, after five rollouts (20 steps): the run stops
at the end of step 21, the first trained on it, and saves it.
"""

import os
import signal
import sys

from datasets import Dataset

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.generation.vllm.colocate import ColocateEngine
from fastgrpo.model.loading import load_tokenizer

CALLS = [0]
GENERATE = ColocateEngine.generate


def generate_with_ctrl_c(engine, prompts, params):
    """The engine's own generate; the 11th call (the sixth rollout's first: each rollout calls it twice, backend.py's
    prefill then the sampling) is sent the terminal's SIGINT first."""
    CALLS[0] += 1
    if CALLS[0] == 11:
        os.killpg(os.getpgrp(), signal.SIGINT)
    return GENERATE(engine, prompts, params)


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    ColocateEngine.generate = generate_with_ctrl_c
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(32)])
    args = GRPOConfig(
        output_dir=out, use_vllm=True, per_device_train_batch_size=8, num_generations=8, max_prompt_length=32,
        max_completion_length=8, num_iterations=2, steps_per_generation=2, max_steps=24, learning_rate=3e-3, top_k=20,
        logging_steps=4, save_strategy="no", bf16=False, disable_tqdm=True, report_to="none", seed=0,
    )
    GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=load_tokenizer(model_dir)).train()


if __name__ == "__main__":
    main()
