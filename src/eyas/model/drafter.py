"""The EAGLE-3 drafter: one Llama decoder layer over fused target taps (SGLang `LlamaForCausalLMEagle3`).

Data flow for one drafting step (as SGLang's `python/sglang/srt/models/llama_eagle3.py` computes it,
https://github.com/sgl-project/sglang):

    h      = fc(cat(aux taps))             # step 0: [.., 3H] -> [.., H]; later steps: own hidden_out
    x      = cat(input_layernorm(embed(id)), hidden_norm(h))   # [.., 2H]
    h2     = attn(x) + h                   # residual is the un-normed h
    out    = h2 + mlp(post_attention_layernorm(h2))
    logits = lm_head(norm(out))            # over the DRAFT vocab D; draft id i is target id i + d2t[i]
    hidden_out = out                       # fed back as h at the next step (norm(out) with norm_output)

`attention: mla` swaps the Llama attention for DeepSeek-V2 multi-latent attention (`eyas.model.mla`,
served as SGLang's `Eagle3DeepseekV2ForCausalLM`); with it, `fc_norm` RMS-normalises each aux tap
before fc and `norm_output` feeds norm(out) back instead of out (EAGLE-3.1, `kimi_k25_eagle3.py`).

Training-time test (`ttt_forward`) unrolls `steps` such steps over a whole sequence at once with the
tree-of-steps mask of docs/design.md; `forward_step` + `DrafterCache` is the serving-time chain and
reproduces it exactly. This module owns the model, those two forward passes, the attention kernels
they run (SDPA, the tree-of-steps attention) and the drafter dir's I/O; the shape is
`eyas.model.drafter_config`'s `DrafterConfig`, the layer `eyas.model.decoder_layer`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from eyas.core.atomic import atomic_dir
from eyas.model import causal_lse
from eyas.model.decoder_layer import DecoderLayer, repeat_kv
from eyas.model.drafter_config import DrafterConfig
from eyas.model.norm import RMSNorm

DRAFTER_FORMAT = "eyas.drafter/1"
QUERY_CHUNK = 2048  # query rows per SDPA call in ttt_forward: bounds the [chunk, T + k*chunk] bool mask
# On CPU, SDPA computes every masked-out score of its [C, hi + k*C] block: smaller chunks skip the causal
# upper triangle and shrink the k*C diagonal columns: fwd+bwd of 7 TTT steps at T = 700, bf16, one
# thread took 0.86 s with chunk 128 against 2.8 s with 2048 (checkpointed); 64-256 within 15%.
QUERY_CHUNK_CPU = 128
CHECKPOINT_BYTES = 256 << 20  # keep chunk key/value copies for backward up to this, else recompute them
# SDPA kernels the drafter may use: not cuDNN's, which builds an execution graph on the host for every
# new shape (hundreds of ms; https://github.com/sgl-project/sglang/pull/4650 measured ~400 ms), and
# the drafter's shapes change with every batch (rows, longest sample, 7 TTT key lengths). None: torch's
# own choice (bench/train_shapes.py compares them).
ATTENTION_BACKENDS: list[SDPBackend] | None = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """`F.scaled_dot_product_attention` with a boolean mask (True = attend), on ATTENTION_BACKENDS."""
    if ATTENTION_BACKENDS is None or q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with sdpa_kernel(ATTENTION_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class DrafterCache:
    """KV cache of the single decoder layer: post-RoPE keys/values of every position drafted so far."""

    def __init__(self) -> None:
        self.key: Tensor | None = None  # [B, nKV, S, hd]
        self.value: Tensor | None = None  # [B, nKV, S, hd]

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drop rejected drafts)."""
        if length < 0 or length > self.length:
            raise ValueError(f"DrafterCache.crop({length}) outside [0, {self.length}]")
        if self.key is not None:
            self.key = self.key[:, :, :length]
            self.value = self.value[:, :, :length]

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append a block's [B, nKV, T, hd] keys/values; return the whole cache."""
        if self.key is None:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=2)
            self.value = torch.cat([self.value, value], dim=2)
        return self.key, self.value


