#!/usr/bin/env bash
# Installs the upstream SLIM binaries used by the interop tests and benchmarks
# (slim, slimctl, slim-control-plane at the protocol revision slim-cp speaks)
# into a cache directory, once. Later runs find them and return at once.
#
#   scripts/install-upstream.sh [--line 2|3] [slim|slimctl|slim-control-plane ...]
#
# `--line 2` (the default) is 2.0.0-alpha.2, the revision the architecture
# describes; `--line 3` is the current 3.x line (3.4.6). SLIM_UPSTREAM_DIR
# overrides the cache (default ~/.cache/slim-cp/upstream); 2.0.0-alpha.2
# binaries land in $SLIM_UPSTREAM_DIR/bin, 3.4.6 ones in
# $SLIM_UPSTREAM_DIR/3.4.6/bin. Both lines share one cargo target folder,
# so the second line builds only what differs.
set -euo pipefail

line=2
if [ "${1:-}" = --line ]; then
  line=${2:-}
  shift 2 || { echo "--line needs 2 or 3" >&2; exit 2; }
fi
case $line in
  2) version=2.0.0-alpha.2; sub= ;;
  3) version=3.4.6; sub=/3.4.6 ;;
  *) echo "unknown SLIM line: $line (2 or 3)" >&2; exit 2 ;;
esac
cache=${SLIM_UPSTREAM_DIR:-$HOME/.cache/slim-cp/upstream}
root=$cache$sub
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
  CARGO_TARGET_DIR="$cache/target" cargo install --locked --quiet \
    --version "$version" --root "$root" "$crate"
  [ -x "$root/bin/$bin" ] || { echo "$crate installed no $bin binary" >&2; ls "$root/bin" >&2; exit 1; }
done
