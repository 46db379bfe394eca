# The trained drafter exported for serving: SGLang's dir and vLLM speculators' dir (eyas.export).


rule export_sglang:
    input:
        drafter="results/train/drafter",
        model=model_dir(),
    output:
        export=directory("results/export/sglang"),
    log:
        "results/logs/export_sglang.log",
    benchmark:
        "results/benchmarks/export_sglang.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        version=STAGE_VERSION["export"],
    script:
        "../scripts/export_sglang.py"


# The drafter in vLLM speculators format (Eagle3Speculator; aux ids in vLLM's convention).
rule export_speculators:
    input:
        drafter="results/train/drafter",
        model=model_dir(),
    output:
        export=directory("results/export/speculators"),
    log:
        "results/logs/export_speculators.log",
    benchmark:
        "results/benchmarks/export_speculators.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=2000,  # one copy of the drafter weights
        runtime=10,
    params:
        verifier=EYAS.export.verifier,  # null: the script writes the model dir's absolute path
        speculative_tokens=EYAS.evaluate.num_draft_tokens[0],
        version=STAGE_VERSION["export"],
        speculators_format=2,  # 2: embed_tokens.weight included, verifier checked (issue 17)
    script:
        "../scripts/export_speculators.py"
