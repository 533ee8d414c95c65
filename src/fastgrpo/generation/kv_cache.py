"""The own sampler's decoder pass: a static KV cache run module by module.

`KVCache` runs a Llama-family decoder (Llama, Mistral, Qwen2) with the model's own projections, norms, MLP and
rotary embedding (LoRA layers injected by peft run too) over a cache it owns. sampler.py (one turn) and
cached_turns.py (turns that keep the cache) share it.

Not here: the decode loops (sampler.py, cached_turns.py), each step's draw (draw.py).
"""

from __future__ import annotations

import math

import psutil
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


class KVCache:
    """The static KV cache of one sampling call and the forward passes that fill it (the own sampler, cached turns).

    keys/values[layer]: (N, KV heads, L, head dim); row r of the first n is
    the r-th live completion; column c holds the token at sequence column c
    (prompt columns 0…P−1, completion token t at P + t). `valid` (N, L) marks
    the columns a row may attend to (its real prompt tokens, then all
    generated ones).
    """

    def __init__(self, lm: torch.nn.Module, N: int, L: int, device: torch.device):
        """Allocate the cache for N rows of L columns, in the weights' dtype.

        Raises:
            ValueError: on a CPU, the cache and a step's logits would need more bytes than the machine has available now
                (psutil's `available`): allocating it would have the process killed for memory mid-rollout.
        """
        self.lm = lm
        config = lm.config
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = lm.lm_head.weight.dtype  # the weights' own: a bf16 copy keeps a bf16 cache
        shape = (N, heads, L, head_dim)
        # keys, values, `valid`, and each step's (N, V) logits with their fp32 processed copy (draw.py)
        need = 2 * len(lm.model.layers) * math.prod(shape) * dtype.itemsize + N * L + 2 * N * config.vocab_size * 4
        if torch.device(device).type == "cpu" and need > (free := psutil.virtual_memory().available):
            raise ValueError(
                f"sampling {N} completions of up to {L} tokens (prompt + max_completion_length) at once needs a KV cache and logits of "
                f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB this machine has free; lower the prompts per rollout "
                "(per_device_train_batch_size × steps_per_generation ÷ num_generations), num_generations or max_completion_length."
            )
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in lm.model.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in lm.model.layers]
        self.valid = torch.ones(N, L, dtype=torch.bool, device=device)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, G: int) -> torch.Tensor:
        """Run the B prompts once, write their keys/values into all G rows of each; → last-token logits (B, V)."""
        B, P = ids.shape
        self.valid[:, :P] = mask.repeat_interleave(G, dim=0)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # A padding query attends to itself only: never a fully masked row (NaN), never read by real tokens.
        allowed = (causal & mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)  # (B, P, P)

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][:, :, :P] = k.repeat_interleave(G, dim=0)
            self.values[layer][:, :, :P] = v.repeat_interleave(G, dim=0)
            return k, v

        return self._forward(ids, positions, allowed[:, None], attend)

    def decode(self, token: torch.Tensor, position: torch.Tensor, column: int) -> torch.Tensor:
        """One step for the n live rows: token (n,) at `position` (n,), written at cache `column`; → logits (n, V)."""
        n = token.shape[0]

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor):
            self.keys[layer][:n, :, column] = k[:, :, 0]
            self.values[layer][:n, :, column] = v[:, :, 0]
            return self.keys[layer][:n, :, : column + 1], self.values[layer][:n, :, : column + 1]

        return self._forward(token[:, None], position[:, None], self.valid[:n, None, None, : column + 1], attend)

    def compact(self, keep: torch.Tensor, columns: int) -> None:
        """Move live rows `keep` (indices among the first n) to the front; columns ≥ `columns` are not yet written."""
        for cache in (*self.keys, *self.values):
            cache[: len(keep), :, :columns] = cache[keep, :, :columns]
        self.valid[: len(keep)] = self.valid[keep]

    def _forward(self, ids, positions, allowed, attend) -> torch.Tensor:
        """The decoder, as the model's own forward computes it (eval mode), with our cache; → logits of the last position."""
        model = self.lm.model
        hidden = model.embed_tokens(ids)  # (n, s, hidden)
        cos_sin = model.rotary_emb(hidden, position_ids=positions)
        n, s = ids.shape
        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)  # (n, heads, s, head dim)
            k = attn.k_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(n, s, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *cos_sin)
            keys, values = attend(index, k, v)
            o = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=allowed, scale=attn.scaling, enable_gqa=True)
            hidden = hidden + attn.o_proj(o.transpose(1, 2).reshape(n, s, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.lm.lm_head(model.norm(hidden[:, -1]))  # (n, V)
