#!/usr/bin/env bash
# Fails when a C, C++ or CUDA source differs from what clang-format makes of it (.clang-format at
# the root). The reference formatter is Debian 12's clang-format 14, which CI installs; another
# major version may wrap some lines differently. With --fix, formats the files in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' '*.hpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build\* -prune -o -type f \( -name '*.c' -o -name '*.cc' -o -name '*.h' \
    -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)
fi
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --version
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "check_format: the files above differ from clang-format's output; scripts/check_format.sh --fix formats them" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
