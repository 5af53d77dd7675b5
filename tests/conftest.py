"""Shared pytest setup for the Celeris suite.

The environment is set first, before anything can import triton, transformers or gradio:
Triton kernels run on CPU tensors only under ``TRITON_INTERPRET=1`` and that must be set
before the ``@triton.jit`` decorators run; nothing may reach the network.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any `import triton`
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import functools  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:
        return
    # Keep CPU runs polite on small shared machines; override with CELERIS_TEST_THREADS.
    torch.set_num_threads(int(os.environ.get("CELERIS_TEST_THREADS", "2")))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not _cuda_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if item.get_closest_marker("browser") is not None and not os.path.exists(CHROMIUM):
        message = (f"browser test needs Chromium at {CHROMIUM} "
                   "(Debian/Ubuntu: apt-get install -y chromium)")
        if _in_ci():
            pytest.fail(f"{message}; CI=true, so a missing browser is a failure, not a skip",
                        pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Path of the system Chromium for Playwright (``executable_path=...``)."""
    return CHROMIUM
