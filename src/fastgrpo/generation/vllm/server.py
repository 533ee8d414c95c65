"""A vLLM server as the engine (TRL's vllm_mode="server"): `fastgrpo vllm-serve` started by the user, the trainer its client.

Requests are vLLM's OpenAI-compatible `/v1/completions` with token-id prompts, `n` = G and vLLM's extra
sampling fields (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `return_token_ids`), as TRL's
`VLLMClient.generate` sends them. Weights, once per rollout, pushed by the main training process only
(a shared server holds one model for every process):

- on CPU, through a folder in shared memory (weights.WeightsFolder) and the dev-mode `/collective_rpc`
  `reload_weights`: the server must run on the trainer's machine;
- on CUDA, as TRL's client does, over vLLM's NCCL weight-transfer engine (`/init_weight_transfer_engine`,
  `/start_weight_update`, `/update_weights`, `/finish_weight_update`): not run on this project's CPU machines.

Then `/reset_prefix_cache`. Every failure (no server, a server that dies, one that serves another model or was
started without its dev endpoints) is an `EngineError` naming the URL and the fix.

Not here: the server command (serve.py), the sampling settings (backend.py).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch

from ..contract import EngineError
from .engines import Completion, PushSeconds
from .weights import WeightsFolder


def start_command(model: str, url: str) -> str:
    """The `fastgrpo vllm-serve` command serving `model` where `url` points: its host and port (80, or 443 for https,
    when the URL names none), so the fix an error gives reaches the server the run asks for."""
    parts = urllib.parse.urlsplit(url)
    return f"fastgrpo vllm-serve --model {model} --host {parts.hostname} --port {parts.port or (443 if parts.scheme == 'https' else 80)}"


def base_url(args) -> str:
    """The server's URL from TRL's fields: `vllm_server_base_url` (http when it names no scheme, as TRL's client reads
    `127.0.0.1:8000`), else http://{vllm_server_host}:{vllm_server_port}."""
    if args.vllm_server_base_url:
        url = args.vllm_server_base_url.rstrip("/")
        return url if "://" in url else "http://" + url
    host = "127.0.0.1" if args.vllm_server_host == "0.0.0.0" else args.vllm_server_host  # TRL's default host is the listen-all address
    return f"http://{host}:{args.vllm_server_port}"


