#!/usr/bin/env bash
# One call on the GPU machine: build the whole tree there (library, CLI, every test, every
# benchmark), the test suite through ctest against that machine's Catch2 3, GPU tests,
# compute-sanitizer (memcheck, racecheck, synccheck) over every GPU test binary, the CPU tests on
# that host's AVX-512 cores, and the benchmark beside PyTorch's SDPA backends. Everything printed
# also lands in $OUT (default ./out): build.txt, device.txt, ctest.txt, gpu_test.txt, sanitize.txt,
# cpu_test.txt, python_test.txt, python_wheel.txt, bench_ioattn.jsonl, bench_table.md, bench_peers.json,
# bench_decode.jsonl, bench_decode_table.md, bench_decode_peers.json, and with the traffic step
# ncu.tgz.
#
# The build uses the Debian packages carried in .deps/debs, unpacked into a prefix (Highway,
# nlohmann_json, OpenBLAS: that machine's Ubuntu lacks Highway), and the machine's own Catch2 3
# and Google Benchmark. It always builds everything: Debian 12 here has Catch2 2, so this is where
# the tests meet Catch2 3, and a run that built only named targets once hid a test tree that did
# not compile there.
#
#   IOATTN_STEPS="ctest test sanitize cpu python bench decode"
#                                       which steps to run after the build (default: all seven;
#                                       decode is the split-KV decode beside SDPA, B = 8, D = 128,
#                                       contiguous and in pages of 16 keys); add "traffic" for
#                                       bench/traffic/gpu_ncu.sh's ioattn grid with SPLIT=1 (about a
#                                       minute), packed into ncu.tgz: the run tool returns only a
#                                       few files, and the grid is 20 samples
#   IOATTN_GPU_TESTS="test_gpu_forward test_gpu_sm90 test_gpu_inference test_gpu_faults"
#                                       GPU test binaries for the test and sanitize steps
#   IOATTN_SANITIZE_TOOLS="memcheck racecheck synccheck"
#   IOATTN_SANITIZE_TIMEOUT=600         seconds per sanitizer run (a run cut off counts as failed)
#   IOATTN_TEST_TIMEOUT=300             seconds per GPU test binary: a kernel that hangs (a barrier
#                                       waited on and never arrived at) must not hold the lease
#   IOATTN_SANITIZE_PARALLEL=1          run all sanitizer runs at once (one GPU, many processes)
#   IOATTN_CPU_TESTS="test_cpu_forward test_cpu_edge test_cpu_decode test_inference_cpu test_cpu_threads"
#   IOATTN_MAX_SEQLEN=16384             longest benchmark sequence
#   IOATTN_BUILD_TARGETS="..."          build only these targets (default: every one); for a call
#                                       that must fit the last device minutes, e.g. the GPU tests
#   IOATTN_TREE="<hash> + ..."          what the copied working tree holds, for device.txt: the
#                                       machine's copy of .git may not be this checkout's
#
# The ctest step runs every test except those the test and cpu steps run themselves (with their
# own logs and timings) when those steps are selected, so no test runs twice.
# The sanitizers run only the [sanitize] cases of each binary: memcheck and racecheck multiply a
# kernel's run time by 10-100x. test_gpu_faults fails CUDA calls on purpose, so its runs pass
# --report-api-errors no; every other binary keeps the default, where an API error is a finding.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
steps=${IOATTN_STEPS:-ctest test sanitize cpu python bench decode}
gpu_tests=${IOATTN_GPU_TESTS:-test_gpu_forward test_gpu_sm90 test_gpu_inference test_gpu_faults}
cpu_tests=${IOATTN_CPU_TESTS:-test_cpu_forward test_cpu_edge test_cpu_decode test_inference_cpu test_cpu_threads}
tools=${IOATTN_SANITIZE_TOOLS:-memcheck racecheck synccheck}
sanitize_timeout=${IOATTN_SANITIZE_TIMEOUT:-600}
test_timeout=${IOATTN_TEST_TIMEOUT:-300}
max_seqlen=${IOATTN_MAX_SEQLEN:-16384}
status=0
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin

