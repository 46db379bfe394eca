"""Tiny random models of the Kimi-K2.5 family, written as HF model dirs from configs (nothing downloaded):

- `write_language_model(out)`: a DeepSeek-V3 causal LM (`DeepseekV3ForCausalLM`): multi-head latent
  attention with Kimi-K2's MLA dims (q_lora 1536, kv_lora 512, nope 128, rope 64, v 128: the shapes
  every SGLang MLA kernel takes), 8 decoder layers of width 256, the first dense, the others MoE with 8
  routed experts (2 per token, sigmoid scores with the `noaux_tc` bias) plus 1 shared expert, yarn RoPE
  as Kimi-K2 configures it.
- `write_kimi_k25(out)`: the same language model, tensor for tensor, inside
  `KimiK25ForConditionalGeneration` (a 1-block MoonViT vision tower and its patch-merger projector
  from config), as SGLang's `models/kimi_k25.py` (0.5.17, 0.5.23) loads it: `language_model.*` for the
  language model, the vision tower under Kimi's checkpoint names (`wqkv`, `wo`, `mm_projector.proj.N`).
- `write_family(out)`: both, as `out/deepseek_v3` and `out/kimi_k25` (what the tests and the command
  below write).

Weights use DeepSeek-V3's checkpoint names (per-expert `experts.E.{gate,up,down}_proj`), bf16, drawn
from a seeded normal; the tokenizer is the SmolLM2 copy in tests/data/tokenizer (vocab 49,152, with
its chat template). Both venvs can run this (torch and safetensors only):

    python tools/tiny_kimi.py --out DIR      # writes DIR/deepseek_v3 and DIR/kimi_k25
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"
VOCAB = 49152  # the SmolLM2 tokenizer's

TEXT_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {  # Kimi-K2's
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

VISION_CONFIG = {  # MoonViT, one block; `vt_*` are the names SGLang's projector reads
    "patch_size": 14,
    "init_pos_emb_height": 8,
    "init_pos_emb_width": 8,
    "init_pos_emb_time": 4,
    "pos_emb_height": 8,  # the same three under transformers' Kimi_K25VisionConfig names
    "pos_emb_width": 8,
    "pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vt_hidden_size": 64,
    "vt_num_attention_heads": 2,
    "vt_num_hidden_layers": 1,
    "vt_intermediate_size": 128,
    "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "mm_hidden_size": 64,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "text_hidden_size": TEXT_CONFIG["hidden_size"],
}

WRAPPER_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "media_placeholder_token_id": VOCAB - 1,  # unused by text-only prompts; an id inside the vocab
    "projection_hidden_size": VISION_CONFIG["hidden_size"],  # transformers' name for the projector width
    "pad_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


class _Init:
    """Seeded bf16 tensors: matrices N(0, 0.25 / fan_in), norms 1 + N(0, 0.1^2).

    The scale keeps the model out of chaos, so bf16 rounding stays far below the difference between
    neighbouring taps (a capture one layer off must show). Measured once with transformers on 2 x 150
    random tokens (these scales, the bias spread below, another seed): hidden_states[2, 4, 5, 8] of bf16
    vs fp32 differ by 0.35-1.4 % relative RMS, neighbouring layers by 14 %; at N(0, 1 / fan_in) with
    unbiased routing the floor was 7-32 % (MoE routing flips). tests/test_kimi_wrapped_script.py keeps
    the floor of every tap under 5 %."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def matrix(self, rows: int, cols: int) -> torch.Tensor:
        std = 0.5 * cols**-0.5
        return (torch.randn(rows, cols, generator=self.gen) * std).to(torch.bfloat16)

    def norm(self, size: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(size, generator=self.gen)).to(torch.bfloat16)

    def vector(self, size: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(size, generator=self.gen) * std).to(torch.bfloat16)


