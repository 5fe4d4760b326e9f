#!/usr/bin/env bash
# Prints the prefix of a Catch2 3 for CI's ASan stage (scripts/test.sh), which builds and runs the
# whole test tree against it, so a spelling that only Catch2 v2 accepts fails here instead of on
# the GPU machine, whose Ubuntu 24.04 ships v3 (the Release stage builds against Debian 12's v2).
# Debian 12's bookworm-backports suite carries v3 built for Debian 12; its libcatch2-dev is
# downloaded and unpacked under build-deps/, never installed, since it would replace the host's
# v2. apt reads a private configuration for that one package, so the host's package sources stay
# as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
deps="$PWD/build-deps/catch2v3"

if [[ ! -f "$deps/usr/lib/cmake/Catch2/Catch2Config.cmake" ]]; then
  # The backports suite lives on the mirror the host already uses for Debian itself.
  # shellcheck disable=SC2016 # apt's own $(FIELD) placeholders
  # (--no-release-info: read from the sources themselves, so it works before any apt-get update.)
  mirror=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' 'Release: bookworm' | head -n 1)
  [[ -n "$mirror" ]] || { echo "ci_catch2v3: no Debian mirror among apt's sources" >&2; exit 1; }
  apt_dir="$PWD/build-deps/catch2v3-apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$deps"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm-backports main" >"$apt_dir/sources.list"
  apt_opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
            -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq >&2
  (cd "$deps" && apt-get "${apt_opts[@]}" download -qq libcatch2-dev/bookworm-backports && dpkg -x libcatch2-dev_*.deb .) >&2
fi
grep -q 'PACKAGE_VERSION "3\.' "$deps/usr/lib/cmake/Catch2/Catch2ConfigVersion.cmake" ||
  { echo "ci_catch2v3: $deps does not hold Catch2 3" >&2; exit 1; }
echo "$deps/usr"
