"""Finds the ioattn package for the tests.

- IOATTN_BUILD_DIR=<a CMake build tree configured with -DIOATTN_PYTHON=ON>: this checkout's
  python/ioattn sources with that tree's extension (python/ioattn/_ext*.so), no install needed;
- else the installed package (pip install .).

IOATTN_CLI=<path to the ioattn binary of the same tree> turns on the comparisons of
ioattn.plan()/traffic()/explain()/hw() with the command line's --json output.
"""

import importlib.util
import os
import pathlib
import sys
import zlib

import numpy as np
import pytest

_SOURCE = pathlib.Path(__file__).resolve().parent.parent / "ioattn"


def _load_from_build_tree(build_dir):
    ext_dir = pathlib.Path(build_dir).resolve() / "python" / "ioattn"
    if not any(ext_dir.glob("_ext*")):
        raise ImportError(f"IOATTN_BUILD_DIR={build_dir}: no {ext_dir}/_ext*; configure it with -DIOATTN_PYTHON=ON")
    spec = importlib.util.spec_from_file_location(
        "ioattn", _SOURCE / "__init__.py", submodule_search_locations=[str(_SOURCE), str(ext_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["ioattn"] = module
    spec.loader.exec_module(module)


if os.environ.get("IOATTN_BUILD_DIR"):
    # Absolute, for the tests' subprocesses that run elsewhere.
    os.environ["IOATTN_BUILD_DIR"] = str(pathlib.Path(os.environ["IOATTN_BUILD_DIR"]).resolve())
    _load_from_build_tree(os.environ["IOATTN_BUILD_DIR"])
else:
    try:
        import ioattn  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "ioattn is not importable: `pip install .` from the repository root, or set IOATTN_BUILD_DIR to a "
            f"build tree configured with -DIOATTN_PYTHON=ON ({e})"
        ) from e


def pytest_report_header(config):
    import ioattn

    return f"ioattn {ioattn.__version__} from {pathlib.Path(ioattn.__file__).parent} (_ext: {ioattn._ext.__file__})"


@pytest.fixture
def rng(request):
    # A seed per test, stable across runs, so a failure reproduces.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def cli():
    path = os.environ.get("IOATTN_CLI")
    if not path:
        pytest.skip("IOATTN_CLI is not set: no command line binary to compare with (set it to build/tools/ioattn)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"IOATTN_CLI={path} is not an executable")
    return path
