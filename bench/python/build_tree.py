"""The ioattn package for the benchmark scripts: this checkout's python/ioattn sources with the
extension of the CMake tree IOATTN_BUILD_DIR names (configured with -DIOATTN_PYTHON=ON), as
python/tests/conftest.py loads it; without IOATTN_BUILD_DIR, the installed package."""
import importlib
import importlib.util
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def import_ioattn(*submodules):
    """ioattn, after importing ioattn.<name> for each of `submodules` (ops registers the torch ops)."""
    build = os.environ.get("IOATTN_BUILD_DIR")
    if build:
        source = REPO / "python" / "ioattn"
        ext_dir = pathlib.Path(build).resolve() / "python" / "ioattn"
        spec = importlib.util.spec_from_file_location(
            "ioattn", source / "__init__.py", submodule_search_locations=[str(source), str(ext_dir)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["ioattn"] = module
        spec.loader.exec_module(module)
    import ioattn

    for name in submodules:
        importlib.import_module("ioattn." + name)
    return ioattn
