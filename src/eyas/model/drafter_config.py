"""The drafter's shape: `DrafterConfig`, the fields `eyas.model.drafter.Eagle3Drafter` is built from and
writes into its `config.json`, checked on construction, and taken from the target's HF `config.json`
(`from_target_config`). Which attention the one decoder layer runs (`llama` or `mla`) is a field here;
the MLA dimensions come from `eyas.model.mla`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from eyas.model.mla import MLA_FIELDS, mla_dims


@dataclass
class DrafterConfig:
    hidden_size: int
    """H: width of the target's residual stream (the drafter runs at the same width)."""
    intermediate_size: int
    """MLP width of the drafter's single decoder layer (the target's, by default)."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (GQA: must divide num_attention_heads)."""
    head_dim: int
    """Per-head width; q/k/v project the 2H attention input to heads * head_dim."""
    rms_norm_eps: float
    """Epsilon of every RMSNorm."""
    rope_theta: float
    """RoPE base frequency (the target's)."""
    max_position_embeddings: int
    """Longest position the drafter is configured for (copied into the SGLang config)."""
    vocab_size: int
    """V: the target vocab (embedding rows, t2d length)."""
    draft_vocab_size: int
    """D: the draft vocab (lm_head rows, d2t length)."""
    aux_layer_ids: list[int]
    """Target taps in the drafter convention (output of 0-based layer v == HF hidden_states[v + 1])."""
    hidden_act: str = "silu"
    """MLP activation; only SiLU (Llama) is implemented."""
    rope_scaling: dict | None = None
    """RoPE scaling dict; only None / rope_type "default" is supported."""
    attention: str = "llama"
    """The decoder layer's attention: `llama` (GQA, `LlamaForCausalLMEagle3`) or `mla` (DeepSeek-V2
    multi-latent attention with the five dims below, `Eagle3DeepseekV2ForCausalLM`)."""
    q_lora_rank: int | None = None
    """mla: query latent width (q_a_proj 2H -> q_lora_rank)."""
    kv_lora_rank: int | None = None
    """mla: key/value latent width (the latent cached per token when served)."""
    qk_nope_head_dim: int | None = None
    """mla: per-head query/key width without position."""
    qk_rope_head_dim: int | None = None
    """mla: per-head query/key width with RoPE (the key part is shared by all heads)."""
    v_head_dim: int | None = None
    """mla: per-head value width."""
    fc_norm: bool = False
    """mla: an RMSNorm per aux tap before fc (EAGLE-3.1)."""
    norm_output: bool = False
    """mla: feed norm(out) to the next drafting step instead of out (EAGLE-3.1)."""

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"DrafterConfig: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"DrafterConfig: hidden_act={self.hidden_act!r} unsupported (only 'silu')")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind != "default":
                raise ValueError(
                    f"DrafterConfig: rope_scaling {self.rope_scaling!r} unsupported (only default)"
                )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"DrafterConfig: draft_vocab_size={self.draft_vocab_size} not in "
                f"[1, vocab_size={self.vocab_size}]"
            )
        if len(self.aux_layer_ids) != 3:
            raise ValueError(
                f"DrafterConfig: aux_layer_ids={self.aux_layer_ids} must hold 3 taps (fc is 3H -> H)"
            )
        self.aux_layer_ids = [int(i) for i in self.aux_layer_ids]
        if self.attention == "mla":
            missing = [f for f in MLA_FIELDS if not getattr(self, f)]
            if missing or self.qk_rope_head_dim % 2:
                raise ValueError(f"DrafterConfig: attention 'mla' needs even qk_rope_head_dim and {missing}")
            if self.num_key_value_heads != self.num_attention_heads:
                raise ValueError("DrafterConfig: attention 'mla' has one key/value head per query head")
        elif self.attention == "llama":
            if self.fc_norm or self.norm_output:
                raise ValueError("DrafterConfig: fc_norm / norm_output are options of attention 'mla' only")
        else:
            raise ValueError(f"DrafterConfig: attention={self.attention!r} is not 'llama' or 'mla'")

    @classmethod
    def from_target_config(
        cls,
        target_config: dict,
        draft_vocab_size: int,
        aux_layer_ids: list[int],
        attention: str = "llama",
        fc_norm: bool = False,
        norm_output: bool = False,
        intermediate_size: int | None = None,
    ) -> DrafterConfig:
        """Shape the drafter like the target from its HF `config.json` dict (a multimodal wrapper's
        `text_config`). attention `mla`: MLA dims from `eyas.model.mla.mla_dims`; `auto`: `mla` for
        a target with MLA (`kv_lora_rank` in its config), else `llama`. `intermediate_size`: the draft
        layer's MLP width, None = the target's."""
        c = target_config.get("text_config") or target_config
        if attention == "auto":
            attention = "mla" if c.get("kv_lora_rank") else "llama"
        missing = [
            k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in c
        ]
        if missing:
            raise ValueError(f"target config.json lacks field(s) {missing}")
        # transformers 5 moves rope_theta / rope_scaling under rope_parameters.
        rope = dict(c.get("rope_parameters") or {})
        rope_theta = c.get("rope_theta", rope.pop("rope_theta", 10000.0))
        rope_scaling = c.get("rope_scaling") or (rope if rope else None)
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        heads = int(c["num_attention_heads"])
        mla = mla_dims(c) if attention == "mla" else {}
        return cls(
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(intermediate_size or c["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=heads if mla else int(c.get("num_key_value_heads") or heads),
            head_dim=(
                mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
                if mla
                else int(c.get("head_dim") or c["hidden_size"] // heads)
            ),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            vocab_size=int(c["vocab_size"]),
            draft_vocab_size=int(draft_vocab_size),
            aux_layer_ids=list(aux_layer_ids),
            hidden_act=c.get("hidden_act", "silu"),
            # The MLA draft runs plain RoPE at the target's theta: the draft's positions never exceed
            # what it was trained on, and SGLang reads the draft's own config (no target yarn needed).
            rope_scaling=None if mla else rope_scaling,
            attention=attention,
            fc_norm=fc_norm,
            norm_output=norm_output,
            **mla,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"DrafterConfig: unknown field(s) {unknown}")
        return cls(**d)
