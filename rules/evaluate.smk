# Offline metrics and real speculative decoding on held-out data; SGLang export of the drafter.


rule evaluate:
    input:
        drafter="results/train/drafter",
        conversations="results/prepared/eval.jsonl",
        tokens="results/tokens/eval",
        stores=hidden_stores("eval"),
        model=model_dir(),
    output:
        summary="results/eval/summary.json",
        plot="results/eval/acceptance.png",
    log:
        "results/logs/evaluate.log",
    benchmark:
        "results/benchmarks/evaluate.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: workflow.cores
    resources:
        gpu=use_gpu(EYAS.evaluate.device),
        mem_mb=8000,
        runtime=120,
    params:
        settings=vars(EYAS.evaluate),
        ttt_steps=EYAS.train.ttt_steps,
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["evaluate"],
    script:
        "../scripts/evaluate.py"


rule export_sglang:
    input:
        drafter="results/train/drafter",
    output:
        export=directory("results/export/sglang"),
    log:
        "results/logs/export_sglang.log",
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        version=STAGE_VERSION["export"],
    script:
        "../scripts/export.py"
