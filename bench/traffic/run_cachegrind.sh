#!/usr/bin/env bash
# Records cachegrind runs of bench/traffic/traffic_run into bench/traffic/samples/cpu/, one file
# per (kernel, shape, calls): the geometry line, the driver's plan line and valgrind's summary.
#   bench/traffic/run_cachegrind.sh BUILD_DIR [GRID_FILE]
# GRID_FILE lines: "heads seqlen dim dtype" (default: the grid below). The flash kernel runs
# through ioattn_forward with the plan the library makes for zen3 (IOATTN_HW_PROFILE, whose L1d and
# L2 cachegrind simulates), once per count in CALLS (default "1 2": a cold call, and two calls, whose
# difference is the steady state); the standard baseline once. Every shape also gets a `none` run,
# which the parsers subtract. KERNELS (default "flash standard") picks the kernels. JOBS runs at a
# time (default 2; pin the whole script with taskset to keep them on chosen cores).
# CG_OUT_DIR=DIR keeps each run's cachegrind.out there, for per-function misses (cg_annotate).
# SAMPLES_OUT=DIR writes the samples there instead of bench/traffic/samples/cpu.
set -euo pipefail
build=${1:?usage: run_cachegrind.sh BUILD_DIR [GRID_FILE]}
here=$(cd "$(dirname "$0")" && pwd)
out=${SAMPLES_OUT:-$here/samples/cpu}
driver=$(cd "$build" && pwd)/bench/traffic/traffic_run
[[ -x $driver ]] || { echo "run_cachegrind.sh: $driver not built (ninja traffic_run)" >&2; exit 2; }
# zen3's L1d (32 KiB, 8-way, 64 B lines) and L2 (512 KiB, 8-way) as cachegrind's D1 and LL.
D1=32768,8,64
LL=524288,8,64
export IOATTN_HW_PROFILE=zen3
mkdir -p "$out"
grid() {
  if [[ $# -gt 0 ]]; then grep -v '^#' "$1"; return; fi
  # The recorded grid (bench/traffic/samples/README.md): one, two and four heads (one head runs
  # head mode on one thread, as does every shape with two or more query tiles per head).
  for s in 512 1024 2048 4096; do echo "1 $s 64 f32"; done
  for s in 512 1024 2048; do echo "1 $s 128 f32"; done
  echo "2 1024 64 f32"
  echo "2 512 128 f32"
  for s in 512 1024; do echo "4 $s 64 f32"; done
  echo "4 512 128 f32"
  echo "1 512 64 bf16"
}
jobs_file=$(mktemp)
grid "${@:2}" | while read -r h s d t; do
  echo "none $h $s $d $t 0 1" >>"$jobs_file"
  for k in ${KERNELS:-flash standard}; do
    for c in 0 1; do
      if [[ $k == flash ]]; then
        for n in ${CALLS:-1 2}; do echo "$k $h $s $d $t $c $n" >>"$jobs_file"; done
      else
        echo "$k $h $s $d $t $c 1" >>"$jobs_file"
      fi
    done
  done
done
run_one() {
  local k=$1 h=$2 s=$3 d=$4 t=$5 c=$6 n=$7 name flags=()
  name=${k}_h${h}_s${s}_d${d}_${t}
  if [[ $c == 1 ]]; then name+=_causal; flags=(--causal); fi
  if [[ $n != 1 ]]; then name+=_calls$n; fi
  {
    echo "ioattn-cachegrind D1=$D1 LL=$LL valgrind=$(valgrind --version) date=$(date -u +%FT%TZ)"
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 valgrind --tool=cachegrind --cache-sim=yes --D1=$D1 --LL=$LL \
      --cachegrind-out-file="${CG_OUT_DIR:-/dev/null}${CG_OUT_DIR:+/$name.out}" "$driver" --kernel "$k" --heads "$h" --seqlen "$s" --dim "$d" \
      --dtype "$t" --calls "$n" "${flags[@]}" 2>&1
  } >"$out/$name.txt.tmp"
  mv "$out/$name.txt.tmp" "$out/$name.txt"
  echo "$name done"
}
export -f run_one
export D1 LL driver out CG_OUT_DIR
xargs -P "${JOBS:-2}" -L 1 bash -c 'run_one "$@"' _ <"$jobs_file"
rm -f "$jobs_file"
