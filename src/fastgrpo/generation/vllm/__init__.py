"""vLLM as a generation backend (TRL's `use_vllm`): one engine per training process (colocate) or a server.

`backend.VLLMGenerator` is the `GenerationBackend`; it talks to one of two engines with the same small
contract (`engines.Engine`): `colocate.ColocateEngine` (vLLM's `LLM` in this process, its engine core in a
child process) or `server.ServerEngine` (a `fastgrpo vllm-serve` process over HTTP). Weights reach either
through `weights.WeightsFolder` (bf16 safetensors in shared memory, vLLM's `reload_weights`).
"""
