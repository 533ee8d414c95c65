"""fastgrpo vs TRL's GRPOTrainer on identical work, side by side.

    bash benchmarks/run.sh                       # build benchmarks/.venv from nothing, run the default suite
    python benchmarks/run.py                     # the default suite, in an existing environment
    python benchmarks/run.py --cases tiny --steps 8 --pairs 1 --out /tmp/bench

Each case runs both systems on the same model folder, the same prompts in the
same order (no shuffling), the same seed, the same GRPOConfig values and the
same reward function. Runs alternate fastgrpo, TRL, fastgrpo, TRL …, each in
its own process (worker.py), so drift on a shared machine hits both; the
figures are medians and per-pair ratios (report.py). Results:
`<out>/<date>-<case>.json` (every raw run + summary), `.md` (table), `-reward.png`
and `-phases.png`; while a case runs, its runs so far are in `<date>-<case>.json.partial`, so a
failed run leaves an earlier complete result of the same name as it was. Every argument is
checked before the first run.

Not here: the measurements (worker.py) and the figures (report.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

# The seed configuration (issue 4): 4 × 4 = 16 completions per optimizer step,
# G = 8 (2 prompts per rollout), 64-token prompts and completions, length reward.
SEED_CONFIG = {
    "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_generations": 8,
    "max_prompt_length": 64, "max_completion_length": 64, "seed": 42, "beta": 0.0,
}

# Learning rates: TRL's default 1e-6 does not move SmolLM2's reward in 40 steps;
# 2e-5 is the built-in job's value. The tiny random model learns the length reward
# (shorter tokens, earlier EOS) within the budget at 1e-3. Steps are multiples of
# μ × 1 (one optimizer step per rollout at this config), pairs alternate.
CASES = {
    "tiny": {
        "description": "Seed configuration on a tiny random Llama (2 layers, hidden 64, SmolLM2 tokenizer): "
        "framework overhead, and time to reward over many steps.",
        "model": "tiny", "mus": [1, 4], "steps": 12, "pairs": 1, "learning_rate": 1e-3,
    },
    "smollm2": {
        "description": "Seed configuration on the built-in SmolLM2-135M-Instruct: seconds per step, phase split, memory.",
        "model": "smollm2-135m-instruct", "mus": [1, 4], "steps_by_mu": {1: 2, 4: 4}, "pairs": 1, "learning_rate": 2e-5,
    },
    "long": {
        "description": "Long prompts (≈ 256 tokens), completions ≤ 128, G = 8, SmolLM2: where a group's shared prompt "
        "dominates the update's tokens.",
        "model": "smollm2-135m-instruct", "mus": [1], "steps": 1, "pairs": 1, "learning_rate": 2e-5,
        "context_sentences": 5, "max_prompt_length": 320, "max_completion_length": 128,
    },
    "bf16": {
        "description": "Seed configuration on SmolLM2: fastgrpo with bf16 products (and the sampler's bf16 copy) against "
        "fastgrpo fp32 and TRL fp32, with the sampler–trainer mismatch it logs.",
        "model": "smollm2-135m-instruct", "mus": [1], "steps": 2, "pairs": 2, "learning_rate": 3e-5,
        "systems": ("fastgrpo-bf16", "fastgrpo", "trl"),
    },
    "bf16-tiny": {
        "description": "The bf16 case on the tiny random Llama: phase split and the sampler–trainer mismatch, where an "
        "emulated-bf16 CPU can afford it.",
        "model": "tiny", "mus": [1], "steps": 4, "pairs": 2, "learning_rate": 1e-3,
        "systems": ("fastgrpo-bf16", "fastgrpo", "trl"),
    },
    "beta": {
        "description": "beta = 0.04 (π_ref in play: a reference model in memory and a π_ref log-prob pass), tiny model, μ = 1.",
        "model": "tiny", "mus": [1], "steps": 4, "pairs": 1, "learning_rate": 1e-3, "beta": 0.04,
    },
    "lora": {
        "description": "LoRA with TRL ModelConfig's defaults (r 16, α 32, dropout 0.05, q/v projections) in both, SmolLM2, μ = 4; "
        "fastgrpo-full = fastgrpo fine-tuning every weight, alternating in the same pairs.",
        "model": "smollm2-135m-instruct", "mus": [4], "steps": 4, "pairs": 3, "learning_rate": 2e-5,
        "lora": {"lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None},
        "systems": ("fastgrpo", "trl", "fastgrpo-full"),
    },
    "memory": {
        "description": "Seed configuration on SmolLM2, μ = 4, each system at its defaults: fastgrpo (bf16 where the CPU has "
        "bf16 units; one bf16 working copy), fastgrpo with gradient checkpointing, and TRL's defaults (bf16 autocast with "
        "use_cpu, gradient checkpointing): peak RSS and its split, seconds per step; fastgrpo-merged as in case best; "
        "fastgrpo-gc's default update_token_budget is four full-length micro-batches (2048: the whole step in one pass).",
        "model": "smollm2-135m-instruct", "mus": [4], "steps": 4, "pairs": 1, "learning_rate": 2e-5,
        "systems": ("fastgrpo", "fastgrpo-merged", "fastgrpo-gc", "trl"),
        "extras": {"fastgrpo": {"bf16": None}, "fastgrpo-merged": {"bf16": None, "update_token_budget": 4096},
                   "fastgrpo-gc": {"bf16": None, "gradient_checkpointing": True},
                   "trl": {"bf16": True, "gradient_checkpointing": True, "use_cpu": True}},
    },
    "lowest-memory": {
        "description": "Seed configuration on SmolLM2, μ = 4, each system at its lowest memory: fastgrpo with gradient "
        "checkpointing, with freed memory kept (its default, run/allocator.py) and with glibc's defaults "
        "(MALLOC_MMAP_THRESHOLD_=131072 in the worker's environment, which keep_freed_memory yields to), against TRL's "
        "defaults (bf16 autocast with use_cpu, gradient checkpointing): peak RSS and seconds per step and update.",
        "model": "smollm2-135m-instruct", "mus": [4], "steps": 4, "pairs": 2, "learning_rate": 2e-5,
        "systems": ("fastgrpo-gc", "fastgrpo-gc-glibc", "trl"),
        "extras": {"fastgrpo-gc": {"bf16": None, "gradient_checkpointing": True},
                   "fastgrpo-gc-glibc": {"bf16": None, "gradient_checkpointing": True, "env": {"MALLOC_MMAP_THRESHOLD_": "131072"}},
                   "trl": {"bf16": True, "gradient_checkpointing": True, "use_cpu": True}},
    },
    "best": {
        "description": "Seed configuration on SmolLM2, μ = 4, each system at its fastest on this CPU: fastgrpo's defaults "
        "(bf16 where the CPU has bf16 units, one bf16 working copy) against TRL with bf16 autocast (use_cpu) and no "
        "gradient checkpointing: seconds per step and update, the issue-29 ratios (TRL's lowest memory: case memory); "
        "fastgrpo's default update_token_budget, a full-length micro-batch's tokens (4 × (64 + 64) = 512), merges the "
        "step's micro-batches two by two; fastgrpo-merged: all four in one pass (update_token_budget=4096); "
        "fastgrpo-unmerged: one pass per micro-batch (update_token_budget=0, the default before session 11).",
        "model": "smollm2-135m-instruct", "mus": [4], "steps": 4, "pairs": 2, "learning_rate": 2e-5,
        "systems": ("fastgrpo", "fastgrpo-merged", "fastgrpo-unmerged", "trl"),
        "extras": {"fastgrpo": {"bf16": None}, "fastgrpo-merged": {"bf16": None, "update_token_budget": 4096},
                   "fastgrpo-unmerged": {"bf16": None, "update_token_budget": 0},
                   "trl": {"bf16": True, "use_cpu": True, "gradient_checkpointing": False}},
    },
}
DEFAULT_SUITE = ["smollm2", "tiny", "beta"]


def tiny_model_path() -> str:
    """A tiny random-weight Llama with SmolLM2's tokenizer, built once from a config and saved (fp32 safetensors)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from fastgrpo.model.loading import cache_dir, resolve_model_path

    target = os.path.join(cache_dir(), "bench-tiny-llama")
    if os.path.exists(os.path.join(target, "config.json")):
        return target
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_dir())
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def model_path(name: str) -> str:
    from fastgrpo.model.loading import resolve_model_path

    return tiny_model_path() if name == "tiny" else resolve_model_path(name)