class ServerEngine:
    """A running vLLM server (started by `fastgrpo vllm-serve`), checked once at start-up.

    Args:
        url: the server's base URL.
        model: the model name the trainer trains (the server must serve this one).
        aliases: other spellings of the same model (its resolved folder) the server may report.
        timeout: seconds to wait for the server at start-up, and for each request to answer.
        pushes_weights: this process sends the weights (the main training process); the others wait for it.
        dtype: the dtype the weights are sent in (the policy's sampling precision).
        group_port: the NCCL weight-transfer group's port (CUDA only; TRL's vllm_group_port).
    Raises:
        EngineError: no answer within `timeout` seconds; the server serves another model; it was started
            without its dev endpoints (VLLM_SERVER_DEV_MODE=1, which `fastgrpo vllm-serve` sets).
    """

    def __init__(self, url: str, model: str, *, aliases: tuple[str, ...] = (), timeout: float, pushes_weights: bool,
                 dtype: torch.dtype = torch.bfloat16, group_port: int = 51216):
        self.url, self.timeout, self.pushes_weights, self.group_port = url, timeout, pushes_weights, group_port
        self.description, self.started, self.model = f"the vLLM server at {url}", False, model  # model: the served name, once read
        self.wait_until_up(model)
        models = self.request("GET", "/v1/models").get("data")
        if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise EngineError(f"{self.description} answered GET /v1/models without a served model ({str(models)[:200]}); is it a vLLM "
                              f"server? Start one with `{start_command(model, self.url)}`.")
        served, folder = models[0]["id"], served_folder(models[0].get("root"))  # root: the folder vLLM loaded
        if not names_the_model(served, (model, *aliases), folder):
            raise EngineError(f"{self.description} serves {served!r}{f' (the folder {folder})' if folder else ''}, not the model being "
                              f"trained ({model!r}); start one for it: `{start_command(model, self.url)}`.")
        self.model = served
        info = self.request("GET", "/server_info?config_format=json", missing="its dev endpoints are off")
        config = info.get("vllm_config") if isinstance(info.get("vllm_config"), dict) else {}  # vLLM 0.32: {"vllm_config": {…}, "vllm_env": …}
        model_config = config.get("model_config") if isinstance(config.get("model_config"), dict) else {}
        self.max_model_len, self.logprobs_mode = model_config.get("max_model_len"), model_config.get("logprobs_mode")
        self.nccl = torch.cuda.is_available() and bool(config.get("weight_transfer_config"))
        self.communicator, self.folder = None, WeightsFolder(dtype) if pushes_weights and not self.nccl else None
        self.started = True  # from here on a failure may come after checkpoints were saved

    def check_logprobs(self, temperature: float, uses_logprobs: bool) -> None:
        """Refuse a server whose log-probs are not those of the distribution it samples, where the run uses them.

        TRL 1.16's GRPOTrainer reads the same setting and warns; fastgrpo refuses, as it also takes them as π_old (μ = 1).

        Args:
            temperature: the run's sampling temperature.
            uses_logprobs: the backend keeps the server's log-probs as the sampler's (`VLLMGenerator.owns_weights`).
        Raises:
            EngineError: the server's `logprobs_mode` is not `processed_logprobs` (vLLM's default, `raw_logprobs`, is
                log softmax(logits), without the temperature) and the temperature is not 1; naming the mode and the fix.
                A server whose /server_info does not report it is not checked.
        """
        exact = self.logprobs_mode == "processed_logprobs" or (self.logprobs_mode == "raw_logprobs" and temperature == 1.0)
        if uses_logprobs and self.logprobs_mode is not None and not exact:
            raise EngineError(
                f"{self.description} returns log-probs with logprobs_mode={self.logprobs_mode!r}, not those of the distribution "
                f"it samples at temperature={temperature:g}, which fastgrpo takes as π_old and for the sampler–trainer correction; "
                f"restart it with `{start_command(self.model, self.url)}` (or add `--logprobs-mode processed_logprobs` to `vllm serve`)."
            )

    def wait_until_up(self, model: str) -> None:
        """Poll `/health` until it answers 200, for at most `timeout` seconds.

        Raises:
            EngineError: no answer within `timeout` (naming the last failure); at once, an HTTP server that answers
                `/health` with a 4xx code (404: not a vLLM server, or a URL with a path such as /v1).
        """
        deadline, last = time.monotonic() + self.timeout, "no answer"
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=max(0.1, min(5.0, deadline - time.monotonic()))) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as err:
                if 400 <= err.code < 500:  # something answers there, and it is not a vLLM server's root (vLLM starting up is 5xx or silent)
                    raise EngineError(
                        f"{self.url} answered GET /health with HTTP {err.code}: it is not a vLLM server's base URL. Give the address "
                        f"`fastgrpo vllm-serve` listens on, without a path (http://host:port, no /v1); start one with "
                        f"`{start_command(model, self.url)}`."
                    ) from None
                last = f"HTTP {err.code}"
            except (OSError, http.client.HTTPException) as err:
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            if time.monotonic() >= deadline:
                raise EngineError(
                    f"no vLLM server answered at {self.url} within vllm_server_timeout={self.timeout:g} s ({last}); start one with "
                    f"`{start_command(model, self.url)}`, or point vllm_server_base_url (or vllm_server_host/port) at a running one."
                )
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def request(self, method: str, path: str, body: dict | None = None, missing: str = "") -> dict:
        """One HTTP request; → the JSON answer ({} for an empty one). Raises EngineError on any failure (no answer within
        `timeout` seconds: naming vllm_server_timeout, which a busy server needs raised)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if err.code == 404 and missing:
                raise EngineError(f"{self.description} has no {path.split('?')[0]} ({missing}); start it with "
                                  f"`{start_command(self.model, self.url)}`, which turns them on.") from None
            raise EngineError(f"{self.description} refused {method} {path.split('?')[0]} (HTTP {err.code}: {detail}).") from None
        except (OSError, http.client.HTTPException) as err:
            after = "restart the server" if self.started else "nothing was trained yet: check the server, then start the run again"
            if isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError):  # read, or connect (URLError)
                raise EngineError(
                    f"{self.description} did not answer {method} {path.split('?')[0]} within vllm_server_timeout={self.timeout:g} s; if it "
                    f"is busy (a slow machine, long completions, other clients), raise vllm_server_timeout; if it hangs, {after}."
                ) from None
            raise EngineError(f"{self.description} stopped answering ({type(err).__name__}: {err}) during {method} {path.split('?')[0]}; {after}.") from None
        try:
            answer = json.loads(text) if text.strip() else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise EngineError(f"{self.description} answered {method} {path.split('?')[0]} with something that is not a JSON object "
                              f"({text[:200].decode(errors='replace')!r}); is vllm_server_base_url a vLLM server started with "
                              "`fastgrpo vllm-serve`?")
        return answer

    def generate(self, prompts: list[list[int]], params: dict) -> list[list[Completion]]:
        """`/v1/completions` with token-id prompts; choices come prompt-major (prompt i's n completions, then i + 1's).

        Raises:
            EngineError: see `request`; an answer without choices holding index and token_ids, another number of
                choices than n per prompt, or indexes that are not 0 … n·prompts − 1 once each.
        """
        n = params["n"]
        answer = self.request("POST", "/v1/completions", {"model": self.model, "prompt": prompts, "return_token_ids": True, **params})
        try:
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            rows = [Completion(c["token_ids"], (c.get("logprobs") or {}).get("token_logprobs", []), isinstance(c.get("stop_reason"), str))
                    for c in choices]
        except (KeyError, TypeError, AttributeError) as err:
            raise EngineError(f"{self.description} answered /v1/completions without choices holding index and token_ids "
                              f"({type(err).__name__}: {err}); it must be a vLLM server that returns token ids (`fastgrpo vllm-serve`).") from None
        if len(choices) != n * len(prompts):
            raise EngineError(f"{self.description} returned {len(choices)} completions for {len(prompts)} prompts × n={n}.")
        indexes = [c["index"] for c in choices]
        if indexes != list(range(len(choices))):  # vLLM numbers them 0 … n·prompts − 1: the number says whose completion it is
            raise EngineError(f"{self.description} numbered its {len(choices)} completions {indexes[:8]}{'…' if len(choices) > 8 else ''}, "
                              f"not 0 to {len(choices) - 1} once each, so which prompt each belongs to is lost; it must be a vLLM "
                              "server (`fastgrpo vllm-serve`).")
        return [rows[i * n : (i + 1) * n] for i in range(len(prompts))]

    def push(self, weights: dict[str, torch.Tensor]) -> PushSeconds:
        """The weights to the server (CPU: a shared-memory folder it reloads from; CUDA: NCCL), then its prefix cache dropped;
        → the seconds of each (engines.PushSeconds)."""
        started = time.perf_counter()
        if self.nccl:
            self.send_weights(weights)
        else:
            self.folder.write(weights)
            try:
                self.request("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": self.folder.path}},
                             missing="its dev endpoints are off")
            except EngineError as err:
                if not str(err).startswith(f"{self.description} refused "):  # an HTTP error; not a dead server's "Connection refused"
                    raise
                raise EngineError(f"{err} Without a GPU the server must run on this machine: it reloads the weights from "
                                  f"{self.folder.path} (shared memory).") from None
        transferred = time.perf_counter()
        # requests still running (another process's, an evaluation's) are preempted and recomputed under the new weights;
        # without the flag vLLM refuses the reset while they hold blocks, and later prompts would hit the old weights' cache
        self.request("POST", "/reset_prefix_cache?reset_running_requests=true")
        return PushSeconds(transfer=transferred - started, pause=time.perf_counter() - transferred)

    def send_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """CUDA: the weights over vLLM's NCCL weight-transfer engine, as TRL 1.16's `VLLMClient` (not run here: no GPU)."""
        from vllm.distributed.weight_transfer.nccl_common import trainer_init  # noqa: PLC0415 (CUDA only)
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer  # noqa: PLC0415
        from vllm.utils.network_utils import get_ip  # noqa: PLC0415

        if self.communicator is None:
            world_size = self.request("GET", "/get_world_size")["world_size"] + 1  # the trainer joins as rank 0
            init = {"master_address": get_ip(), "master_port": self.group_port, "rank_offset": 1, "world_size": world_size, "packed": True}
            with ThreadPoolExecutor(max_workers=1) as pool:  # the server blocks in the rendezvous while answering
                answer = pool.submit(self.request, "POST", "/init_weight_transfer_engine", {"init_info": init})
                self.communicator = trainer_init(init)
                answer.result()
        items = [(name, t.to("cuda").contiguous()) for name, t in weights.items()]
        info = {"names": [n for n, _ in items], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in items],
                "shapes": [list(t.shape) for _, t in items]}
        self.request("POST", "/start_weight_update", {})
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(self.request, "POST", "/update_weights", {"update_info": info})
            packed_nccl_broadcast_producer(iterator=iter(items), group=self.communicator, src=0, post_iter_func=lambda item: item[1])
            answer.result()
        self.request("POST", "/finish_weight_update", {})

    def close(self) -> None:
        """Remove the weights folder; the server belongs to the user and keeps running."""
        if self.folder is not None:
            self.folder.close()


def same_model(name: str, folder: str) -> tuple[str, ...]:
    """The spellings a server may report for a model given as `name` that resolved to `folder`."""
    return tuple({name, folder, os.path.realpath(folder)} - {name})


def served_folder(root) -> str | None:
    """The local folder a server loaded, from its `root` in /v1/models (vLLM's `--model`): for `fastgrpo vllm-serve`'s
    untied copy of a tied model (`weights.untied_folder`, in a folder named "untied") the folder its files link to;
    None when `root` is not an absolute path to a folder on this machine (a hub id, a relative path, another machine's)."""
    if not isinstance(root, str) or not os.path.isabs(root) or not os.path.isdir(root):
        return None
    if os.path.basename(os.path.dirname(root)) == "untied":
        links = {os.path.dirname(os.readlink(p)) for p in (os.path.join(root, n) for n in os.listdir(root)) if os.path.islink(p)}
        if len(links) == 1:
            return os.path.realpath(links.pop())
    return os.path.realpath(root)


def names_the_model(served: str, names: tuple[str, ...], folder: str | None = None) -> bool:
    """Whether a server's model name `served` is one of `names` (the run's model and its spellings), or a local path to
    the same folder as one of them, read from this process's working folder (`./m`, `m` and `~/…/m` are one model; a
    server reports `--model` as it was typed). Where the server says which local `folder` it loaded (`served_folder`)
    and the run trains a local folder, the folders decide: a server started as `--model m` in another working folder
    serves another `m`, and one started elsewhere for the run's folder serves it, whatever its name."""
    folders = {os.path.realpath(os.path.expanduser(name)) for name in names if os.path.exists(os.path.expanduser(name))}
    if folder is not None and folders:
        return folder in folders
    if served in names:
        return True
    return os.path.exists(os.path.expanduser(served)) and os.path.realpath(os.path.expanduser(served)) in folders
