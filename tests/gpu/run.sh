#!/usr/bin/env bash
# tests/gpu/run.sh [--dry-run] [--budget SECONDS] [--build-dir DIR] OUT_DIR
# Everything that needs a real NVIDIA GPU, as one call on a bare machine without network, that
# returns useful results however it ends. Phases, in order of value:
#   preflight   versions of nvcc, g++, cmake, ninja, pkg-config, the driver; the GPU; what is missing
#   configure   Release, CUDA for this GPU's architecture, no emulator, warnings not errors (the
#   build       host GCC is not CI's); only the GPU tests' and benchmarks' targets, and the A/B
#               bench over the portable twins (FP8SERVE_CUDA_FAST_PATHS=0), whose kernels compile
#               on the cores the longest kernel file leaves idle
#   test_gpu, test_engine   the [gpu] Catch2 cases; the failing ones by name, from their JUnit
#   bench_attention_cuda, bench_forward (Llama-3-8B shapes, random weights)
#   bench_sampling --device cuda   sampling on the GPU per decode step at batch 64, 128k vocabulary
#   bench_attention_cuda_fast_paths_0   the decode attention A/B: cvt against the bit-trick decode
# OUT_DIR/summary.json is rewritten when each phase starts and ends, so a run cut short still
# returns one (tests/gpu/summary.py says what it holds). OUT_DIR holds at most 5 files (summary.json,
# run.log, build.log, tests.log, bench.log): the device tool brings back 8.
# Time: each phase gets min(its cap, what is left of the budget) and is skipped, and recorded so,
# when less than its minimum is left. Budget: --budget or FP8SERVE_GPU_BUDGET_S, default 540 s
# (a device call runs 600 s at most).
# --dry-run (CI, tests/gpu/dry/test_dry_run.py): a stand-in nvidia-smi, the real configure, a fake
# build (tests/gpu/dry/fake-build.sh) whose executables are stand-ins; every phase's bookkeeping.
# Debian headers or pkg-config missing (a bare CUDA image): carry .gpu-deps/ (tests/gpu/fetch-deps.sh).
set -uo pipefail

usage() {
  echo "usage: tests/gpu/run.sh [--dry-run] [--budget SECONDS] [--build-dir DIR] OUT_DIR" >&2
  exit 2
}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dry=0 budget=${FP8SERVE_GPU_BUDGET_S:-540} build=$root/build-gpu out=
while (($#)); do
  case "$1" in
    --dry-run) dry=1 ;;
    --budget) budget=${2:-}; shift ;;
    --build-dir) build=${2:-}; shift ;;
    -*) usage ;;
    *) out=$1 ;;
  esac
  shift
done
[[ -n "$out" && -n "$build" && "$budget" =~ ^[0-9]+$ ]] || usage
mkdir -p "$out" && out=$(cd "$out" && pwd)
rm -f "$out"/summary.json "$out"/run.log "$out"/build.log "$out"/tests.log "$out"/bench.log
work=$(mktemp -d "${TMPDIR:-/tmp}/fp8serve-gpu.XXXXXX")  # state, raw logs, JUnit: never in OUT_DIR
trap 'rm -rf "$work"' EXIT
deadline=$((SECONDS + budget))
reserve=5  # seconds kept for the last summary
grace=5    # seconds between a phase's SIGTERM (Catch2 writes its JUnit then) and SIGKILL
targets=(test_gpu test_engine bench_attention_cuda bench_forward bench_sampling bench_attention_cuda_fast_paths_0)
((dry)) && export PATH=$here/dry:$PATH  # the stand-in nvidia-smi

note() { echo "== $((SECONDS)) s: $*" | tee -a "$out/run.log"; }
fact() { printf '%s\t%s\n' "$1" "$2" >> "$work/facts.tsv"; }
summarize() {
  command -v python3 > /dev/null || return 0  # preflight wrote the fallback summary
  python3 "$here/summary.py" write "$work" "$out" || note "summary.py failed"
}
record() {  # record NAME STATUS [SECONDS TIMEOUT_S RC NOTE]: a phase's state, then a new summary
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3:-}" "${4:-}" "${5:-}" "${6:-}" >> "$work/phases.tsv"
  note "$1: $2${3:+ in $3 s}${6:+ ($6)}"
  summarize
}

