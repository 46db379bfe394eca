# Real speculative decoding, one job per evaluation set (HF) or one served job (SGLang); offline metrics, the summary and the report figures.


rule specdec:
    input:
        drafter="results/train/drafter",
        prompts=eval_set_path,
        baselines=[b.path for b in EYAS.evaluate.baselines],
        model=model_dir(),
    output:
        json="results/eval/specdec/{set}.json",
    log:
        "results/logs/specdec/{set}.log",
    benchmark:
        "results/benchmarks/specdec/{set}.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: specdec_threads()
    resources:
        gpu=use_gpu(EYAS.evaluate.device),
        mem_mb=4000,  # fp32 target + drafters + KV caches; default job: max RSS 1.3 GB per set
        runtime=60,  # minutes; the default job's sets take 3-4 min each on 1 CPU core
    params:
        settings=specdec_settings,
        set_format=eval_set_format,
        baseline_names=[b.name for b in EYAS.evaluate.baselines],
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["evaluate"],
    script:
        "../scripts/specdec.py"


rule served:
    input:
        drafter="results/train/drafter",
        export="results/export/sglang",
        prompts=list(eval_set_files().values()),
        baselines=[b.path for b in EYAS.evaluate.baselines],
        model=model_dir(),
    output:
        json="results/eval/served.json",
    log:
        "results/logs/served.log",
    benchmark:
        "results/benchmarks/served.tsv"
    conda:
        "../envs/sglang.yaml"
    # One job for every set, drafter and k: one plain engine, then one EAGLE-3 engine that serves each
    # drafter at each k in turn (SmolLM2 on an H200: each engine starts in ~55 s; bench/README.md).
    threads: 2
    resources:
        gpu=EYAS.sglang.tp_size,
        mem_mb=16000,  # the job process: tokenizer, drafters for the exports; the engine lives on the GPUs
        runtime=120,
    params:
        settings=dataclasses.asdict(EYAS.evaluate),
        engine_settings=dataclasses.asdict(EYAS.sglang),
        set_names=EYAS.evaluate.set_names,
        set_formats=eval_set_formats(),
        baseline_names=[b.name for b in EYAS.evaluate.baselines],
        trust_remote_code=EYAS.model.trust_remote_code,
        version=STAGE_VERSION["evaluate"],
    script:
        "../scripts/served.py"


rule evaluate:
    input:
        drafter="results/train/drafter",
        specdec=specdec_jsons(),
        served=served_json(),
        baselines=[b.path for b in EYAS.evaluate.baselines],
        tokens="results/tokens/eval",
        stores=hidden_stores("eval"),
        model=model_dir(),
    output:
        summary=report("results/eval/summary.json", caption="../report/summary.rst", category="Evaluation"),
        plot=report("results/eval/acceptance.png", caption="../report/acceptance.rst", category="Evaluation"),
    log:
        "results/logs/evaluate.log",
    benchmark:
        "results/benchmarks/evaluate.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: job_threads(use_gpu(EYAS.evaluate.device))
    resources:
        gpu=use_gpu(EYAS.evaluate.device),
        mem_mb=3000,  # offline metrics over the held-out stores: 1.3 GB max RSS in the default job
        runtime=60,  # minutes; 31 s in the default job (merge + offline metrics of 2 drafters)
    params:
        settings=dataclasses.asdict(EYAS.evaluate),
        set_names=EYAS.evaluate.set_names if uses_hf_evaluation() else [],
        baseline_names=[b.name for b in EYAS.evaluate.baselines],
        ttt_steps=EYAS.train.ttt_steps,
        version=STAGE_VERSION["evaluate"],
    script:
        "../scripts/evaluate.py"


rule report_figures:
    input:
        summary="results/eval/summary.json",
        log_csv="results/train/log.csv",
        benchmarks=benchmark_files(),
    output:
        table=report("results/eval/tau_table.tsv", caption="../report/tau_table.rst", category="Evaluation"),
        tau=report("results/eval/tau.png", caption="../report/tau.rst", category="Evaluation"),
        loss=report("results/eval/loss.png", caption="../report/loss.rst", category="Training"),
        throughput_table=report(
            "results/eval/throughput.tsv", caption="../report/throughput.rst", category="Throughput"
        ),
        throughput=report(
            "results/eval/throughput.png", caption="../report/throughput.rst", category="Throughput"
        ),
    log:
        "results/logs/report_figures.log",
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=1000,  # matplotlib and a few small files
        runtime=5,
    params:
        version=STAGE_VERSION["evaluate"],
    script:
        "../scripts/report_figures.py"
