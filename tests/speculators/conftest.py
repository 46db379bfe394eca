"""tests/speculators/ runs in its own environment (.venv-speculators, made by install_env.sh: `make
test-speculators`) where the real speculators 0.9.0 imports on CPU. In the main .venv, which has no
speculators, the folder is one skip line (test_load_export.py skips itself at module level).

Offline on purpose: the export must load without the Hugging Face Hub. huggingface_hub reads
HF_HUB_OFFLINE once, when it is first imported, so it is set here, before any test module imports it;
only where speculators is installed (the distribution's metadata, nothing imported), so that a main
suite collecting this folder keeps its environment as it was.
"""

import os
from importlib.metadata import PackageNotFoundError, version

try:
    version("speculators")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
except PackageNotFoundError:
    pass


def pytest_configure(config):
    # speculators drafts with flex attention; on CPU without torch.compile it runs unfused (correct, slow).
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")