# phase NAME CAP MIN COMMAND...: COMMAND with a limit of min(CAP, time left), its output in
# $work/NAME.log; skipped when under MIN seconds are left. Returns COMMAND's status (124 on a
# time-out, 125 when skipped).
phase() {
  local name=$1 cap=$2 min=$3 left limit rc status t0
  shift 3
  left=$((deadline - SECONDS - reserve - grace))
  limit=$((cap < left ? cap : left))
  if ((limit < min)); then
    record "$name" skipped "" "" "" "needs $min s, $left s left"
    return 125
  fi
  record "$name" running "" "$limit"
  t0=$SECONDS
  timeout -k "$grace" "$limit" "$@" > "$work/$name.log" 2>&1
  rc=$?
  case $rc in 0) status=passed ;; 124 | 137) status=timed_out ;; *) status=failed ;; esac
  record "$name" "$status" $((SECONDS - t0)) "$limit" "$rc"
  return "$rc"
}

tool_version() {  # tool_version NAME COMMAND...: the highest dotted number COMMAND prints
  local name=$1 path version
  path=$(command -v "$2") || { fact "tools.$name" missing; fact missing "$name"; return 1; }
  version=$(timeout 5 "${@:2}" 2>&1 | grep -v Copyright | grep -Eo '[0-9]+(\.[0-9]+)+' | sort -V | tail -1)
  fact "tools.$name" "${version:-unknown} ($path)"
}

preflight() {
  fact run.mode "$( ((dry)) && echo dry || echo device)"
  fact run.budget_s "$budget"
  fact run.started "$(date +%s)"
  command -v python3 > /dev/null ||
    printf '{"status": "failed", "error": "no python3: run.log has what ran"}\n' > "$out/summary.json"
  tool_version nvcc nvcc --version
  tool_version g++ g++ -dumpfullversion
  tool_version cmake cmake --version
  tool_version ninja ninja --version
  tool_version pkg-config pkg-config --version
  tool_version python3 python3 --version
  local gpu=()
  IFS=, read -ra gpu < <(timeout 5 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version \
    --format=csv,noheader 2> /dev/null | head -1)
  gpu=("${gpu[@]# }")
  fact machine.gpu "${gpu[0]:-none}"
  fact machine.compute_cap "${gpu[1]:-}"
  fact machine.memory "${gpu[2]:-}"
  fact tools.driver "${gpu[3]:-missing}"
  [ -n "${gpu[3]:-}" ] || fact missing "nvidia-smi (driver)"
  fact machine.cpus "$(nproc)"
  fact machine.load "$(cut -d' ' -f1-3 /proc/loadavg)"
  fact machine.commit "$(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)"
  cap=${gpu[1]:-}
  cap=${cap//./}
  case "$cap" in
    90) arch=90a ;;  # Hopper: the arch-specific target, so Hopper-only instructions assemble
    *) arch=$cap ;;
  esac
  fact machine.arch "${arch:-none}"
  check_deps
}

# The build's Debian headers and pkg-config: the system's, else the .deb files of .gpu-deps/
# (tests/gpu/fetch-deps.sh) unpacked into a private prefix, never into /.
cmake_deps=()
deps=system
check_deps() {
  local header
  for header in boost/version.hpp nlohmann/json.hpp spdlog/spdlog.h catch2/catch.hpp \
    sentencepiece_processor.h pcre2.h openssl/ssl.h; do
    [ -f "/usr/include/$header" ] || [ -f "/usr/local/include/$header" ] ||
      { fact missing "header $header"; deps=absent; }
  done
  command -v pkg-config > /dev/null || deps=absent
  if [ $deps = absent ] && ! compgen -G "$root/.gpu-deps/*.deb" > /dev/null; then
    deps="missing: carry .gpu-deps (tests/gpu/fetch-deps.sh)"
  elif [ $deps = absent ]; then
    deps=".gpu-deps, unpacked into /tmp/fp8serve-deps"
  fi
  fact deps "$deps"
}

