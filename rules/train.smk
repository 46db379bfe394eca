# Train the EAGLE-3 drafter on the train split's hidden stores.


rule train:
    input:
        tokens="results/tokens/train",
        stores=hidden_stores("train"),
        manifests=manifests("train"),
        vocab="results/vocab/draft_vocab.safetensors",
        model=model_dir(),
        heldout_tokens="results/tokens/eval",  # checkpoint choice by simulated tau per epoch
        heldout_stores=hidden_stores("eval"),
    output:
        drafter=directory("results/train/drafter"),
        log_csv="results/train/log.csv",
        epochs="results/train/epochs.csv",
    log:
        "results/logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: job_threads(use_gpu(EYAS.train.device) * EYAS.train.nproc)
    resources:
        gpu=use_gpu(EYAS.train.device) * EYAS.train.nproc,  # one GPU per torchrun process
        mem_mb=8000,  # drafter + optimizer (~0.2 GB at H=576) + target embedding/head + batches
        runtime=240,
    params:
        settings=dataclasses.asdict(EYAS.train),
        model_id=EYAS.model_id,
        version=STAGE_VERSION["train"],
    script:
        "../scripts/train.py"
