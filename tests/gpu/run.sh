#!/usr/bin/env bash
# tests/gpu/run.sh OUT_DIR - everything that needs a real NVIDIA GPU, as one short script:
#   1. a Release build with the CUDA backend for this GPU's architecture
#   2. every Catch2 test tagged [gpu] (kernels against their host references, the device FP8
#      codec, the engine on CUDA against the CPU engine - greedy tokens, bf16 and FP8 KV)
#   3. the GPU benchmarks: bench_forward (Llama-3-8B-shaped model with random weights: decode
#      at batch 1-64, prefill, sequences that fit, FP8 vs bf16 KV) and the decode attention
#      bandwidth bench when it is built
#   4. OUT_DIR/summary.json with every result, plus the logs
# It needs nothing from the network: models are random weights made on the machine (and the
# default model when .models/ holds it). Where the build's Debian headers are missing (a CUDA
# image without them), carry .gpu-deps/ made by tests/gpu/fetch-deps.sh; they are unpacked into
# a private prefix. Budget: under 8 minutes on an H200 (16 cores), most of it the build.
set -uo pipefail
out=${1:?usage: tests/gpu/run.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
start=$SECONDS
status=0
note() { echo "== $* ($((SECONDS - start)) s)" | tee -a "$out/run.log"; }

note "machine"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | tee -a "$out/run.log"
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
case "$cap" in
  90) arch=90a ;;  # Hopper: the arch-specific target, so Hopper-only instructions are allowed
  "") echo "no NVIDIA GPU visible (nvidia-smi)"; exit 1 ;;
  *) arch=$cap ;;
esac

# Build dependencies from a private prefix when the system lacks them.
cmake_extra=()
if [ ! -f /usr/include/boost/version.hpp ] && [ -d .gpu-deps ]; then
  note "unpacking .gpu-deps into /tmp/fp8serve-deps"
  prefix=/tmp/fp8serve-deps
  for deb in .gpu-deps/*.deb; do dpkg -x "$deb" "$prefix"; done
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG_LIBDIR=$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig
  export LD_LIBRARY_PATH=$prefix/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_extra+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DOPENSSL_ROOT_DIR="$prefix/usr")
fi

note "build (Release, CUDA sm_$arch)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP8SERVE_CUDA=ON -DFP8SERVE_CUDA_EMU=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "${cmake_extra[@]}" > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$out/build.log" 2>&1
if [ $? -ne 0 ]; then
  tail -40 "$out/build.log"
  echo '{"build": "failed"}' > "$out/summary.json"
  exit 1
fi

note "[gpu] tests"
: > "$out/tests.log"
for exe in build-gpu/tests/test_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe")
  case "$name" in *_emu) continue ;; esac  # emulated builds of the same tests (CI runs them)
  # -r junit gives the counts the summary reads; a failing executable runs again with the
  # console reporter, whose text says what failed.
  "$exe" "[gpu]" -r junit -o "$out/junit-$name.xml" > /dev/null 2>&1
  rc=$?
  echo "$name rc=$rc" | tee -a "$out/run.log"
  if [ $rc -ne 0 ]; then
    status=1
    { echo "== $name"; "$exe" "[gpu]"; } >> "$out/tests.log" 2>&1
  fi
done

note "bench_forward (llama3-8b, random weights)"
timeout 300 build-gpu/tests/bench/bench_forward --device cuda --shape llama3-8b > "$out/bench_forward.txt" 2>&1 || status=1
cat "$out/bench_forward.txt"
if [ -x build-gpu/tests/bench/bench_attention_cuda ]; then
  note "bench_attention_cuda"
  timeout 200 build-gpu/tests/bench/bench_attention_cuda > "$out/bench_attention_cuda.txt" 2>&1 || status=1
  cat "$out/bench_attention_cuda.txt"
fi

note "summary"
python3 - "$out" "$status" "$((SECONDS - start))" <<'PY'
import glob, json, os, re, sys
import xml.etree.ElementTree as ET
out, status, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
summary = {"status": "passed" if status == 0 else "failed", "seconds": seconds, "tests": {}, "bench": {}}
for path in sorted(glob.glob(os.path.join(out, "junit-*.xml"))):
    name = os.path.basename(path)[len("junit-"):-len(".xml")]
    try:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        tests = sum(int(s.get("tests", 0)) for s in suites)
        failures = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        summary["tests"][name] = {"cases": tests, "failures": failures}
    except Exception as e:  # an aborted run leaves no or half a file
        summary["tests"][name] = {"error": str(e)}
    os.remove(path)  # the device tool brings back at most 8 files
rows = []
bench = os.path.join(out, "bench_forward.txt")
if os.path.exists(bench):
    for line in open(bench):
        m = re.match(r"(bf16|fp8)\s+(decode|prefill)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*([\d.]*)", line)
        if m:
            rows.append({"kv": m[1], "phase": m[2], "batch": int(m[3]), "context": int(m[4]),
                         "ms_per_step": float(m[5]), "tokens_per_s": float(m[6]),
                         "percent_of_bound": float(m[7]) if m[7] else None})
        m = re.match(r"(bf16|fp8)\s+fits\s+(\d+) sequences", line)
        if m:
            summary["bench"].setdefault("fits_8k", {})[m[1]] = int(m[2])
        m = re.match(r"bandwidth: ([\d.]+) GB/s", line)
        if m:
            summary["bench"]["copy_bandwidth_gb_s"] = float(m[1])
summary["bench"]["forward"] = rows
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("status", "seconds", "tests")}, indent=1))
PY
exit $status