def language_model_tensors(c: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of a DeepSeek-V3 checkpoint for config `c`, under its checkpoint names."""
    init = _Init(seed)
    h, nh = c["hidden_size"], c["num_attention_heads"]
    dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora, im = c["q_lora_rank"], c["kv_lora_rank"], c["moe_intermediate_size"]
    out = {"model.embed_tokens.weight": init.matrix(c["vocab_size"], h) * 2 * h**0.5}  # entries N(0, 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out |= {
            f"{p}.input_layernorm.weight": init.norm(h),
            f"{p}.post_attention_layernorm.weight": init.norm(h),
            f"{p}.self_attn.q_a_proj.weight": init.matrix(q_lora, h),
            f"{p}.self_attn.q_a_layernorm.weight": init.norm(q_lora),
            f"{p}.self_attn.q_b_proj.weight": init.matrix(nh * (dn + dr), q_lora),
            f"{p}.self_attn.kv_a_proj_with_mqa.weight": init.matrix(kv_lora + dr, h),
            f"{p}.self_attn.kv_a_layernorm.weight": init.norm(kv_lora),
            f"{p}.self_attn.kv_b_proj.weight": init.matrix(nh * (dn + dv), kv_lora),
            f"{p}.self_attn.o_proj.weight": init.matrix(h, nh * dv),
        }
        if i < c["first_k_dense_replace"]:
            out |= _mlp(init, f"{p}.mlp", h, c["intermediate_size"])
            continue
        out[f"{p}.mlp.gate.weight"] = init.matrix(c["n_routed_experts"], h)
        # a spread of expert preferences (noaux_tc adds it before top-k): routing margins above bf16 noise
        experts = c["n_routed_experts"]
        out[f"{p}.mlp.gate.e_score_correction_bias"] = (
            torch.randperm(experts, generator=init.gen).float() / (experts - 1) - 0.5
        ) * 0.5
        for e in range(c["n_routed_experts"]):
            out |= _mlp(init, f"{p}.mlp.experts.{e}", h, im)
        out |= _mlp(init, f"{p}.mlp.shared_experts", h, im * c["n_shared_experts"])
    out["model.norm.weight"] = init.norm(h)
    out["lm_head.weight"] = init.matrix(c["vocab_size"], h)
    return out


def _mlp(init: _Init, prefix: str, h: int, inter: int) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.gate_proj.weight": init.matrix(inter, h),
        f"{prefix}.up_proj.weight": init.matrix(inter, h),
        f"{prefix}.down_proj.weight": init.matrix(h, inter),
    }


def vision_tensors(v: dict, text_hidden: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """MoonViT + patch-merger projector tensors under Kimi-K2.5's checkpoint names."""
    init = _Init(seed)
    d, inter, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = d * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    out = {
        "vision_tower.patch_embed.proj.weight": init.matrix(d, 3 * patch * patch).view(d, 3, patch, patch),
        "vision_tower.patch_embed.proj.bias": init.vector(d),
        "vision_tower.patch_embed.pos_emb.weight": init.matrix(
            v["init_pos_emb_height"] * v["init_pos_emb_width"], d
        ).view(v["init_pos_emb_height"], v["init_pos_emb_width"], d),
        "vision_tower.encoder.final_layernorm.weight": init.norm(d),
        "vision_tower.encoder.final_layernorm.bias": init.vector(d),
        "mm_projector.pre_norm.weight": init.norm(d),
        "mm_projector.pre_norm.bias": init.vector(d),
        "mm_projector.proj.0.weight": init.matrix(merged, merged),
        "mm_projector.proj.0.bias": init.vector(merged),
        "mm_projector.proj.2.weight": init.matrix(text_hidden, merged),
        "mm_projector.proj.2.bias": init.vector(text_hidden),
    }
    for b in range(v["num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{b}"
        out |= {
            f"{p}.norm0.weight": init.norm(d),
            f"{p}.norm0.bias": init.vector(d),
            f"{p}.norm1.weight": init.norm(d),
            f"{p}.norm1.bias": init.vector(d),
            f"{p}.mlp.fc0.weight": init.matrix(inter, d),
            f"{p}.mlp.fc0.bias": init.vector(inter),
            f"{p}.mlp.fc1.weight": init.matrix(d, inter),
            f"{p}.mlp.fc1.bias": init.vector(d),
            f"{p}.wqkv.weight": init.matrix(3 * d, d),
            f"{p}.wqkv.bias": init.vector(3 * d),
            f"{p}.wo.weight": init.matrix(d, d),
            f"{p}.wo.bias": init.vector(d),
        }
    return out


def _write(out: Path, config: dict, tensors: dict[str, torch.Tensor], tokenizer_dir: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {k: t.contiguous() for k, t in tensors.items()}, str(out / "model.safetensors"), {"format": "pt"}
    )
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


def write_language_model(
    out: str | Path, seed: int = 0, tokenizer_dir: Path = TOKENIZER_DIR, text_config: dict = TEXT_CONFIG
) -> Path:
    """The tiny DeepSeek-V3 causal LM as an HF dir at `out` (`text_config`: TEXT_CONFIG or a resized copy)."""
    return _write(Path(out), text_config, language_model_tensors(text_config, seed), tokenizer_dir)


def write_kimi_k25(
    out: str | Path, seed: int = 0, tokenizer_dir: Path = TOKENIZER_DIR, text_config: dict = TEXT_CONFIG
) -> Path:
    """The same language model inside `KimiK25ForConditionalGeneration`, as an HF dir at `out`."""
    vision = {**VISION_CONFIG, "text_hidden_size": text_config["hidden_size"]}
    config = {**WRAPPER_CONFIG, "text_config": text_config, "vision_config": vision}
    lm = {f"language_model.{k}": t for k, t in language_model_tensors(text_config, seed).items()}
    tensors = lm | vision_tensors(vision, text_config["hidden_size"])
    return _write(Path(out), config, tensors, tokenizer_dir)


def write_family(out: str | Path, seed: int = 0) -> dict[str, Path]:
    """Both dirs under `out`: {"lm": out/deepseek_v3, "wrapped": out/kimi_k25}."""
    out = Path(out)
    return {
        "lm": write_language_model(out / "deepseek_v3", seed),
        "wrapped": write_kimi_k25(out / "kimi_k25", seed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="writes OUT/deepseek_v3 and OUT/kimi_k25")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in write_family(args.out, args.seed).values():
        print(path)


if __name__ == "__main__":
    main()