def tree_attention(
    q: Tensor,
    k0: Tensor,
    v0: Tensor,
    k_diag: Tensor,
    v_diag: Tensor,
    chunk: int | None = None,
    impl: str = "masked",
    compiled: bool = False,
) -> Tensor:
    """Attention of one TTT step under the tree-of-steps mask, through SDPA in query chunks.

    q [B, h, T, hd] (step k's queries); k0/v0 [B, h, T, hd] (step-0 keys, attended causally);
    k_diag/v_diag [B, h, T, k, hd] (steps 1..k at the SAME index, attended by that index only).
    Each chunk of C query rows is one SDPA call over its hi = lo + C causal keys plus its k*C diagonal
    keys with a boolean [C, hi + k*C] mask, so no [T, T] score matrix exists (SDPA's fused kernels keep
    scores blockwise). chunk None = QUERY_CHUNK_CPU on CPU, QUERY_CHUNK elsewhere. With grad enabled
    and the chunks' key/value copies over CHECKPOINT_BYTES, each chunk is checkpointed: backward
    recomputes one chunk at a time instead of keeping every copy alive (O(T^2 / C) memory).
    impl "lse": causal flash attention and a log-sum-exp merge instead (`eyas.model.causal_lse`), where
    it applies (equal q/v head sizes, a flash kernel's dtype); the same result up to rounding; its merge
    compiled with `compiled` (train.compile).
    """
    if impl == "lse" and causal_lse.supported(q, v_diag):
        return causal_lse.tree_attention_lse(q, k0, v0, k_diag, v_diag, compile_merge=compiled)
    chunk = chunk or (QUERY_CHUNK_CPU if q.device.type == "cpu" else QUERY_CHUNK)
    t_len = q.shape[2]
    recompute = torch.is_grad_enabled() and _chunk_copy_bytes(k_diag, t_len, chunk) > CHECKPOINT_BYTES
    outs = []
    for lo in range(0, t_len, chunk):
        hi = min(t_len, lo + chunk)
        if recompute:
            outs.append(checkpoint(_tree_chunk, q, k0, v0, k_diag, v_diag, lo, hi, use_reentrant=False))
        else:
            outs.append(_tree_chunk(q, k0, v0, k_diag, v_diag, lo, hi))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def mlp_recompute_needed(tokens: int, intermediate: int, steps: int, element_size: int, budget: int) -> bool:
    """Whether the MLP intermediates the TTT unroll would keep for backward (gate, up, their
    activation and product: 4 x [tokens, I] per step) exceed `budget` bytes."""
    return 4 * tokens * intermediate * steps * element_size > budget


def _chunk_copy_bytes(k_diag: Tensor, t_len: int, chunk: int) -> int:
    """Bytes of the keys + values that `_tree_chunk` concatenates, summed over all chunks."""
    b, h, _, steps, hd = k_diag.shape
    rows = sum(min(t_len, lo + chunk) * (1 + steps) - lo * steps for lo in range(0, t_len, chunk))
    return 2 * b * h * rows * hd * k_diag.element_size()


def _tree_chunk(
    q: Tensor, k0: Tensor, v0: Tensor, k_diag: Tensor, v_diag: Tensor, lo: int, hi: int
) -> Tensor:
    """Query rows [lo, hi) of `tree_attention` -> [B, h, hi - lo, hd]."""
    b, h, _, steps, hd = k_diag.shape
    c = hi - lo
    # Diagonal keys laid out step-major: key hi + j*c + i belongs to step j + 1 at row lo + i.
    kd = k_diag[:, :, lo:hi].transpose(2, 3).reshape(b, h, steps * c, hd)  # [B, h, k*C, hd]
    vd = v_diag[:, :, lo:hi].transpose(2, 3).reshape(b, h, steps * c, v_diag.shape[-1])  # MLA: dv != hd
    keys = torch.cat([k0[:, :, :hi], kd], dim=2)  # [B, h, hi + k*C, hd]
    values = torch.cat([v0[:, :, :hi], vd], dim=2)
    rows = torch.arange(c, device=q.device)[:, None]  # [C, 1]
    causal = torch.arange(hi, device=q.device)[None, :] <= rows + lo  # [C, hi]
    diag = (torch.arange(steps * c, device=q.device) % c)[None, :] == rows  # [C, k*C]
    mask = torch.cat([causal, diag], dim=1)  # [C, hi + k*C] bool, True = attend
    return sdpa(q[:, :, lo:hi], keys, values, mask)


