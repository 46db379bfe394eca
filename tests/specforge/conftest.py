"""tests/specforge/ runs in its own environment (.venv-specforge, made by install_env.sh: `make
test-specforge`) where the real SpecForge 0.2.0 (PyPI `specforge`, installed with --no-deps) and the
transformers it pins (5.8.1) import on CPU. In the main .venv, which has no specforge, the folder is one
skip line (test_specforge_trainer.py skips itself at module level).

Offline: nothing here touches the Hugging Face Hub (every model is a local dir). SpecForge's
torch.compile'd helpers run uncompiled, to keep the CPU tests short (TORCH_COMPILE_DISABLE, read when
torch._dynamo is first imported, which `import torch` does not do); the GPU bench compiles them.
"""

import os
from importlib.metadata import PackageNotFoundError, version

try:
    version("specforge")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["TORCH_COMPILE_DISABLE"] = "1"
except PackageNotFoundError:
    pass


def pytest_configure(config):
    # specforge/modeling/draft/llama3_eagle.py warns at import that the optional flash_attn is absent;
    # the tests use the sdpa backend.
    config.addinivalue_line("filterwarnings", "ignore:flash_attn is not found")
