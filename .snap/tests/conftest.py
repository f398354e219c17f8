"""Shared test setup.

- Tests marked `gpu` skip cleanly unless torch sees a CUDA/ROCm device.
- `postgres_url` gives a real PostgreSQL URL from TUNER_TEST_POSTGRES_URL (CI starts one with
  scripts/start_postgres.sh); without it the test skips, unless TUNER_REQUIRE_POSTGRES=1 (CI),
  where a missing server is a failure.
- `shared_traces` is the folder of real third-party traces (../shared/traces beside the checkout).
- `needs_cxx`: torch.compile (Inductor) on the CPU compiles C++; such tests skip without one.
- One Triton mode for the whole run, decided here, before any test module imports triton (Triton
  reads TRITON_INTERPRET when a kernel is first defined, so a per-module setting would depend on
  which module happens to load first): TRITON_INTERPRET=1, kernels run on the CPU interpreter,
  unless the caller set it. On a GPU machine run the GPU tests compiled:
  `TRITON_INTERPRET=0 python3 -m pytest -m gpu`. Tests that need the other mode skip and say so.
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"
EXAMPLES = ROOT / "shapes" / "examples"


needs_cxx = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
    reason="torch.compile (Inductor) on the CPU needs a C++ compiler")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get("TUNER_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("TUNER_REQUIRE_POSTGRES") == "1":
            pytest.fail("TUNER_REQUIRE_POSTGRES=1 but TUNER_TEST_POSTGRES_URL is not set")
        pytest.skip("no PostgreSQL server: set TUNER_TEST_POSTGRES_URL (scripts/start_postgres.sh)")
    return url