unpack_deps() {  # a phase: on a loaded machine, removing an old prefix alone takes a minute
  local prefix=/tmp/fp8serve-deps multiarch
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  phase deps 180 5 bash -c 'rm -rf "$0"; for deb; do dpkg-deb -x "$deb" "$0" || exit; done' "$prefix" \
    "$root"/.gpu-deps/*.deb || return 1
  multiarch=$(gcc -print-multiarch 2> /dev/null)
  multiarch=${multiarch:-x86_64-linux-gnu}
  export PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG_LIBDIR=$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig
  export LD_LIBRARY_PATH=$prefix/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # OpenSSL's configuration header is under the multiarch folder, which GCC searches by itself
  # only in /usr/include.
  export CPLUS_INCLUDE_PATH=$prefix/usr/include/$multiarch${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
  cmake_deps=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DOPENSSL_ROOT_DIR="$prefix/usr"
    -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf")
}

build_phases() {
  local generator=Ninja keep_going=(-k 0) jobs
  command -v ninja > /dev/null || generator="Unix Makefiles" keep_going=(-k)
  jobs=$(nproc)
  phase configure 120 10 cmake -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DFP8SERVE_CUDA=ON -DFP8SERVE_CUDA_EMU=OFF -DFP8SERVE_WARNINGS_AS_ERRORS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" "${cmake_deps[@]}"
  local rc=$?
  keep_log configure build.log 60
  ((rc == 0)) || return 1
  # Keep going past a failed object: what did build still runs.
  if ((dry)); then
    phase build 100000 10 "$here/dry/fake-build.sh" "$build" "${targets[@]}"
  else
    phase build 100000 10 cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}"
  fi
  [ -f "$work/build.log" ] || return 1
  fact build.warnings "$(grep -c 'warning' "$work/build.log")"
  { echo "== build: its first warnings and errors"; grep -E 'warning|error|FAILED' "$work/build.log" | head -60; } >> "$out/build.log"
  keep_log build build.log 40
}

keep_log() {  # keep_log PHASE OUT_FILE LINES: the end of a phase's output, into one of OUT_DIR's logs
  [ -f "$work/$1.log" ] || return 0
  { echo "== $1 (last $3 lines)"; tail -n "$3" "$work/$1.log"; } >> "$out/$2"
}

built() {  # built TARGET: its executable's path in $exe, or the phase recorded as skipped
  exe=$build/tests/$1
  [[ $1 == bench_* ]] && exe=$build/tests/bench/$1
  [ -x "$exe" ] && return 0
  record "$1" skipped "" "" "" "not built (build.log)"
  return 1
}

test_phases() {
  local name cap
  for name in test_gpu test_engine; do
    built "$name" || continue
    cap=180
    [ "$name" = test_engine ] && cap=120  # one case: the engine on CUDA against the CPU engine
    phase "$name" "$cap" 10 "$exe" "[gpu]" -r junit -o "$work/junit-$name.xml"
    [ "$?" -eq 125 ] || python3 "$here/summary.py" junit "$work" "$name" "$work/junit-$name.xml"
    keep_log "$name" tests.log 80
    summarize
  done
}

# bench NAME CAP MIN FULL_S ARGS...: NAME's full sweep when FULL_S seconds are left, else --quick.
bench() {
  local name=$1 cap=$2 min=$3 full=$4 line=()
  shift 4
  built "$name" || return 1
  command -v stdbuf > /dev/null && line=(stdbuf -oL)  # rows reach the log before a time-out
  (((deadline - SECONDS - reserve - grace) >= full)) || set -- "$@" --quick
  fact "args.$name" "$*"
  phase "$name" "$cap" "$min" "${line[@]}" "$exe" "$@"
  keep_log "$name" bench.log 200
}

main() {
  note "tests/gpu/run.sh$( ((dry)) && echo ' --dry-run'): budget $budget s, output $out, build $build"
  preflight
  record preflight "$( [ -n "$arch" ] && echo passed || echo failed)" "$SECONDS" "" "" \
    "$( [ -n "$arch" ] || echo 'no GPU: nvidia-smi answered nothing')"
  if [ -n "$arch" ] && { [[ $deps != .gpu-deps* ]] || unpack_deps; } && build_phases; then
    test_phases
    bench bench_attention_cuda 120 20 90
    bench bench_forward 200 30 170 --device cuda --shape llama3-8b  # ~15 s of it: the FP8 projections
    bench bench_sampling 60 10 30 --device cuda
    # The A/B: the same sweep as the first run when it fits, so every cell has both figures.
    local args=()
    grep -q 'args.bench_attention_cuda	.*--quick' "$work/facts.tsv" && args=(--quick)
    bench bench_attention_cuda_fast_paths_0 120 20 90 "${args[@]}"
  else
    for name in "${targets[@]}"; do record "$name" skipped "" "" "" "no build"; done
  fi
  fact run.finished 1
  summarize
  note "done: $out/summary.json"
  python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "passed")' "$out/summary.json"
}

arch='' exe='' name=''
main; exit  # one line: bash reads a script as it runs, so nothing is read after main returns
