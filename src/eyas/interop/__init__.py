"""Interop with other tools, outside the Snakemake workflow: SpecForge's offline format and trainer
(`specforge_export`, `specforge_import`, `specforge_train`) and the `eyas` command line (`cli`)."""