def versions() -> dict:
    from importlib.metadata import version

    out = {name: version(name) for name in ("fastgrpo", "trl", "transformers", "torch", "accelerate")}
    out["python"] = platform.python_version()
    out["cpu"] = platform.processor() or platform.machine()
    out["cores"] = os.cpu_count()
    git = lambda *a: subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True).stdout.strip()  # noqa: E731
    out["fastgrpo_commit"] = git("rev-parse", "--short", "HEAD") + (" (+ uncommitted changes)" if git("status", "--porcelain", "--", "../src") else "")
    return out


def run_worker(script: str, spec: dict) -> tuple[dict, float]:
    """Run `benchmarks/<script> SPEC.json OUT.json` in its own process with `spec["threads"]` torch threads.

    `spec["env"]` (optional): environment variables set for that process alone (e.g. glibc's malloc knobs).

    Returns its JSON result and the process's wall-clock seconds. Raises
    RuntimeError with the end of the worker's stderr if it fails.
    """
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.join(HERE, script), spec_path, out_path], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false", **spec.get("env", {})})
        if proc.returncode != 0:
            raise RuntimeError(f"{script} failed ({proc.returncode}) on {spec.get('name') or spec['system']}:\n{proc.stderr[-4000:]}")
        with open(out_path) as f:
            return json.load(f), time.perf_counter() - start


