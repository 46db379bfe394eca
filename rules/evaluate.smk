# Offline metrics and real speculative decoding on each evaluation set; SGLang export of the drafter.


rule fetch_humaneval:
    output:
        problems="results/assets/eval/humaneval.jsonl",
    log:
        "results/logs/fetch_humaneval.log",
    conda:
        "../envs/eyas.yaml"
    resources:
        mem_mb=500,
        runtime=10,
    params:
        version=STAGE_VERSION["assets"],
    script:
        "../scripts/fetch_humaneval.py"


rule evaluate:
    input:
        drafter="results/train/drafter",
        sets=eval_set_paths(),
        baselines=[b.path for b in EYAS.evaluate.baselines],
        tokens="results/tokens/eval",
        stores=hidden_stores("eval"),
        model=model_dir(),
    output:
        summary=report(
            "results/eval/summary.json", caption="../report/summary.rst", category="Evaluation"
        ),
        plot=report(
            "results/eval/acceptance.png", caption="../report/acceptance.rst", category="Evaluation"
        ),
    log:
        "results/logs/evaluate.log",
    benchmark:
        "results/benchmarks/evaluate.tsv"
    conda:
        "../envs/eyas.yaml"
    threads: all_cores()
    resources:
        gpu=use_gpu(EYAS.evaluate.device),
        mem_mb=8000,
        runtime=120,
    params:
        settings=vars(EYAS.evaluate) | {"baselines": None},
        set_names=EYAS.evaluate.sets,
        baseline_names=[b.name for b in EYAS.evaluate.baselines],
        ttt_steps=EYAS.train.ttt_steps,
        trust_remote_code=EYAS.model.trust_remote_code,
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


rule export_sglang:
    input:
        drafter="results/train/drafter",
        model=model_dir(),
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
