"""Foundations every stage stands on, with no stage knowledge: atomic outputs (`atomic`), stage
logging (`logs`), GPU slots (`gpus`), provenance hashes (`provenance`), aux-layer ids (`layer_ids`),
model-dir checks (`model_dir`), the evaluation arithmetic (`acceptance`) and the checks that build
typed settings from plain mappings (`schema`, behind `eyas.config`)."""
