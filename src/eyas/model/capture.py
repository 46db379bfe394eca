"""Capture of the target's taps by forward hooks: which modules of a HF model the taps are.

Drafter tap `v` is the OUTPUT of 0-based decoder layer `v` (HF `hidden_states[v + 1]`, layer_ids.py);
the final state is the output of the final norm. Used by extraction and by speculative decoding alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from eyas.core.layer_ids import validate_layer_ids


def base_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The CausalLM's base model (embeddings, layers, final norm), so the lm_head need not run."""
    decoder = getattr(model, "model", None)
    if decoder is not None and not hasattr(decoder, "layers") and hasattr(model, "get_decoder"):
        # a multimodal wrapper: its language model's decoder (transformers' Kimi-K2.5:
        # model.language_model, a DeepseekV3Model), which a text-only prompt runs alone
        decoder = model.get_decoder()
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise TypeError(
            f"{type(model).__name__} has no .model.layers / .model.norm (Llama-style layout); "
            "its taps cannot be hooked"
        )
    return decoder


class TapCapture:
    """Forward hooks keeping the last forward's outputs of the tapped layers (and of the final norm).

    A context manager: the hooks are removed on exit.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int], *, final: bool = False):
        decoder = base_decoder(model) if hasattr(model, "model") else model
        self.layer_ids = validate_layer_ids(layer_ids, len(decoder.layers))
        self.final = final
        self.outputs: dict[str, torch.Tensor] = {}
        modules = {f"layer{v}": decoder.layers[v] for v in self.layer_ids}
        if final:
            modules["final"] = decoder.norm
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name: str) -> Callable:
        def hook(module, args, output) -> None:
            # Older transformers decoder layers return a tuple (hidden, ...); newer ones the tensor.
            self.outputs[name] = output[0] if isinstance(output, tuple) else output

        return hook

    def take(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """(taps in layer_ids order, each [B, T, H]; final [B, T, H] or None); clears the references."""
        outputs, self.outputs = self.outputs, {}
        missing = [v for v in self.layer_ids if f"layer{v}" not in outputs]
        if missing or (self.final and "final" not in outputs):
            raise RuntimeError(f"taps {missing or ['final']} were not captured (no forward ran?)")
        return [outputs[f"layer{v}"] for v in self.layer_ids], outputs.get("final")

    def take_concat(self) -> torch.Tensor:
        """The taps concatenated in layer_ids order, as SGLang lays them out: [B, T, K*H]."""
        taps, _ = self.take()
        return torch.cat(taps, dim=-1)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> TapCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
