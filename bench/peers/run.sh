#!/usr/bin/env bash
# Peers in the same run (issue 26, item 3): llama.cpp's ggml CPU flash attention, PyTorch CPU SDPA
# and the OpenBLAS standard-attention baseline against ioattn, same shapes, same machine, same
# thread counts. Idempotent; everything it fetches or builds lives under build-peers/.
#
# Environment (all optional):
#   IOATTN_BUILD   ioattn build dir with libioattn.so and bench/bench_cpu (default: <repo>/build;
#                  configured and built there if missing)
#   PYTHON         python with torch, numpy and the ioattn package (default /tmp/pyenv-ops/bin/python
#                  if present, else a venv under build-peers/venv with torch (CPU) + ./python installed)
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python sdist to vendor llama.cpp from (default 0.3.36)
#   LLAMA_CPP_TARBALL  the part of that sdist ggml builds from, made by scripts/device_deps.sh
#                  (.deps/peers/): for a machine that reaches no package registry (the GPU host)
#   S              prefill sequence length (default 4096); ROUNDS (default 5); THREADS ("1 N", N = nproc)
#   SKIP           space-separated subset of "ggml torch blas" to skip
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BP=$ROOT/build-peers
mkdir -p "$BP"
IOATTN_BUILD=${IOATTN_BUILD:-$ROOT/build}
LCP_VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
S=${S:-4096}
ROUNDS=${ROUNDS:-5}
NPROC=$(nproc)
THREADS=${THREADS:-"1 $NPROC"}
SKIP=${SKIP:-}
OUT=$BP/results-$(date -u +%Y%m%dT%H%M%SZ).txt
log() { echo "[peers] $*" >&2; }
skip() { [[ " $SKIP " == *" $1 "* ]]; }

# --- ioattn ------------------------------------------------------------------------------------
if [[ ! -e $IOATTN_BUILD/libioattn.so || ! -x $IOATTN_BUILD/bench/bench_cpu ]]; then
  log "building ioattn in $IOATTN_BUILD"
  cmake -S "$ROOT" -B "$IOATTN_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$IOATTN_BUILD" -j"$NPROC" --target ioattn bench_cpu
fi

# --- python --------------------------------------------------------------------------------------
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x /tmp/pyenv-ops/bin/python ]]; then
    PYTHON=/tmp/pyenv-ops/bin/python
  else
    if [[ ! -x $BP/venv/bin/python ]]; then
      log "creating $BP/venv (torch CPU, numpy, ioattn)"
      python3 -m venv "$BP/venv"
      # PyTorch's CPU-only index is smaller; PyPI's default wheel (CUDA libraries beside it) runs on
      # the CPU the same, for machines that cannot reach that index.
      "$BP/venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch ||
        "$BP/venv/bin/pip" install -q torch
      "$BP/venv/bin/pip" install -q numpy "$ROOT"
    fi
    PYTHON=$BP/venv/bin/python
  fi
fi

# --- llama.cpp's ggml from the llama-cpp-python sdist --------------------------------------------
SDIST=$BP/llama_cpp_python-$LCP_VER.tar.gz
SRC=$BP/llama_cpp_python-$LCP_VER/vendor/llama.cpp
if ! skip ggml; then
  if [[ ! -d $SRC && -n ${LLAMA_CPP_TARBALL:-} ]]; then
    tar -xJf "$LLAMA_CPP_TARBALL" -C "$BP"
  elif [[ ! -d $SRC ]]; then
    if [[ ! -f $SDIST ]]; then
      log "downloading llama-cpp-python $LCP_VER sdist"
      # --no-binary for this package only: ':all:' would also build its build backends from source.
      "$PYTHON" -m pip download -q --no-binary llama-cpp-python --no-deps "llama-cpp-python==$LCP_VER" -d "$BP"
    fi
    tar -xzf "$SDIST" -C "$BP"
  fi
  G=$BP/ggml-build
  if [[ ! -f $G/ggml/src/libggml-cpu.a ]]; then
    log "building ggml (CPU backend only, static, native)"
    # Configured through llama.cpp's top level: ggml/ alone wants ggml.pc.in, which the sdist lacks.
    cmake -S "$SRC" -B "$G" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
      -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$BP/ggml-config.log"
    cmake --build "$G" -j"$NPROC" --target ggml ggml-base ggml-cpu >"$BP/ggml-build.log"
  fi
  LLAMA_COMMIT=$(sed -n 's/.*update llama.cpp to ggml-org\/llama.cpp@\([0-9a-f]*\).*/\1/p' \
    "$BP/llama_cpp_python-$LCP_VER/CHANGELOG.md" | head -1)
  GGML_VER=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)).*/\2/p' "$SRC/ggml/CMakeLists.txt" | paste -sd.)
  GGML_OMP=$(grep -q "Found OpenMP: TRUE" "$BP/ggml-config.log" && echo on || echo off)
  g++ -std=c++20 -O2 -march=native -I"$ROOT/include" -I"$SRC/ggml/include" "$ROOT/bench/peers/ggml_vs_ioattn.cc" \
    -o "$BP/ggml_vs_ioattn" "$G/ggml/src/libggml.a" "$G/ggml/src/libggml-cpu.a" "$G/ggml/src/libggml-base.a" \
    -L"$IOATTN_BUILD" -lioattn -Wl,-rpath,"$IOATTN_BUILD" -fopenmp -lpthread -ldl
fi

# --- header ---------------------------------------------------------------------------------------
{
  echo "# date $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# commit $(git -C "$ROOT" rev-parse HEAD)"
  echo "# cpu $(lscpu | sed -n 's/^Model name: *//p'), $NPROC logical cpus"
  echo "# ioattn hw: $("$IOATTN_BUILD/tools/ioattn" hw 2>/dev/null | sed -n 2p | tr -s ' ')"
  skip ggml || echo "# llama-cpp-python $LCP_VER, llama.cpp $LLAMA_COMMIT, ggml $GGML_VER, OpenMP $GGML_OMP"
  skip torch || echo "# torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
  echo "# S=$S rounds=$ROUNDS threads: $THREADS"
} | tee "$OUT"

# --- ggml vs ioattn ------------------------------------------------------------------------------
if ! skip ggml; then
  for t in $THREADS; do
    for D in 128 64; do
      for c in 0 1; do "$BP/ggml_vs_ioattn" prefill 1 16 "$S" "$D" "$c" "$t" "$ROUNDS"; done
    done
    for B in 1 4; do
      # llama.cpp's cache layout (positions outer) and a head-major one, where ggml's per-head loop
      # reads in address order.
      for layout in bshd bhsd; do
        for hq in 32 8; do "$BP/ggml_vs_ioattn" decode "$B" "$hq" 8 128 32768 "$t" "$ROUNDS" "$layout"; done
      done
    done
  done | tee -a "$OUT"
fi

# --- PyTorch SDPA vs ioattn.attention ------------------------------------------------------------
if ! skip torch; then
  for t in $THREADS; do
    IOATTN_NUM_THREADS=$t OMP_NUM_THREADS=$t "$PYTHON" "$ROOT/bench/peers/torch_sdpa.py" "$t" "$S" "$ROUNDS"
  done | tee -a "$OUT"
fi

# --- OpenBLAS standard attention (bench_cpu's baseline) ------------------------------------------
if ! skip blas; then
  "$IOATTN_BUILD/bench/bench_cpu" --benchmark_filter="standard/D:(64|128)/S:$S/" 2>/dev/null \
    | grep -E "^standard" | sed 's/^/blas /' | tee -a "$OUT"
fi
log "wrote $OUT"
