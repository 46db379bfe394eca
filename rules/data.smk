# Raw prompts -> normalized conversations -> tokenized shards -> draft vocabulary.


rule prepare:
    input:
        data=data_paths(),
    output:
        train="results/prepared/train.jsonl",
        eval="results/prepared/eval.jsonl",
        rejects="results/prepared/rejects.jsonl",
        stats="results/prepared/stats.json",
    log:
        "results/logs/prepare.log",
    benchmark:
        "results/benchmarks/prepare.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        formats=data_formats(),
        settings=dataclasses.asdict(EYAS.data),
        version=STAGE_VERSION["prepare"],
    script:
        "../scripts/prepare.py"


rule tokenize:
    input:
        conversations=conversations_of,
        model=model_dir(),
    output:
        shards=directory("results/tokens/{split}"),
    log:
        "results/logs/tokenize/{split}.log",
    benchmark:
        "results/benchmarks/tokenize/{split}.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: 8  # worker processes rendering the chat template (one for a small split)
    resources:
        mem_mb=6000,  # the split's samples + ~380 MB a worker (torch's import, the tokenizer)
        runtime=20,
    params:
        num_shards=num_shards_of,
        max_length=EYAS.tokenize.max_length,
        model_id=EYAS.model_id,
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["tokenize"],
    script:
        "../scripts/tokenize.py"


rule vocab:
    input:
        tokens="results/tokens/train",
        model=model_dir(),
    output:
        vocab="results/vocab/draft_vocab.safetensors",
        stats="results/vocab/vocab.json",
    log:
        "results/logs/vocab.log",
    benchmark:
        "results/benchmarks/vocab.tsv"
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        draft_vocab_size=EYAS.vocab.draft_vocab_size,
        version=STAGE_VERSION["vocab"],
    script:
        "../scripts/vocab.py"
