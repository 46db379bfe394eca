"""Aux-layer ids, the one place that knows them: eyas's convention, the default taps, reading a
target's layer count (through a multimodal wrapper), validation, and the conversions to the ids
SGLang and vLLM take.

eyas's convention (docs/design.md): tap `v` is the OUTPUT of 0-based decoder layer `v`, i.e. HF
`hidden_states[v + 1]` (`hidden_states[0]` is the embeddings).

SGLang's `set_eagle3_layers_to_capture(ids)` captures the *input* of layer `p` (= HF
`hidden_states[p]`) for each `p` in `layers_to_capture`, which the model class derives from the ids
it is given (read in the 0.5.23 sources, `python/sglang/srt/models/*.py`,
https://github.com/sgl-project/sglang):

- Llama, Qwen, Gemma, GLM-4 MoE, gpt-oss and most others: `p = id + 1` for every id.
- DeepSeek-V2/V3/V3.2, Kimi-K2/K2.5 (a DeepSeek-V3 language model inside) and GLM-4 MoE Lite:
  `p = id + 1` only when `ids[0] == 1`, else `p = id` (a heuristic for checkpoints trained with
  either convention).

The same ids go to the capture engine and into the exported drafter's `eagle_config`, because the
serving engine applies the same rule when it loads the drafter. vLLM's speculators format takes
`hidden_states` indices (`eagle_aux_hidden_state_layer_ids`), so there id = tap + 1 for every family.
Nothing here imports SGLang or vLLM, so the rules are testable anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Stored in every hidden store and drafter config: the convention their `layer_ids` are in.
LAYER_ID_CONVENTION = "drafter:output_of_layer"  # id v == HF hidden_states[v + 1]

# HF `model_type`s whose SGLang model class adds 1 only when the first id is 1.
FIRST_ID_ONE_FAMILIES = frozenset(
    {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25", "glm4_moe_lite"}
)


# --------------------------------------------------------------------------- the target's layers
def text_config(config: dict) -> dict:
    """The language model's config: multimodal wrappers (Kimi-K2.5, Llama-4, Qwen-VL) nest it under
    `text_config`; a plain causal LM's config is its own."""
    return config.get("text_config") or config


def num_layers(config: dict) -> int:
    """Decoder layers of the target whose `config.json` is `config` (wrapped or not)."""
    return int(text_config(config)["num_hidden_layers"])


def text_model_type(config: dict) -> str:
    """The model_type whose class does the capture: multimodal wrappers (Kimi-K2.5) delegate to their
    language model, so its type decides."""
    text = config.get("text_config") or {}
    return str(text.get("model_type") or config.get("model_type") or "")


def default_aux_layer_ids(layers: int) -> list[int]:
    """EAGLE-3's default taps in the drafter convention: outputs of layers 1, L/2-1 and L-4."""
    return [1, layers // 2 - 1, layers - 4]


def validate_layer_ids(layer_ids: Sequence[int], layers: int) -> list[int]:
    """Drafter-convention tap ids must be distinct ints in [0, layers - 1]."""
    ids = list(layer_ids)
    if not ids:
        raise ValueError("layer_ids is empty")
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v < layers:
            raise ValueError(
                f"layer id {v!r} is outside [0, {layers - 1}] for a {layers}-layer target "
                f"(ids are 0-based decoder layers whose output is tapped; {LAYER_ID_CONVENTION})"
            )
    if len(set(ids)) != len(ids):
        raise ValueError(f"layer_ids {ids} has duplicates")
    return [int(v) for v in ids]


def resolve_aux_layer_ids(config: dict, layer_ids: Sequence[int] | None) -> list[int]:
    """The taps of a run: `model.aux_layer_ids` (None = the default for this target), validated
    against the target whose `config.json` is `config`. Every stage resolves them here, so
    extraction, validation and import agree on a wrapped config as on a plain one."""
    layers = num_layers(config)
    return validate_layer_ids(layer_ids or default_aux_layer_ids(layers), layers)


def hf_hidden_index(layer_id: int) -> int:
    """Index into HF `output_hidden_states` (0 = embeddings) of drafter-convention tap `layer_id`."""
    return layer_id + 1


# --------------------------------------------------------------------------- SGLang
def sglang_captured_inputs(model_type: str, sglang_ids: list[int]) -> list[int]:
    """The layer indices `p` whose input SGLang captures (HF `hidden_states[p]`) for the given ids."""
    ids = [int(i) for i in sglang_ids]
    if model_type in FIRST_ID_ONE_FAMILIES and not (ids and ids[0] == 1):
        return ids
    return [i + 1 for i in ids]


def sglang_layer_ids(model_type: str, tap_ids: list[int]) -> list[int]:
    """eyas drafter ids -> the ids to give SGLang (capture and drafter config) for the same taps."""
    taps = [int(v) for v in tap_ids]
    if model_type not in FIRST_ID_ONE_FAMILIES:
        ids = taps
    elif taps and taps[0] == 1:
        ids = taps  # SGLang adds 1 to all of them
    elif taps and taps[0] == 0:
        raise ValueError(
            f"aux_layer_ids {taps}: SGLang cannot capture tap 0 (the output of layer 0) of a "
            f"{model_type} target: its ids [1, ...] mean hidden_states[2, ...] and ids not starting "
            "at 1 are taken as hidden_states indices. Start the taps at 1 or later."
        )
    else:
        ids = [v + 1 for v in taps]  # taken as hidden_states indices as they are
    if sglang_captured_inputs(model_type, ids) != [v + 1 for v in taps]:  # the rule above, checked
        raise AssertionError(f"layer id conversion for {model_type} broke: {taps} -> {ids}")
    return ids


def tap_ids_from_sglang(model_type: str, sglang_ids: list[int]) -> list[int]:
    """Ids read from an SGLang drafter config -> eyas drafter ids."""
    return [p - 1 for p in sglang_captured_inputs(model_type, sglang_ids)]


# --------------------------------------------------------------------------- vLLM
def vllm_layer_ids(tap_ids: list[int]) -> list[int]:
    """eyas drafter ids -> speculators' `eagle_aux_hidden_state_layer_ids` (hidden_states indices)."""
    return [hf_hidden_index(int(v)) for v in tap_ids]


def tap_ids_from_vllm(vllm_ids: list[int]) -> list[int]:
    """speculators' `eagle_aux_hidden_state_layer_ids` -> eyas drafter ids."""
    return [int(i) - 1 for i in vllm_ids]
