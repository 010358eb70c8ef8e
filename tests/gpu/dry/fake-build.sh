#!/usr/bin/env bash
# fake-build.sh BUILD_DIR TARGET... - run.sh --dry-run's build step: the build folder is really
# configured (run.sh's cmake line, so the options and the targets it names are checked), but
# instead of compiling, each target must exist in the Ninja build and its executable's path gets
# a link to standin.py. Seconds instead of the device's minutes.
set -euo pipefail
build=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
known=$(ninja -C "$build" -t targets all | cut -d: -f1)
for target in "$@"; do
  if ! grep -qx "$target" <<< "$known"; then
    echo "fake-build: no target $target in $build" >&2
    exit 1
  fi
  case "$target" in
    bench_*) dir=$build/tests/bench ;;
    *) dir=$build/tests ;;
  esac
  mkdir -p "$dir"
  ln -sf "$here/standin.py" "$dir/$target"
  echo "fake-build: $target -> $dir/$target"
done
