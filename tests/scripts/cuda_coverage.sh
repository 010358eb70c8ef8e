#!/usr/bin/env bash
# Line coverage of the CUDA backend (kernels/cuda/*.cu, *.cuh, linear_cublaslt.cpp) by the emulated
# tests (CTest's test_*_emu), on the lines an sm_90a build compiles; every uncovered line needs a
# `// coverage: <reason>` in the source (tests/scripts/cuda_coverage.py says how they are counted).
#   tests/scripts/cuda_coverage.sh BUILD_DIR            zero the counters, run the emulated tests, report
#   tests/scripts/cuda_coverage.sh BUILD_DIR --reset    only zero the counters (before a ctest run)
#   tests/scripts/cuda_coverage.sh BUILD_DIR --report   only report what the last runs counted
# BUILD_DIR is configured with -DFP8SERVE_CUDA_COVERAGE=ON (GCC). The report goes to stdout and
# BUILD_DIR/cuda_coverage/report.txt; the exit status is 1 under 95% or on an unexplained line.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: cuda_coverage.sh BUILD_DIR [--reset|--report]}
mode=${2:-all}
build=$(cd "$build" && pwd)
if ! grep -q '^FP8SERVE_CUDA_COVERAGE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "cuda_coverage: $build is not configured with -DFP8SERVE_CUDA_COVERAGE=ON" >&2
  exit 2
fi

if [ ! -d "$build/cuda_emu" ]; then
  echo "cuda_coverage: $build has no emulated CUDA build (the CUDA toolkit's headers were not found)" >&2
  exit 2
fi

case "$mode" in
  all|--reset)
    find "$build" -name '*.gcda' -delete
    [ "$mode" = --reset ] && exit 0
    ctest --test-dir "$build" -R '_emu$' --output-on-failure -j"$(nproc)" --timeout 900 ;;
  --report) ;;
  *) echo "cuda_coverage: unknown mode $mode (--reset, --report)" >&2; exit 2 ;;
esac

if [ -z "$(find "$build" -name '*.gcda' -print -quit)" ]; then
  echo "cuda_coverage: no counters in $build: run the emulated tests first" >&2
  exit 2
fi
out=$build/cuda_coverage
mkdir -p "$out"
# gcovr (pinned in tests/requirements.txt) runs gcov over every object and merges the counts of the
# objects that compiled a header; its own exclusion markers are off: reasons are ours. A source
# that is gone (the stale objects of a renamed test) is skipped; cuda_coverage.py checks that every
# measured file has data.
(cd "$root" && "$root/.venv/bin/gcovr" --root "$root" --object-directory "$build" --no-markers -j"$(nproc)" \
  --gcov-ignore-errors=source_not_found \
  --filter 'kernels/cuda/[^/]*\.(cu|cuh)$' --filter 'kernels/cuda/linear_cublaslt\.cpp$' \
  --json "$out/gcovr.json" "$build" > "$out/gcovr.log" 2>&1) || { tail -30 "$out/gcovr.log"; exit 2; }
"$root/.venv/bin/python" "$root/tests/scripts/cuda_coverage.py" "$out/gcovr.json" "$out/report.txt"
