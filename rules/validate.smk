# One validation job per hidden store: checked against its token shard, a manifest that training requires.


rule validate:
    input:
        tokens="results/tokens/{split}",
        store="results/hidden/{split}/shard-{shard}.zarr",
        model=model_dir(),
    output:
        manifest="results/hidden/{split}/shard-{shard}.manifest.json",
    log:
        "results/logs/validate/{split}-{shard}.log",
    benchmark:
        "results/benchmarks/validate/{split}-{shard}.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: 8  # blocks of rows read, decoded and scanned at once; the chunk files hashed on the same threads
    resources:
        mem_mb=4000,  # a 4096-token block per thread (~130 MB at K*H = 12288, ~240 MB at H = 7168) + the token shard
        runtime=30,
    params:
        layer_ids=EYAS.model.aux_layer_ids,
        model_id=EYAS.model_id,
        version=STAGE_VERSION["validate"],
    script:
        "../scripts/validate.py"
