#!/usr/bin/env bash
# Unpacks the C++ headers of CUTLASS and CuTe, which the sm_90a kernels (gpu/sm90/) build on, into
# .deps/cutlass/include (git-ignored), where CMake looks for them first. They come from the pinned
# `nvidia-cutlass` wheel on PyPI: downloaded into .deps/wheels unless it is already there, so the
# GPU machine, which reaches no registry, unpacks the copy scripts/device_deps.sh carried over.
# Only the headers are unpacked: the wheel's Python package needs cuda-python and scipy, which
# nothing here uses.
set -euo pipefail
version=4.2.0.0
if [[ ${1:-} == --version ]]; then
  echo "$version"
  exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=$root/.deps/wheels/nvidia_cutlass-$version-py3-none-any.whl
dest=$root/.deps/cutlass
if [[ -f "$dest/VERSION" && $(cat "$dest/VERSION") == "$version" ]]; then
  exit 0
fi
mkdir -p "$root/.deps/wheels"
if [[ ! -f "$wheel" ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/.deps/wheels" "nvidia-cutlass==$version"
fi
rm -rf "$dest"
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = dest / "include" / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(name))
PY
echo "$version" >"$dest/VERSION"
echo "cutlass_headers: CUTLASS $version headers in $dest/include"
