# eyas: EAGLE-3 drafters from a target LLM's hidden states.
# prompts -> tokens -> hidden states (Zarr) -> drafter -> evaluation + SGLang export.
import os

from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "config", "config.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/assets.smk"
include: "rules/data.smk"
include: "rules/regenerate.smk"
include: "rules/extract.smk"
include: "rules/validate.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/export.smk"


rule all:
    default_target: True
    input:
        get_final_output(),


onsuccess:
    print_report_location()