class Eagle3Drafter(nn.Module):
    attention_impl = "masked"  # `tree_attention`'s impl in `ttt_hidden` (train.tree_attention); not exported
    compiled = False  # `compile_steps` ran (train.compile): the training loss compiles its blocks too

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # borrowed from the target, never trained
        self.fc = nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        if c.fc_norm:  # one RMSNorm per aux tap before fc
            self.fc_norm = nn.ModuleList([RMSNorm(c.hidden_size, c.rms_norm_eps) for _ in range(3)])
        self.layers = nn.ModuleList([DecoderLayer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # Identity mapping until set_vocab: draft id i == target id i.
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[: c.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)

    # ----------------------------------------------------------------------- setup
    def set_target_embedding(self, weight: Tensor) -> None:
        c = self.config
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"target embedding has shape {tuple(weight.shape)}, expected {(c.vocab_size, c.hidden_size)}"
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight.to(self.embed_tokens.weight.dtype))
        self.embed_tokens.weight.requires_grad_(False)

    def set_vocab(self, d2t: Tensor, t2d: Tensor) -> None:
        c = self.config
        if tuple(d2t.shape) != (c.draft_vocab_size,) or tuple(t2d.shape) != (c.vocab_size,):
            raise ValueError(
                f"draft vocab shapes d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)}; expected "
                f"({c.draft_vocab_size},), ({c.vocab_size},)"
            )
        target_ids = torch.arange(c.draft_vocab_size) + d2t.cpu().long()
        if int(t2d.sum()) != c.draft_vocab_size or not bool(t2d.cpu()[target_ids].all()):
            raise ValueError(
                "draft vocab: d2t and t2d disagree (t2d must be True exactly at arange(D) + d2t)"
            )
        self.d2t.copy_(d2t.long())
        self.t2d.copy_(t2d.bool())

    # ----------------------------------------------------------------------- forward
    def combine_taps(self, aux: Tensor) -> Tensor:
        """aux [B, T, 3H] (taps concatenated in aux_layer_ids order) -> [B, T, H]."""
        if self.config.fc_norm:
            taps = aux.chunk(3, dim=-1)  # 3 x [B, T, H]
            aux = torch.cat([norm(tap) for norm, tap in zip(self.fc_norm, taps, strict=True)], dim=-1)
        return self.fc(aux)

    def feed_forward(self, out: Tensor) -> Tensor:
        """The hidden fed to the next drafting step: out, or norm(out) with norm_output."""
        return self.norm(out) if self.config.norm_output else out

    def _logits(self, out: Tensor) -> Tensor:
        return self.lm_head(self.norm(out))  # [B, T, D]

    def forward_step(
        self, hidden: Tensor, input_ids: Tensor, position_ids: Tensor, cache: DrafterCache | None = None
    ) -> tuple[Tensor, Tensor]:
        """One drafting step for a block of T new positions.

        hidden [B, T, H] (fc'd taps or the drafter's own hidden_out), input_ids [B, T], position_ids [B, T].
        With a cache, this block's K/V are appended and queries see every cached position plus the
        block causally; without one, attention is causal within the block.
        Returns (logits [B, T, D] over the draft vocab, hidden_out [B, T, H] for the next step).
        """
        layer = self.layers[0]
        attn = layer.self_attn
        x = layer.attn_input(self.embed_tokens(input_ids), hidden)  # [B, T, 2H]
        q, k, v = attn.qkv(x, position_ids)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)  # [B, nKV, S + T, hd]
        t, s = q.shape[2], k.shape[2]
        allowed = (
            torch.arange(s, device=q.device)[None, :] <= torch.arange(t, device=q.device)[:, None] + past
        )
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        out = sdpa(q, repeat_kv(k, groups), repeat_kv(v, groups), allowed)
        out = layer.finish(attn.project_out(out), hidden)  # [B, T, H]
        return self._logits(out), self.feed_forward(out)

    def ttt_forward(self, aux: Tensor, input_ids: Tensor, steps: int) -> list[Tensor]:
        """Per-step logits [B, T, D] of `ttt_hidden` (evaluation; training never builds these)."""
        return [self._logits(h) for h in self.ttt_hidden(aux, input_ids, steps)]

    def ttt_hidden(
        self, aux: Tensor, input_ids: Tensor, steps: int, recompute_mlp: bool = False
    ) -> list[Tensor]:
        """Training-time test: `steps` chained drafting steps at every index of a right-padded batch.

        aux [B, T, 3H], input_ids [B, T] (position t of row b is token t of its sample, positions
        start at 0). Step k at index t embeds input_ids[t + 1 + k] (ids past the end are replaced by
        id 0: those positions must carry no loss), sits at RoPE position t + k and predicts token
        t + 2 + k. Right padding needs no mask: causal attention never lets a real position see a pad.
        Returns per-step pre-norm hidden states, each [B, T, H] (logits = lm_head(norm(h)): the loss
        computes them in row chunks, so [B, T, D] per step never exists during training).
        recompute_mlp: checkpoint each step's residual + MLP block (`DecoderLayer.finish`): backward
        recomputes it instead of keeping its [B, T, I] intermediates for every step, the largest
        activations of a long sample (`mlp_recompute_needed`).
        """
        b, t = input_ids.shape
        base_pos = torch.arange(t, device=input_ids.device).expand(b, t)  # [B, T]
        pad = input_ids.new_zeros(b, steps + 1)
        shifted_ids = torch.cat([input_ids, pad], dim=1)  # [B, T + steps + 1]
        hidden = self.combine_taps(aux)  # [B, T, H]
        k0 = v0 = None
        k_diag: list[Tensor] = []  # step j >= 1 keys, each [B, nH, T, hd]
        v_diag: list[Tensor] = []
        step_hidden = []
        impl, compiled = self.attention_impl, self.compiled
        for k in range(steps):
            q, key, value = self.step_qkv(shifted_ids[:, 1 + k : 1 + k + t], hidden, base_pos + k)
            if k == 0:
                k0, v0 = key, value
                kd = key.new_zeros(*key.shape[:3], 0, key.shape[-1])  # [B, nH, T, 0, hd]
                vd = value.new_zeros(*value.shape[:3], 0, value.shape[-1])  # [B, nH, T, 0, dv]
            else:
                k_diag.append(key)
                v_diag.append(value)
                kd, vd = torch.stack(k_diag, dim=3), torch.stack(v_diag, dim=3)  # [B, nH, T, k, hd]
            out = tree_attention(q, k0, v0, kd, vd, impl=impl, compiled=compiled)  # [B, nH, T, hd]
            if recompute_mlp and torch.is_grad_enabled():
                out, hidden = checkpoint(self.step_out, out, hidden, use_reentrant=False)
            else:
                out, hidden = self.step_out(out, hidden)  # [B, T, H] each
            step_hidden.append(out)  # `hidden` is fed to step k + 1
        return step_hidden

    def step_qkv(self, ids: Tensor, hidden: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A TTT step up to its attention: ids [B, T], hidden [B, T, H] (fc'd taps or the last step's
        output), positions [B, T] -> post-RoPE q, and k, v repeated to the query heads, [B, nH, T, hd]."""
        layer = self.layers[0]
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        x = layer.attn_input(self.embed_tokens(ids), hidden)  # [B, T, 2H]
        q, key, value = layer.self_attn.qkv(x, positions)
        return q, repeat_kv(key, groups), repeat_kv(value, groups)

    def step_out(self, attn_heads: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """A TTT step after its attention: attn_heads [B, nH, T, hd], hidden [B, T, H] (the step's
        residual) -> (pre-norm output [B, T, H], the hidden fed to the next step [B, T, H])."""
        layer = self.layers[0]
        out = layer.finish(layer.self_attn.project_out(attn_heads), hidden)
        return out, self.feed_forward(out)

    def compile_steps(self) -> None:
        """Run `step_qkv` and `step_out` through `torch.compile` (train.compile): their norms, RoPE,
        casts and MLP activations become fused kernels (a trainer step at the GPU recipe's shape
        launched 3,210 kernels against 5,286, bench/results/train-compile-h100.json); the attention
        and the matmuls stay as they are. Shapes are dynamic (rows and lengths change
        with every batch), so one compilation serves them all. The `lse` tree attention's merge and the
        training loss's blocks follow `compiled` (`eyas.model.compiled`)."""
        self.step_qkv = torch.compile(self.step_qkv, dynamic=True)
        self.step_out = torch.compile(self.step_out, dynamic=True)
        self.compiled = True

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target-vocab ids."""
        return draft_ids + self.d2t[draft_ids]

    # ----------------------------------------------------------------------- I/O
    def save_pretrained(self, out_dir: str | os.PathLike, extra_config: dict | None = None) -> None:
        """Write `model.safetensors` (SGLang names + embed_tokens.weight) and `config.json`, atomically."""
        config = {"format": DRAFTER_FORMAT, **self.config.to_dict()}
        clash = sorted(set(extra_config or {}) & set(config))
        if clash:
            raise ValueError(f"extra_config may not override drafter config field(s) {clash}")
        config.update(extra_config or {})
        tensors = {name: t.detach().cpu().contiguous() for name, t in self.state_dict().items()}
        with atomic_dir(out_dir) as tmp:
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": DRAFTER_FORMAT})
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, map_location: str | torch.device = "cpu"
    ) -> Eagle3Drafter:
        path = Path(path)
        config_path = path / "config.json"
        if not config_path.exists():
            raise FileNotFoundError(f"drafter: {config_path} does not exist")
        raw = json.loads(config_path.read_text())
        if raw.get("format") != DRAFTER_FORMAT:
            raise ValueError(
                f"{config_path}: field 'format' is {raw.get('format')!r}, expected {DRAFTER_FORMAT!r}"
            )
        names = {f.name for f in dataclasses.fields(DrafterConfig)}
        model = cls(DrafterConfig.from_dict({k: v for k, v in raw.items() if k in names}))
        state = load_file(str(path / "model.safetensors"), device=str(map_location))
        result = model.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"{path / 'model.safetensors'}: missing keys {result.missing_keys}, "
                f"unexpected keys {result.unexpected_keys}"
            )
        model.embed_tokens.weight.requires_grad_(False)
        return model.to(map_location)


def read_drafter_config(path: str | os.PathLike) -> dict:
    """The full config.json of a drafter dir (DrafterConfig fields + provenance)."""
    return json.loads((Path(path) / "config.json").read_text())
