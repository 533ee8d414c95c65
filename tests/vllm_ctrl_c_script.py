"""A colocated-vLLM run pressed Ctrl-C in a terminal while it samples; run by tests/test_vllm.py in a session of its own.

    python tests/vllm_ctrl_c_script.py MODEL_DIR OUT

A terminal's Ctrl-C is SIGINT to every process of its foreground group: here `os.killpg` of the script's own group,
sent while the third rollout's request is in the engine (max_steps=6, one optimizer step per rollout).
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
    """The engine's own generate; the 5th call (the third rollout's first: each rollout calls it twice, backend.py's
    prefill then the sampling) is sent the terminal's SIGINT first."""
    CALLS[0] += 1
    if CALLS[0] == 5:
        os.killpg(os.getpgrp(), signal.SIGINT)
    return GENERATE(engine, prompts, params)


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    ColocateEngine.generate = generate_with_ctrl_c
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(32)])
    args = GRPOConfig(
        output_dir=out, use_vllm=True, per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=8, max_steps=6, learning_rate=1e-3, logging_steps=1, save_strategy="no", bf16=False,
        disable_tqdm=True, report_to="none", seed=0,
    )
    reward = lambda completion_ids, **kwargs: [len(ids) % 2 for ids in completion_ids]  # noqa: E731
    GRPOTrainer(model_dir, reward, args=args, train_dataset=prompts, processing_class=load_tokenizer(model_dir)).train()


if __name__ == "__main__":
    main()
