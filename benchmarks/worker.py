"""One benchmark run: one system (fastgrpo or TRL) on one configuration, alone in its process.

    python benchmarks/worker.py SPEC.json OUT.json      (run.py writes SPEC and reads OUT)

It measures this machine's dense matmul peak, builds the prompts, trains, and
writes every raw measurement: per-step end times, per-rollout rewards and
token counts, the time spent in each phase, every log-prob pass (with or
without gradient), the process's kernel CPU seconds and minor page faults at
each step end (`kernel_usage`: first touches of memory), and the peak resident
memory of the whole process, split into weights, gradients, optimizer state,
runtime and the rest (`memory_split`).

Both systems get the same instrumentation from outside their code:

| phase      | fastgrpo                                  | TRL                                                  |
| ---------- | ----------------------------------------- | ---------------------------------------------------- |
| rollout    | `GRPOTrainer._collect`                    | `GRPOTrainer._generate_and_score_completions`        |
| logps      | `_logps` calls without gradient (π_old, π_ref) | `_get_per_token_logps_and_entropies` without gradient |
| update     | `_optimizer_step` (fwd, bwd, clip, AdamW) | `training_step` less the rollout inside it, `_clip_grad_norm`, and `optimizer.step` (callbacks) |
| step end   | entry of `_after_step`                    | `on_step_end` callback                               |

generation = rollout − logps (prompt encoding, sampling, decoding, rewards,
advantages). Checkpoints are off in both (`save_strategy="no"`), so no run
times a disk write. This file imports `trl` only in a
TRL run, so a fastgrpo process carries none of TRL's memory.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from contextlib import contextmanager

import torch

SYSTEM_PROMPT = "You are a helpful assistant."
TOPICS = (
    "the ocean", "a mountain", "coffee", "a library", "the moon", "winter", "a bicycle", "bread", "a river",
    "the desert", "a violin", "rain", "a garden", "trains", "a lighthouse", "chess", "honey", "a forest",
    "the wind", "a market", "clouds", "a candle", "bees", "a bridge", "snow", "a museum", "tea", "a volcano",
    "the stars", "a harbour", "maps", "a clock", "owls", "a city at night", "glass", "a festival",
)
TEMPLATES = (
    "Write a short note about {}.", "Describe {} to a child.", "Give one fact about {}.",
    "Why do people like {}?", "Write a haiku about {}.", "Explain {} in plain words.",
    "What is special about {}?", "Tell a tiny story about {}.",
)


CONTEXT = (
    "Background notes. {} has been described by writers, travellers and scientists for centuries, and each of them saw "
    "something different in it: a shape, a sound, a use, a memory. Some wrote long essays, others a single line. "
)


def prompts(count: int, context_sentences: int = 0) -> list[list[dict]]:
    """`count` chat prompts, the same list in the same order in every run (no randomness).

    `context_sentences` > 0 puts that many copies of a background paragraph (≈ 45
    tokens each) before the question: the long-prompt case, where a group's shared
    prompt dominates the tokens.
    """
    rows = [(t, f.format(t)) for f in TEMPLATES for t in TOPICS]
    rows = (rows * (count // len(rows) + 1))[:count]
    return [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": CONTEXT.format(t.capitalize()) * context_sentences + r}]
        for t, r in rows
    ]


def completion_text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def reward_len(completions, **kwargs) -> list[float]:
    """−|100 − characters|: the TRL quick-start length reward (the seed's reward)."""
    return [-abs(100 - len(completion_text(c))) for c in completions]


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 6) -> float:
    """Best FLOP/s of an (n × n) @ (n × n) `torch.matmul` at the current thread count."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def kernel_usage() -> tuple[float, int]:
    """(kernel-mode CPU seconds, minor page faults) of this process so far (`getrusage`).

    A first touch of memory is a minor fault: the kernel finds and zeroes a page (in a VM whose host reclaims
    freed guest memory, the host backs it too), and its time is kernel time, not the step's own compute.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_stime, usage.ru_minflt


class Recorder:
    """Timestamps (seconds since `start()`) of phases, steps, rollouts and log-prob passes."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.phases: list[tuple[str, float, float]] = []  # (phase, start, end)
        self.step_ends: list[float] = []
        self.kernel: list[tuple[float, int]] = []  # at start() and each step end: the process's kernel CPU seconds, minor page faults
        self.rollouts: list[dict] = []  # one per reward call: time, rewards, completion tokens
        self.passes: list[dict] = []  # one per log-prob forward: grad, tokens, seconds
        self.patches: list[str] = []  # corrections applied to a system so both do the same work

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.kernel = [kernel_usage()]

    def step_end(self) -> None:
        """An optimizer step ended: its end time and the kernel's share of it so far."""
        self.step_ends.append(self.now())
        self.kernel.append(kernel_usage())

    def now(self) -> float:
        return time.perf_counter() - self.t0

    @contextmanager
    def phase(self, name: str):
        start = self.now()
        try:
            yield
        finally:
            self.phases.append((name, start, self.now()))

    def seconds(self, name: str) -> float:
        return sum(end - start for phase, start, end in self.phases if phase == name)

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        return wrapper

    def reward(self, fn):
        """The reward function, recording each call's rewards and completion token counts."""

        def wrapper(prompts=None, completions=None, completion_ids=None, **kwargs):
            values = fn(completions=completions, **kwargs)
            self.rollouts.append(
                {"time": self.now(), "rewards": [float(v) for v in values], "completion_tokens": [len(ids) for ids in completion_ids]}
            )
            return values

        wrapper.__name__ = fn.__name__
        return wrapper

    def log_pass(self, grad: bool, tokens: int, logit_tokens: int, start: float, padded_tokens: int | None = None) -> None:
        """`tokens`: non-pad tokens the forward computed; `padded_tokens`: B × (P + T) of the padded batch."""
        self.passes.append(
            {"grad": grad, "tokens": tokens, "logit_tokens": logit_tokens, "padded_tokens": padded_tokens, "start": start, "end": self.now()}
        )


