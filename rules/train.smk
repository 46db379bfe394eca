# Train the EAGLE-3 drafter on the train split's hidden stores.


rule train:
    input:
        tokens="results/tokens/train",
        stores=hidden_stores("train"),
        vocab="results/vocab/draft_vocab.safetensors",
        model=model_dir(),
    output:
        drafter=directory("results/train/drafter"),
        log_csv="results/train/log.csv",
    log:
        "results/logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: all_cores()
    resources:
        gpu=use_gpu(EYAS.train.device),
        mem_mb=8000,  # drafter + optimizer (~0.2 GB at H=576) + target embedding/head + batches
        runtime=240,
    params:
        settings=vars(EYAS.train),
        model_id=EYAS.model_id,
        version=STAGE_VERSION["train"],
    script:
        "../scripts/train.py"
