"""tests/sglang/ runs in the second environment (.venv-sglang, made by install_env.sh: `make test-sglang`)
where a real sglang imports on CPU. In the main .venv, which has no sglang, the folder is one skip line:
test_real_classes.py skips itself at module level and every other module here is left uncollected (they
import sglang at module level, which would be a collection error)."""

from pathlib import Path

try:
    # "sglang.srt", not "sglang": under pytest the tests/ folder is on sys.path, so a bare `import sglang`
    # finds this folder as a namespace package even where no sglang is installed.
    import sglang.srt  # noqa: F401

    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

if not HAVE_SGLANG:
    collect_ignore = [
        p.name for p in Path(__file__).parent.glob("test_*.py") if p.name != "test_real_classes.py"
    ]


def pytest_configure(config):
    # Import-time noise: sglang's CUDA-only kernels (AWQ, GGUF, Triton) fall back on CPU; sentencepiece's
    # SWIG types have no __module__.
    config.addinivalue_line("filterwarnings", r"ignore::UserWarning:sglang\..*")
    config.addinivalue_line("filterwarnings", "ignore:builtin type Swig:DeprecationWarning")