def config_values(spec: dict, output_dir: str) -> dict:
    """The GRPOConfig fields both systems receive (TRL names; identical values)."""
    return {
        "output_dir": output_dir, "seed": spec["seed"], "max_steps": spec["steps"], "shuffle_dataset": False,
        "learning_rate": spec["learning_rate"], "lr_scheduler_type": "constant", "warmup_steps": 0,
        "weight_decay": 0.0, "max_grad_norm": 1.0,
        "per_device_train_batch_size": spec["per_device_train_batch_size"],
        "gradient_accumulation_steps": spec["gradient_accumulation_steps"],
        "num_generations": spec["num_generations"], "num_iterations": spec["num_iterations"],
        "max_completion_length": spec["max_completion_length"], "temperature": 1.0, "top_p": 1.0, "top_k": 0,
        "beta": spec["beta"], "epsilon": 0.2, "loss_type": "dapo", "scale_rewards": "group",
        # TRL defaults to bf16 autocast and gradient checkpointing; fastgrpo to bf16 where the CPU has bf16 units. Same
        # work: both off, unless the case says otherwise per system (run.py's "extras"; None: fastgrpo's default).
        "bf16": spec.get("bf16", False), "gradient_checkpointing": spec.get("gradient_checkpointing", False), "disable_dropout": True,
        "logging_steps": 10, "report_to": "none", "disable_tqdm": True, "log_completions": False,
    }


def token_count(mask: torch.Tensor) -> int:
    return int(mask.sum())


def peft_config(spec: dict):
    """The same `peft.LoraConfig` for both systems (fastgrpo's `lora_config`, TRL ModelConfig's names), or None."""
    if spec.get("lora") is None:
        return None
    from fastgrpo.model.loading import lora_config

    return lora_config(**spec["lora"])


def run_fastgrpo(spec: dict, dataset, reward, rec: Recorder, output_dir: str):
    from transformers import TrainerCallback

    from fastgrpo import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**config_values(spec, output_dir), max_prompt_length=spec["max_prompt_length"], save_strategy="no",
                      update_token_budget=spec.get("update_token_budget"))  # fastgrpo only (run.py's "extras")
    trainer = GRPOTrainer(model=spec["model_path"], reward_funcs=reward, args=args, train_dataset=dataset, peft_config=peft_config(spec))

    logps = trainer.log_probs  # the passes' public seam: both holders of the LogProbs pass (update/passes.py, update/step.py)

    def timed_logps(model, mb, *ref_model):
        start, grad = rec.now(), torch.is_grad_enabled()
        out = logps(model, mb, *ref_model)
        # Tokens the packed row computed (pads removed, a group's prompt once): the FLOPs really spent.
        rec.log_pass(grad, out.packed_tokens, token_count(mb.completion_mask), start, out.padded_tokens)
        return out

    trainer.passes.log_probs = trainer.update.log_probs = timed_logps

    def phase_ended(phase, start, end):  # the trainer's PhaseTimer (run/metrics.py): every phase but update is the rollout's
        rec.phases.append(("update" if phase == "update" else "rollout", start - rec.t0, end - rec.t0))

    trainer.timer.listen(phase_ended)

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            rec.step_end()

    trainer.add_callback(StepEnds())
    model = trainer.accelerator.unwrap_model(trainer.model)
    return trainer, model