prefix=/tmp/ioattn-deps
mkdir -p "$prefix"
for deb in "$root"/.deps/debs/*.deb; do
  [[ -e "$deb" ]] || continue
  # Debian's Catch2 2 CMake config in the prefix would shadow the machine's v3 while the v3
  # headers in /usr/include still win the include search: the tests would build against one
  # version and link the other.
  case $(basename "$deb") in catch2_* | libcatch2*) continue ;; esac
  dpkg -x "$deb" "$prefix"
done
libdir=$prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CUTLASS headers of the sm_90a kernels, from the wheel scripts/device_deps.sh carried.
"$root/scripts/cutlass_headers.sh" || { echo "gpu_run: no CUTLASS headers (scripts/device_deps.sh)" >&2; exit 1; }
build=$root/build-device
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_CUDA=ON \
  -DIOATTN_CUDA_ARCHITECTURES=90a -DIOATTN_SM90=ON -DIOATTN_THREADING=openmp -DIOATTN_SANITIZE= -DIOATTN_BUILD_TESTS=ON \
  -DIOATTN_BUILD_BENCH=ON -DIOATTN_FUZZ=OFF -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DBLAS_LIBRARIES="$libdir/openblas-pthread/libopenblas.so" >"$OUT/build.txt" 2>&1
rc=$?
tail -3 "$OUT/build.txt"
[[ $rc -eq 0 ]] || { echo "gpu_run: configure failed (exit $rc), see $OUT/build.txt" >&2; exit 1; }
catch2_dir=$(sed -n 's/^Catch2_DIR:PATH=//p' "$build/CMakeCache.txt")
grep -q 'PACKAGE_VERSION "3\.' "$catch2_dir/Catch2ConfigVersion.cmake" 2>/dev/null ||
  { echo "gpu_run: CMake found no Catch2 3 (Catch2_DIR=$catch2_dir)" >&2; exit 1; }
echo "Catch2: $catch2_dir" | tee -a "$OUT/build.txt"
# Every target by default: the tests, the tools and the benchmarks, not only those the steps
# below run.
# shellcheck disable=SC2086 # one target per word
ninja -C "$build" ${IOATTN_BUILD_TARGETS:-} >>"$OUT/build.txt" 2>&1
rc=$?
tail -5 "$OUT/build.txt"
[[ $rc -eq 0 ]] || { echo "gpu_run: build failed (exit $rc), see $OUT/build.txt" >&2; exit 1; }
test_dir=$build/tests
bench_bin=$build/bench/gpu/bench_gpu_forward
decode_bin=$build/bench/gpu/bench_gpu_decode

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/device.txt"
if [[ -n "${IOATTN_TREE:-}" ]]; then
  echo "tree $IOATTN_TREE" | tee -a "$OUT/device.txt"
else
  git -C "$root" log -1 --format='commit %H %cd' 2>/dev/null | tee -a "$OUT/device.txt"
fi

if [[ " $steps " == *" ctest "* ]]; then
  echo "== ctest"
  left_to_steps=""
  [[ " $steps " == *" test "* ]] && left_to_steps="$left_to_steps $gpu_tests"
  [[ " $steps " == *" cpu "* ]] && left_to_steps="$left_to_steps $cpu_tests"
  exclude=()
  # shellcheck disable=SC2086 # one test name per word
  [[ -n "${left_to_steps// /}" ]] && exclude=(-E "^($(echo $left_to_steps | tr ' ' '|'))\$")
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$(nproc)" "${exclude[@]}" >"$OUT/ctest.txt" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|\*\*\*|Failed|Skipped" "$OUT/ctest.txt" | tail -20
  echo "ctest: exit $rc" | tee -a "$OUT/ctest.txt"
  [[ $rc -eq 0 ]] || status=1
fi

if [[ " $steps " == *" test "* ]]; then
  echo "== GPU tests"
  : >"$OUT/gpu_test.txt"
  for t in $gpu_tests; do
    echo "-- $t" >>"$OUT/gpu_test.txt"
    timeout -s INT -k 15 "$test_timeout" "$test_dir/$t" >>"$OUT/gpu_test.txt" 2>&1
    rc=$?
    echo "$t: exit $rc" | tee -a "$OUT/gpu_test.txt"
    [[ $rc -eq 0 ]] || status=1
  done
  grep -E "test case|FAILED|SKIPPED" "$OUT/gpu_test.txt" | tail -20
fi

# One sanitizer over one binary's [sanitize] cases, its log and a one-line summary into $2.
sanitize_one() {
  local tool=$1 t=$2 dir=$3 start=$SECONDS rc api_errors=()
  [[ $t == test_gpu_faults ]] && api_errors=(--report-api-errors no)
  timeout -s INT -k 15 "$sanitize_timeout" compute-sanitizer --tool "$tool" --error-exitcode 9 "${api_errors[@]}" \
    "$test_dir/$t" "[sanitize]" >"$dir/$tool.$t.log" 2>&1
  rc=$?
  local summary cases
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$dir/$tool.$t.log" | tail -1)
  cases=$(grep -E "test case" "$dir/$tool.$t.log" | tail -1)
  echo "$tool $t: exit $rc after $((SECONDS - start)) s; ${summary#========= }; $cases" >"$dir/$tool.$t.summary"
}

if [[ " $steps " == *" sanitize "* ]]; then
  echo "== compute-sanitizer over the [sanitize] cases"
  logs=$(mktemp -d)
  for tool in $tools; do
    for t in $gpu_tests; do
      if [[ -n "${IOATTN_SANITIZE_PARALLEL:-}" ]]; then
        sanitize_one "$tool" "$t" "$logs" &
      else
        sanitize_one "$tool" "$t" "$logs"
      fi
    done
  done
  wait
  : >"$OUT/sanitize.txt"
  for tool in $tools; do
    for t in $gpu_tests; do
      { echo "-- $tool $t"; cat "$logs/$tool.$t.log"; echo; } >>"$OUT/sanitize.txt"
    done
  done
  for tool in $tools; do
    for t in $gpu_tests; do
      tee -a "$OUT/sanitize.txt" <"$logs/$tool.$t.summary"
      grep -q ": exit 0 after" "$logs/$tool.$t.summary" || status=1
    done
  done
  rm -rf "$logs"
fi

if [[ " $steps " == *" cpu "* ]]; then
  # The CPU kernels' Highway targets that this host supports: test_cpu_forward and test_cpu_decode
  # loop over every compiled one; the other tests run the best one (AVX3 on an AVX-512 host).
  echo "== CPU tests on this host"
  {
    grep -m1 "model name" /proc/cpuinfo
    echo "cores: $(nproc); avx512 flags: $(grep -m1 -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  } | tee "$OUT/cpu_test.txt"
  for t in $cpu_tests; do
    echo "-- $t" >>"$OUT/cpu_test.txt"
    start=$SECONDS
    "$test_dir/$t" >>"$OUT/cpu_test.txt" 2>&1
    rc=$?
    echo "$t: exit $rc after $((SECONDS - start)) s; $(grep -E 'test case' "$OUT/cpu_test.txt" | tail -1)" |
      tee -a "$OUT/cpu_test.txt"
    [[ $rc -eq 0 ]] || status=1
  done
  # Which targets ran: the forward test asserts that dispatch went to each target it selected, and
  # the decode test names each target in its sections.
  echo "-- Highway targets exercised" | tee -a "$OUT/cpu_test.txt"
  "$test_dir/test_cpu_forward" "[targets]" -s 2>&1 |
    grep -oE '"[A-Z0-9_]+" == "[A-Z0-9_]+"' | sort | uniq -c | sed 's/^/forward dispatch checks: /' |
    tee -a "$OUT/cpu_test.txt"
  "$test_dir/test_cpu_decode" "decode: every compiled Highway target" -s 2>&1 |
    grep -oE '^  (SCALAR|EMU128|SSSE3|SSE4|AVX2|AVX3[A-Z0-9_]*) ' | sort | uniq -c | sed 's/^/decode sections: /' |
    tee -a "$OUT/cpu_test.txt"
fi

if [[ " $steps " == *" python "* ]]; then
  # The pytest suite on CUDA and CPU tensors with the machine's own torch: the same tree gains the
  # extension (-DIOATTN_PYTHON=ON, one more target), nanobind and pytest come from .deps/wheels.
  echo "== Python suite (torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1))"
  pyw=/tmp/ioattn-pywheels
  # The CUTLASS wheel only carries the kernels' headers (scripts/cutlass_headers.sh), no package.
  wheels=()
  for w in "$root"/.deps/wheels/*.whl; do [[ $w == */nvidia_cutlass-* ]] || wheels+=("$w"); done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$pyw" "${wheels[@]}" \
    >"$OUT/python_test.txt" 2>&1
  export PYTHONPATH="$pyw${PYTHONPATH:+:$PYTHONPATH}"
  { cmake -S "$root" -B "$build" -DIOATTN_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" &&
    ninja -C "$build" _ext; } >>"$OUT/python_test.txt" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    IOATTN_BUILD_DIR=$build IOATTN_CLI=$build/tools/ioattn python3 -m pytest -q -p no:cacheprovider \
      "$root/python/tests" >>"$OUT/python_test.txt" 2>&1
    rc=$?
  fi
  tail -4 "$OUT/python_test.txt"
  echo "python: exit $rc" | tee -a "$OUT/python_test.txt"
  [[ $rc -eq 0 ]] || status=1
  # The wheel pip builds from this checkout (CPU only, to spare a second nvcc build): on CPython
  # 3.12+ it is the stable-ABI one (cp312-abi3); installed alone, it passes the numpy tests.
  wheel_dir=/tmp/ioattn-wheel
  rm -rf "$wheel_dir" && mkdir -p "$wheel_dir"
  {
    python3 --version
    python3 -m pip wheel --no-build-isolation --no-deps -w "$wheel_dir/dist" -Ccmake.define.IOATTN_CUDA=OFF \
      -Ccmake.define.CMAKE_PREFIX_PATH="$prefix/usr" -Cbuild-dir="$wheel_dir/build" "$root" &&
      python3 -m pip install -q --no-deps --no-compile --target "$wheel_dir/site" "$wheel_dir"/dist/*.whl &&
      ls "$wheel_dir/dist" &&
      (cd /tmp && PYTHONPATH="$wheel_dir/site:$PYTHONPATH" python3 -m pytest -q -p no:cacheprovider \
        "$root/python/tests/test_numpy.py")
  } >"$OUT/python_wheel.txt" 2>&1
  rc=$?
  grep -E "^Python|\.whl$|passed|failed|error" "$OUT/python_wheel.txt" | tail -5
  echo "python wheel: exit $rc" | tee -a "$OUT/python_wheel.txt"
  [[ $rc -eq 0 ]] || status=1
fi

if [[ " $steps " == *" bench "* ]]; then
  echo "== benchmark"
  "$bench_bin" --max-seqlen "$max_seqlen" | tee "$OUT/bench_ioattn.jsonl" || status=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/compare.py" --ours "$OUT/bench_ioattn.jsonl" \
    --json "$OUT/bench_peers.json" --max-seqlen "$max_seqlen" | tee "$OUT/bench_table.md" || status=1
fi

if [[ " $steps " == *" traffic "* ]]; then
  echo "== traffic (Nsight Compute)"
  ncu_dir=/tmp/ioattn-ncu
  rm -rf "$ncu_dir" && mkdir -p "$ncu_dir"
  IMPLS=ioattn SPLIT=1 OUT="$ncu_dir/ncu" "$root/bench/traffic/gpu_ncu.sh" "$build/bench/gpu" >"$ncu_dir.log" 2>&1 ||
    status=1
  tail -2 "$ncu_dir.log"
  mv "$ncu_dir.log" "$ncu_dir/ncu.log"
  tar czf "$OUT/ncu.tgz" -C "$ncu_dir" . || status=1
fi

if [[ " $steps " == *" decode "* ]]; then
  echo "== decode benchmark"
  "$decode_bin" | tee "$OUT/bench_decode.jsonl" || status=1
  # Paged with 16-key pages in shuffled order: issue 27's decode bar names them.
  "$decode_bin" --page-size 16 | tee -a "$OUT/bench_decode.jsonl" || status=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/compare_decode.py" --ours "$OUT/bench_decode.jsonl" \
    --json "$OUT/bench_decode_peers.json" | tee "$OUT/bench_decode_table.md" || status=1
fi
exit $status
