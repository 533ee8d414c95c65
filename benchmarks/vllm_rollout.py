"""Seconds per rollout on the built-in job: fastgrpo's own sampler against vLLM (colocate and server), side by side.

    python benchmarks/vllm_rollout.py                       # 3 rounds × 3 systems, 8 steps each (≈ 10 min here)
    python benchmarks/vllm_rollout.py --rounds 1 --steps 4  # a quick look

Each run is `fastgrpo train` (the built-in job: SmolLM2-135M-Instruct, one-digit addition, G = 8, 16
completions per rollout, 32 tokens) in its own process, with `--max_steps` STEPS, checkpoints off, one
record per step. Systems alternate within every round, so drift on a shared machine hits all alike; the
server (`fastgrpo vllm-serve`, started once) idles while the others run. From each run's metrics.jsonl, the
rollouts after the first (the first is warm-up: vLLM's first generate compiles its kernels):

- sampling: `seconds/generate` (prompt encoding, sampling, decoding) per rollout;
- weight sync: `seconds/weight_sync` per rollout (vLLM: safetensors in /dev/shm + `reload_weights`;
  the own sampler: its bf16 copy's refresh);
- rollout: weight_sync + generate + score + old_logps + ref_logps per rollout; step: the update too.

Writes benchmarks/results/<date>-vllm-rollout.{json,md}: medians over rounds, and each system's ratio to
the own sampler. Needs vLLM (`make vllm`). Every argument is checked before the server starts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import positive_int, writable_folder  # noqa: E402

SYSTEMS = {
    "fastgrpo sampler": [],
    "vLLM colocate": ["--use_vllm", "true"],
    "vLLM server": ["--use_vllm", "true", "--vllm_mode", "server"],
}
PHASES = ("weight_sync", "generate", "score", "old_logps", "ref_logps")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, core: int | None = None) -> subprocess.Popen:
    """`fastgrpo vllm-serve` for the built-in model (bf16), up once /health answers; `core` given, pinned to that core
    (taskset, and vLLM's own thread binding `VLLM_CPU_OMP_THREADS_BIND`)."""
    pin = [] if core is None else ["taskset", "-c", str(core)]
    env = {**os.environ} if core is None else {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = tempfile.TemporaryFile()  # its stderr, read back only if it dies (a pipe nobody reads would fill and stop it)
    server = subprocess.Popen(
        [*pin, sys.executable, "-m", "fastgrpo.cli", "vllm-serve", "--model", "smollm2-135m-instruct", "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "bfloat16", "--max_model_len", "1024"],
        stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, env=env)
    for _ in range(300):
        if server.poll() is not None:  # it died: say so now, with its last words, rather than wait out the 300 s
            log.seek(0)
            raise RuntimeError(f"fastgrpo vllm-serve exited ({server.returncode}) before it answered:\n{log.read()[-3000:].decode(errors='replace')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            time.sleep(1)
    raise RuntimeError("fastgrpo vllm-serve did not come up within 300 s")


def one_run(flags: list[str], steps: int) -> dict:
    """`fastgrpo train` with `flags`; → seconds per rollout by phase (rollouts after the first), and the process's wall time."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fastgrpo.cli", "train", "--max_steps", str(steps), "--logging_steps", "1",
                               "--save_strategy", "no", "--output_dir", out, "--disable_tqdm", "true", *flags],
                              capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"fastgrpo train {' '.join(flags)} failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"seconds/generate"' in line]
    rollouts = [r for r in records if r["seconds/generate"] > 0][1:]  # a record per step; a rollout's phases land on its first step
    per = {p: statistics.mean(r[f"seconds/{p}"] for r in rollouts) for p in PHASES}
    per["rollout"] = sum(per[p] for p in PHASES)
    per["update_per_step"] = statistics.mean(r["seconds/update"] for r in records[1:])
    per["reward"] = statistics.mean(r["reward"] for r in records if "reward" in r)
    per["wall"] = wall
    return per


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run, 3 or more (the built-in job: 2 per rollout)")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    ns = parser.parse_args(argv)
    if ns.steps < 3:
        parser.error(f"--steps {ns.steps}: give 3 or more (2 steps per rollout, and the first rollout is warm-up: none would be measured)")
    if importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed (make vllm): fastgrpo vllm-serve cannot start")
    import torch

    caps = torch.cpu.get_capabilities()
    port = free_port()
    server = start_server(port)
    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    try:
        for r in range(ns.rounds):
            for name, flags in SYSTEMS.items():
                flags = flags + (["--vllm_server_base_url", f"http://127.0.0.1:{port}"] if "server" in name else [])
                runs[name].append(one_run(flags, ns.steps))
                row = runs[name][-1]
                print(f"round {r + 1} {name:18s} sampling {row['generate']:.2f} s  sync {row['weight_sync']:.3f} s  "
                      f"rollout {row['rollout']:.2f} s  update/step {row['update_per_step']:.2f} s  wall {row['wall']:.0f} s", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its engine processes
    keys = ("generate", "weight_sync", "rollout", "update_per_step", "wall")
    med = {name: {k: statistics.median(x[k] for x in rows) for k in keys} for name, rows in runs.items()}
    base = med["fastgrpo sampler"]
    lines = [f"CPU: {caps.get('cpu_name')}, avx512_bf16 {caps.get('avx512_bf16')}, amx_bf16 {caps.get('amx_bf16')}; "
             f"{ns.rounds} rounds × {ns.steps} steps, medians; `python benchmarks/vllm_rollout.py --rounds {ns.rounds} --steps {ns.steps}`", "",
             "| system | sampling s/rollout | × sampler | weight sync s/rollout | sync share of rollout | rollout s | × sampler | update s/step | process wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['generate']:.2f} | {m['generate'] / base['generate']:.2f} | {m['weight_sync']:.3f} | "
                     f"{m['weight_sync'] / m['rollout']:.1%} | {m['rollout']:.2f} | {m['rollout'] / base['rollout']:.2f} | "
                     f"{m['update_per_step']:.2f} | {m['wall']:.0f} |")
    stem = os.path.join(ns.out, f"{datetime.date.today().isoformat()}-vllm-rollout")
    with open(stem + ".json", "w") as f:
        json.dump({"caps": {k: caps.get(k) for k in ("cpu_name", "avx512_bf16", "amx_bf16")}, "runs": runs, "medians": med}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
