"""Scripts of rules that start processes survive being re-imported by them: multiprocessing's spawn
start method runs the parent's main script again as `__mp_main__` in each child (CPython
`multiprocessing/spawn.py`, `_fixup_main_from_path`), and a forkserver preloads it (`__main__` is its
default preload, `multiprocessing/forkserver.py`), where Snakemake's `snakemake` object does not exist.
A script whose body runs at import dies there: an SGLang engine at start-up, the trainer's reader
processes (`train.loader_processes`) with a broken pipe to the forkserver at the first batch."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "scripts"
# rules that may start SGLang (spawn), tokenize's workers (spawn) and the trainer's readers (forkserver)
PROCESS_SCRIPTS = ["extract.py", "regenerate.py", "served.py", "prompts.py", "tokenize.py", "train.py"]


@pytest.mark.parametrize("name", PROCESS_SCRIPTS)
def test_process_scripts_do_nothing_when_reimported_by_a_child(name):
    namespace = runpy.run_path(str(SCRIPTS / name), run_name="__mp_main__")
    assert callable(namespace["main"])


def test_a_script_with_an_unguarded_body_fails_that_import(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("sm = snakemake  # noqa: F821\n")
    with pytest.raises(NameError, match="snakemake"):
        runpy.run_path(str(script), run_name="__mp_main__")
