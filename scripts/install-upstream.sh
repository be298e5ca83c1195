#!/usr/bin/env bash
# Installs the upstream SLIM binaries used by the interop tests and benchmarks
# (slim, slimctl, slim-control-plane at the protocol revision slim-cp speaks)
# into a cache directory, once. Later runs find them and return at once.
#
#   scripts/install-upstream.sh [slim|slimctl|slim-control-plane ...]
#
# SLIM_UPSTREAM_DIR overrides the cache (default ~/.cache/slim-cp/upstream);
# the binaries land in $SLIM_UPSTREAM_DIR/bin.
set -euo pipefail

version=2.0.0-alpha.2
root=${SLIM_UPSTREAM_DIR:-$HOME/.cache/slim-cp/upstream}
mkdir -p "$root/bin"

declare -A crate_of=(
  [slim]=agntcy-slim
  [slimctl]=agntcy-slimctl
  [slim-control-plane]=agntcy-slim-control-plane
)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(slim slimctl)

need_build_deps() {
  command -v cmake >/dev/null && command -v clang >/dev/null && \
    ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1
}

for bin in "${wanted[@]}"; do
  crate=${crate_of[$bin]:-}
  [ -n "$crate" ] || { echo "unknown upstream binary: $bin" >&2; exit 2; }
  if [ -x "$root/bin/$bin" ]; then
    echo "upstream $bin: cached at $root/bin/$bin"
    continue
  fi
  if ! need_build_deps; then
    echo "installing cmake, clang, libclang-dev (needed to build $crate)"
    apt-get update -qq && apt-get install -y -qq cmake clang libclang-dev protobuf-compiler
  fi
  echo "building $crate $version (several minutes on two cores)"
  CARGO_TARGET_DIR="$root/target" cargo install --locked --quiet \
    --version "$version" --root "$root" "$crate"
  [ -x "$root/bin/$bin" ] || { echo "$crate installed no $bin binary" >&2; ls "$root/bin" >&2; exit 1; }
done