def run_trl(spec: dict, dataset, reward, rec: Recorder, output_dir: str):
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**config_values(spec, output_dir), save_strategy="no", use_cpu=spec.get("use_cpu", False))  # bf16 on a CPU: use_cpu
    trainer = GRPOTrainer(model=spec["model_path"], reward_funcs=reward, args=args, train_dataset=dataset, peft_config=peft_config(spec))

    logps = trainer._get_per_token_logps_and_entropies

    def timed_logps(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        start, grad = rec.now(), torch.is_grad_enabled()
        out = logps(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        rec.log_pass(grad, token_count(attention_mask), token_count(attention_mask[:, -logits_to_keep:]), start, attention_mask.numel())
        return out

    training_step = trainer.training_step

    def timed_training_step(*args, **kwargs):
        start, rollout_before = rec.now(), rec.seconds("rollout")
        out = training_step(*args, **kwargs)
        rollout_inside = rec.seconds("rollout") - rollout_before
        rec.phases.append(("update", start, rec.now() - rollout_inside))  # the update's own seconds
        return out

    class Marks(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.start = rec.now()

        def on_optimizer_step(self, args, state, control, **kwargs):
            rec.phases.append(("update", self.start, rec.now()))

        def on_step_end(self, args, state, control, **kwargs):
            rec.step_end()

    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer._generate_and_score_completions = rec.timed("rollout", trainer._generate_and_score_completions)
    trainer.training_step = timed_training_step
    trainer._clip_grad_norm = rec.timed("update", trainer._clip_grad_norm)
    trainer.add_callback(Marks())
    return trainer, trainer.model


def model_counts(model) -> dict:
    """Parameters for the FLOP count: the LM head's matmul is paid only on the completion tokens."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    body = total - embedding - (0 if tied else head.numel())  # params every token's forward multiplies by
    return {"parameters": total, "body_parameters": body, "head_parameters": head.numel()}


def rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_split(model, optimizer, peak_rss: int, runtime_rss: int) -> dict:
    """Peak RSS split into weights, gradients, optimizer state, runtime and activations (the rest), in bytes.

    weights: every parameter and buffer; gradients: one per trainable parameter
    (both systems hold them all at the optimizer step); optimizer state: AdamW's
    moments as allocated; runtime: RSS after the imports, before any model;
    activations: peak − the four, i.e. autograd's saved tensors, logits and
    temporaries at the worst moment, plus generation's KV cache and allocator slack.
    """
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    weights = sum(size(p) for p in model.parameters()) + sum(size(b) for b in model.buffers())
    gradients = sum(size(p) for p in model.parameters() if p.requires_grad)
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
    state = sum(size(v) for s in inner.state.values() for v in s.values() if torch.is_tensor(v))
    parts = {"weights": weights, "gradients": gradients, "optimizer_state": state, "runtime": runtime_rss}
    return {**parts, "activations_and_rest": peak_rss - sum(parts.values()), "peak": peak_rss}


def linear_peak(dtype: torch.dtype, n: int = 1024, repeats: int = 4) -> float:
    """Best FLOP/s of `F.linear(a, w)` = a @ wᵀ, (n × n) each, nn.Linear's layout, at the current thread count."""
    a, w = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.nn.functional.linear(a, w)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(a, w)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def sampling_metrics(output_dir: str) -> list[dict]:
    """fastgrpo's logged `sampling/*` records (the sampler–trainer mismatch), one per logging window; [] for TRL."""
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        records = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k.startswith("sampling/")} for r in records if any(k.startswith("sampling/") for k in r)]


def main(spec_path: str, out_path: str) -> None:
    import_start = time.perf_counter()
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    peak = matmul_peak()
    linear_peaks = {"fp32": linear_peak(torch.float32), "bf16": linear_peak(torch.bfloat16)}  # this run's bf16 limit too
    from datasets import Dataset
    from transformers import AutoTokenizer

    runtime_rss = rss_bytes()

    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    rows = prompts(spec["num_prompts"], spec.get("context_sentences", 0))
    prompt_tokens = [len(tokenizer.apply_chat_template(r, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]) for r in rows]
    if max(prompt_tokens) > spec["max_prompt_length"]:
        raise ValueError(f"a prompt has {max(prompt_tokens)} tokens > max_prompt_length; TRL would not truncate it, fastgrpo would")
    dataset = Dataset.from_list([{"prompt": r} for r in rows])
    rec = Recorder()
    reward = rec.reward(reward_len)
    output_dir = tempfile.mkdtemp(prefix=f"bench-{spec['system']}-")
    build = run_trl if spec["system"] == "trl" else run_fastgrpo  # "fastgrpo-full": the LoRA case's full fine-tune
    setup_start = time.perf_counter()
    trainer, model = build(spec, dataset, reward, rec, output_dir)
    setup_seconds = time.perf_counter() - setup_start
    rec.start()
    trainer.train()
    train_seconds = rec.now()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    memory = memory_split(model, trainer.optimizer, peak_rss, runtime_rss)
    peak_after = matmul_peak()
    result = {
        "system": spec["system"], "spec": spec, "threads": torch.get_num_threads(),
        "matmul_peak_flops": max(peak, peak_after), "matmul_peak_before_after": [peak, peak_after], "linear_peak_flops": linear_peaks,
        "sampling_metrics": sampling_metrics(output_dir),
        "setup_seconds": setup_seconds, "import_and_setup_seconds": time.perf_counter() - import_start - train_seconds,
        "train_seconds": train_seconds, "steps_done": len(rec.step_ends),
        "peak_rss_bytes": peak_rss, "memory_split_bytes": memory,
        "prompt_tokens_by_row": prompt_tokens, **model_counts(model),
        "step_ends": rec.step_ends, "kernel_at_step_ends": rec.kernel, "rollouts": rec.rollouts, "passes": rec.passes,
        "phases": [list(p) for p in rec.phases], "patches": rec.patches,
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1], sys.argv[2])
