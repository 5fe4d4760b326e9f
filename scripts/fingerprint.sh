#!/usr/bin/env bash
# Writes a fingerprint of a build's observable behaviour into OUT_DIR: output hashes of the C ABI
# over every CPU plan (scripts/fingerprint.cc under each built-in profile's plan and the host's),
# and the CLI's plan/traffic/explain/hw text and JSON over every profile. A change that claims
# identical behaviour diffs the directories of two builds: `diff -r before after`.
# usage: scripts/fingerprint.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$(realpath "$1")
out=$2
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
cli=$build/tools/ioattn
g++ -std=c++20 -O1 -I"$src/include" "$src/scripts/fingerprint.cc" -L"$build" -lioattn -Wl,-rpath,"$build" \
  -o "$out/fingerprint.bin"
hw_names() { "$cli" hw --json | python3 -c "import json,sys; print(' '.join(p['name'] for p in json.load(sys.stdin)['profiles'] $1))"; }
profiles=$(hw_names "")
for p in host $(hw_names "if p['kind'] == 'cpu'"); do
  IOATTN_HW_PROFILE=$p "$out/fingerprint.bin" > "$out/abi-$p.txt"
done
rm "$out/fingerprint.bin"
shapes=(
  ""
  "--causal"
  "--heads 32 --kv-heads 8 --seqlen-q 1 --seqlen-k 32768 --dtype bf16"
  "--heads 8 --seqlen-q 1 --seqlen-k 100000 --dtype f16 --batch 4"
  "--seqlen-q 777 --seqlen-k 5000 --head-dim 64 --window 128,0 --dtype f16"
  "--batch 2 --heads 12 --kv-heads 4 --seqlen-q 2048 --head-dim 96 --head-dim-v 64 --causal"
  "--seqlen-q 16 --seqlen-k 65536 --head-dim 256 --dtype bf16 --causal"
)
i=0
for s in "${shapes[@]}"; do
  for p in $profiles; do
    for cmd in plan traffic explain; do
      # shellcheck disable=SC2086
      "$cli" $cmd $s --hw "$p" > "$out/cli-$i-$p-$cmd.txt" 2>&1 || echo "exit $?" >> "$out/cli-$i-$p-$cmd.txt"
      # shellcheck disable=SC2086
      "$cli" $cmd $s --hw "$p" --json > "$out/cli-$i-$p-$cmd.json" 2>&1 || true
    done
    # shellcheck disable=SC2086
    "$cli" traffic $s --hw "$p" --threads 1 > "$out/cli-$i-$p-traffic-t1.txt" 2>&1 || true
  done
  i=$((i + 1))
done
"$cli" hw --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["profiles"], indent=1))' > "$out/hw-builtin.json"