def run_one(spec: dict, log) -> dict:
    """One worker process; returns its raw result."""
    result, seconds = run_worker("worker.py", spec)
    log(f"  {spec['system']:8s} μ={spec['num_iterations']} steps={spec['steps']}: {seconds:6.1f} s "
        f"(train {result['train_seconds']:.1f} s, peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB)")
    return result


def run_case(name: str, case: dict, out_dir: str, date: str, threads: int, steps: int | None, pairs: int | None, log) -> str:
    """Alternate fastgrpo and TRL runs for every μ and pair; write the case JSON, table and plots."""
    path = os.path.join(out_dir, f"{date}-{name}.json")
    base = {
        **SEED_CONFIG, "model_path": model_path(case["model"]), "model": case["model"], "threads": threads,
        "learning_rate": case["learning_rate"], "beta": case.get("beta", 0.0), "lora": case.get("lora"),
        "context_sentences": case.get("context_sentences", 0),
        **{k: case[k] for k in ("max_prompt_length", "max_completion_length") if k in case},
    }
    base["steps_per_generation"] = base["gradient_accumulation_steps"]  # generation_batch_size default: one step's worth
    record = {"case": name, "description": case["description"], "date": date, "versions": versions(), "config": base, "runs": []}
    partial = path + ".partial"  # the runs so far: an earlier complete result at `path` stays until this case completes
    pair_count = pairs or case["pairs"]
    log(f"case {name}: {case['model']}, μ {case['mus']}, {pair_count} pair(s)")
    for _ in range(pair_count):
        for mu in case["mus"]:
            n = steps or case.get("steps_by_mu", {}).get(mu) or case["steps"]
            n = max(mu, n - n % mu)  # whole rollouts only
            spec = {**base, "num_iterations": mu, "steps": n, "num_prompts": 2 * n + 64}
            for system in case.get("systems", ("fastgrpo", "trl")):
                full = system == "fastgrpo-full"  # every weight trains: the LoRA case's own baseline
                extra = {"lora": None} if full else {"bf16": True} if system == "fastgrpo-bf16" else {}
                extra = case.get("extras", {}).get(system, extra)
                record["runs"].append(run_one({**spec, "system": system, **extra}, log))
                with open(partial, "w") as f:  # keep what is done if a later run fails
                    json.dump(record, f)
    os.replace(partial, path)
    report.render(path)
    return path


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (0 would silently mean the case's default, a negative count nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def writable_folder(text: str) -> str:
    """argparse type: a folder results can be written to, created if missing (found out before the first run, not after the last)."""
    try:
        os.makedirs(text, exist_ok=True)
        with tempfile.TemporaryFile(dir=text):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: not a writable folder ({err.strerror or err})") from None
    return text


def check_args(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
    """Every argument checked before the first run (a suite runs for hours); → the case names. Exits via parser.error."""
    names = [n.strip() for n in ns.cases.split(",")]
    if unknown := [n for n in names if n not in CASES]:
        parser.error(f"--cases: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(CASES)}")
    if ns.mus is not None:
        try:
            ns.mus = [positive_int(m) for m in ns.mus.split(",")]
        except argparse.ArgumentTypeError as err:
            parser.error(f"--mus {ns.mus!r}: {err} for each μ, comma-separated (e.g. 1,4)")
    if not ns.date or not all(c.isalnum() or c in "-_." for c in ns.date):
        parser.error(f"--date {ns.date!r}: results are named <date>-<case>.json; use letters, digits, '-', '_' or '.'")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_SUITE), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--steps", type=positive_int, help="optimizer steps per run (default: each case's)")
    parser.add_argument("--pairs", type=positive_int, help="fastgrpo/TRL pairs per μ (default: each case's)")
    parser.add_argument("--mus", help="comma-separated μ values (default: each case's)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per run (and for the matmul peak)")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="the results' name prefix (default: today)")
    ns = parser.parse_args(argv)
    names = check_args(parser, ns)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    for name in names:
        case = {**CASES[name], **({"mus": ns.mus} if ns.mus else {})}
        path = run_case(name, case, ns.out, ns.date, ns.threads, ns.steps, ns.pairs, log)
        with open(path[: -len(".json")] + ".md") as f:
            log(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
