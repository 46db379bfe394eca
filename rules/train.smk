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
    threads: all_cores()
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


# The drafter in vLLM speculators format (Eagle3Speculator; aux ids in vLLM's convention).
rule export_speculators:
    input:
        drafter="results/train/drafter",
        model=model_dir(),
    output:
        export=directory("results/export/speculators"),
    log:
        "results/logs/export_speculators.log",
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
