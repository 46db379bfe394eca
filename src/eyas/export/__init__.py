"""Export a trained drafter for serving (the export rules): SGLang's `LlamaForCausalLMEagle3` dir
(`sglang`) and a vLLM speculators `Eagle3Speculator` dir (`speculators`), both checked against the
weight-name contract (`tensors`) and readable back as the engines read them (`reload`). Import from
here."""

from eyas.export.reload import load_export
from eyas.export.sglang import PROVENANCE_KEYS, export_sglang, sglang_config
from eyas.export.speculators import (
    SPECULATORS_ARCH,
    VERIFIER_KEY,
    check_verifier,
    export_speculators,
    speculators_config,
)
from eyas.export.tensors import (
    EXPORT_KINDS,
    expected_speculators_tensors,
    expected_tensors,
    sglang_tensors,
    speculators_tensors,
    validate_tensors,
)

__all__ = [
    "EXPORT_KINDS",
    "PROVENANCE_KEYS",
    "SPECULATORS_ARCH",
    "VERIFIER_KEY",
    "check_verifier",
    "expected_speculators_tensors",
    "expected_tensors",
    "export_sglang",
    "export_speculators",
    "load_export",
    "sglang_config",
    "sglang_tensors",
    "speculators_config",
    "speculators_tensors",
    "validate_tensors",
]
