"""Scripts of rules that start an SGLang engine survive being re-imported by the engine's spawned
scheduler: multiprocessing's spawn start method runs the parent's main script again as `__mp_main__`
(CPython `multiprocessing/spawn.py`, `_fixup_main_from_path`), where Snakemake's `snakemake` object does
not exist. A script whose body runs at import dies there, and so does the engine, at start-up."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "scripts"
ENGINE_SCRIPTS = ["extract.py", "regenerate.py", "served.py", "prompts.py"]  # rules that may start SGLang


@pytest.mark.parametrize("name", ENGINE_SCRIPTS)
def test_engine_scripts_do_nothing_when_reimported_by_spawn(name):
    namespace = runpy.run_path(str(SCRIPTS / name), run_name="__mp_main__")
    assert callable(namespace["main"])


def test_a_script_with_an_unguarded_body_fails_that_import(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("sm = snakemake  # noqa: F821\n")
    with pytest.raises(NameError, match="snakemake"):
        runpy.run_path(str(script), run_name="__mp_main__")
