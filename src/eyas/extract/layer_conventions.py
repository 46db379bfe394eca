"""Aux-layer id conventions: eyas's drafter ids <-> the ids SGLang takes, per model family.

eyas (docs/design.md): tap `v` is the output of 0-based decoder layer `v`, i.e. HF
`hidden_states[v + 1]`. SGLang's `set_eagle3_layers_to_capture(ids)` captures the *input* of layer
`p` (= HF `hidden_states[p]`) for each `p` in `layers_to_capture`, which the model class derives from
the ids it is given (read in the 0.5.23 sources, `srt/models/*.py`):

- Llama, Qwen, Gemma, GLM-4 MoE, gpt-oss and most others: `p = id + 1` for every id.
- DeepSeek-V2/V3/V3.2, Kimi-K2/K2.5 (a DeepSeek-V3 language model inside) and GLM-4 MoE Lite:
  `p = id + 1` only when `ids[0] == 1`, else `p = id` (a heuristic for checkpoints trained with
  either convention).

The same ids go to the capture engine and into the exported drafter's `eagle_config`, because the
serving engine applies the same rule when it loads the drafter. This module is the one place that
knows it; it imports nothing from SGLang so the rule is testable anywhere.
"""

from __future__ import annotations

# HF `model_type`s whose SGLang model class adds 1 only when the first id is 1.
FIRST_ID_ONE_FAMILIES = frozenset(
    {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25", "glm4_moe_lite"}
)


def text_model_type(config: dict) -> str:
    """The model_type whose class does the capture: multimodal wrappers (Kimi-K2.5) delegate to their
    language model, so its type decides."""
    text = config.get("text_config") or {}
    return str(text.get("model_type") or config.get("model_type") or "")


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
