# One extraction job per token shard: the target's aux taps and final state into a Zarr store.


rule extract:
    input:
        tokens="results/tokens/{split}",
        model=model_dir(),
    output:
        store=directory("results/hidden/{split}/shard-{shard}.zarr"),
    log:
        "results/logs/extract/{split}-{shard}.log",
    benchmark:
        "results/benchmarks/extract/{split}-{shard}.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: extract_threads()
    resources:
        gpu=extract_gpus(),
        mem_mb=8000,  # the target (fp32 SmolLM2 ~0.6 GB) + a token-budget batch of states + write buffers
        runtime=60,
    params:
        layer_ids=EYAS.model.aux_layer_ids,
        settings=dataclasses.asdict(EYAS.extract),
        engine_settings=dataclasses.asdict(EYAS.sglang),
        model_id=EYAS.model_id,
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["extract"],
    script:
        "../scripts/extract.py"
