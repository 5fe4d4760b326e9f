#!/usr/bin/env bash
# Installs what ioattn needs from Debian 12's packages (only what is missing), as root, and the
# pinned CUTLASS headers the sm_90a kernels build on (scripts/cutlass_headers.sh, into .deps/);
# with arguments, those packages instead (scripts/ci_arm.sh's cross toolchain).
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libhwy-dev libtbb-dev catch2 libbenchmark-dev
          libopenblas-dev nlohmann-json3-dev python3-pip)
if (($#)); then
  packages=("$@")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ioattn setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ((!$#)); then
  "$(dirname "$0")/cutlass_headers.sh"
fi
