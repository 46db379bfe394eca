# Optional (regenerate.enabled): the target's own responses replace the dataset's before tokenize.
# One job for both splits: its engines start once and each turn round is one call over both.


rule regenerate:
    input:
        conversations=expand("results/prepared/{split}.jsonl", split=SPLITS),
        model=model_dir(),
    output:
        conversations=expand("results/regenerated/{split}.jsonl", split=SPLITS),
        stats=expand("results/regenerated/{split}.stats.json", split=SPLITS),
    log:
        "results/logs/regenerate.log",
    benchmark:
        "results/benchmarks/regenerate.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: job_threads(regenerate_gpus(), per_gpu=2)  # on GPUs: the client and its tokenizer
    resources:
        gpu=regenerate_gpus(),
        mem_mb=8000,  # the target + a batch's KV cache (batch_size x (prompt + max_new_tokens))
        runtime=240,
    params:
        settings=dataclasses.asdict(EYAS.regenerate),
        engine_settings=dataclasses.asdict(EYAS.sglang),
        max_length=EYAS.tokenize.max_length,
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["regenerate"],
    script:
        "../scripts/regenerate.py"


# The `target` data source (data.inputs `{source: target}`): user turns the target writes itself.
rule prompts:
    input:
        model=model_dir(),
        tool_files=prompt_tool_files(),
    output:
        prompts="results/prompts/target.jsonl",
        rejects="results/prompts/target.rejects.jsonl",
        stats="results/prompts/target.stats.json",
    log:
        "results/logs/prompts.log",
    benchmark:
        "results/benchmarks/prompts.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: job_threads(prompt_gpus(), per_gpu=2)  # on GPUs: the client, its tokenizer and filters
    resources:
        gpu=prompt_gpus(),
        mem_mb=8000,  # the target + a batch's KV cache (batch_size x (prompt + max_new_tokens))
        runtime=240,
    params:
        settings=dataclasses.asdict(EYAS.prompts),
        # answers between user turns (turns > 1) and the generation engine's sizing: only these
        # regenerate settings apply
        answer_settings={
            "max_new_tokens": EYAS.regenerate.max_new_tokens,
            "temperature": EYAS.regenerate.temperature,
            "engine": dataclasses.asdict(EYAS.regenerate.engine),
        },
        engine_settings=dataclasses.asdict(EYAS.sglang),
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["prompts"],
    script:
        "../scripts/prompts.py"
