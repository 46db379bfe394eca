"""Report figures: tau table and plot per set and drafter, training loss curve, stage throughput."""

import json
import os

from eyas.core.logs import setup_stage_logging
from eyas.evaluate.report import (
    plot_loss,
    plot_tau,
    plot_throughput,
    read_benchmarks,
    read_loss_log,
    tau_table,
    write_tsv,
)

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "report_figures")
with open(sm.input.summary) as fh:
    summary = json.load(fh)
write_tsv(tau_table(summary), sm.output.table)
plot_tau(summary, sm.output.tau)
plot_loss(read_loss_log(sm.input.log_csv), sm.output.loss)
benchmarks = list(sm.input.benchmarks)
stages = read_benchmarks(os.path.commonpath(benchmarks), benchmarks)
write_tsv(stages, sm.output.throughput_table)
plot_throughput(stages, sm.output.throughput)
log.info("report figures written: %d table rows, %d stages", len(summary["table"]), len(stages))
