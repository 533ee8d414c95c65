"""Two training processes sharing one vLLM server; run by tests/test_vllm.py under torchrun.

    torchrun --standalone --nproc_per_node 2 tests/vllm_server_script.py MODEL_DIR OUT PORT

Each process samples its own prompts through the server; only process 0 pushes the weights. Writes
OUT/record_<rank>.json: the prompts' first tokens it sampled for, the bytes it pushed, the steps done.
"""

import gc
import glob
import json
import os
import sys

import torch
from datasets import Dataset

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.model.loading import load_tokenizer


def main():
    model_dir, out, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ.get("RANK", "0"))
    tokenizer = load_tokenizer(model_dir)
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i} for i in range(32)])
    seen = []

    def reward(completion_ids, n, **kwargs):
        seen.extend(n)
        return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    args = GRPOConfig(
        output_dir=out, use_vllm=True, vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}", vllm_server_timeout=60,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", bf16=False, disable_tqdm=True, report_to="none",
    )
    trainer = GRPOTrainer(model_dir, reward, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    with open(os.path.join(out, f"record_{rank}.json"), "w") as f:
        json.dump({"prompts": seen, "pushed_bytes": trainer.backend.sync_bytes, "steps": trainer.state.global_step}, f)
    world = torch.distributed.group.WORLD
    trainer.accelerator.end_training()  # the process group unregistered, then freed before exit, as `fastgrpo train` does:
    del trainer  # the DDP wrapper's hold on it first,
    gc.collect()
    del world  # then the last one, which torch drops with the GIL released, so gloo's threads finish and are joined
    threads = [open(path).read().strip() for path in glob.glob("/proc/self/task/*/comm")]  # Linux: each thread's name
    assert not [name for name in threads if "gloo" in name], threads  # joined while Python runs, not in interpreter exit


if __name__ == "__main__":
    main()
