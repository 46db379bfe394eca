# Optional (regenerate.enabled): the target's own responses replace the dataset's before tokenize.


rule regenerate:
    input:
        conversations="results/prepared/{split}.jsonl",
        model=model_dir(),
    output:
        conversations="results/regenerated/{split}.jsonl",
        stats="results/regenerated/{split}.stats.json",
    log:
        "results/logs/regenerate/{split}.log",
    benchmark:
        "results/benchmarks/regenerate/{split}.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: job_threads(regenerate_gpus(), per_gpu=2)  # on GPUs: the client and its tokenizer
    resources:
        gpu=regenerate_gpus(),
        mem_mb=8000,  # the target + a batch's KV cache (batch_size x (prompt + max_new_tokens))
        runtime=240,
    params:
        settings=dataclasses.asdict(EYAS.regenerate),
        engine_settings=dataclasses.asdict(EYAS.extract.sglang),
        max_length=EYAS.tokenize.max_length,
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["regenerate"],
    script:
        "../scripts/regenerate.py"
