"""Regenerate each conversation's last assistant turn with the target (optional stage)."""

import json

import torch

from eyas.atomic import atomic_file
from eyas.data.regenerate import regenerate_split
from eyas.logs import setup_stage_logging
from eyas.target import load_target, load_tokenizer, resolve_device

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "regenerate")
settings = sm.params.settings
torch.set_num_threads(sm.threads)
device = resolve_device(settings["device"])
tokenizer = load_tokenizer(sm.input.model, trust_remote_code=sm.params.trust_remote_code)
model = load_target(sm.input.model, device=device, trust_remote_code=sm.params.trust_remote_code)
stats = regenerate_split(
    sm.input.conversations,
    sm.output.conversations,
    model,
    tokenizer,
    max_new_tokens=settings["max_new_tokens"],
    batch_size=settings["batch_size"],
    # the regenerated sample must still fit tokenize's max_length
    max_prompt_length=sm.params.max_length - settings["max_new_tokens"],
    temperature=settings["temperature"],
    seed=settings["seed"],
)
with atomic_file(sm.output.stats) as fh:
    json.dump(stats, fh, indent=2)
log.info("regenerate %s: %s", sm.wildcards.split, json.dumps(stats))
