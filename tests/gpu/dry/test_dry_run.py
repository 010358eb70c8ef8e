#!/usr/bin/env python3
"""CTest gpu_run_dry: tests/gpu/run.sh --dry-run, so the script a GPU lease depends on keeps
working in CI, where no GPU is. The configure is real (run.sh's cmake line: its options and the
targets it builds must exist); the build and the executables are stand-ins (standin.py).

  1. a whole run: summary.json's shape, the preflight's versions, a failing test case by name,
     JUnit parsed and gone, the benches' figures and the decode A/B, at most 8 output files
  2. a phase that hangs: it times out within the budget, Catch2's SIGTERM JUnit names the hung
     case, the phases that no longer fit are skipped, the summary is complete and valid
  3. the whole call killed (the device tool's limit): the summary says which phase was running
  4. shellcheck over the scripts, when it is installed

  test_dry_run.py BUILD_DIR   (a folder kept between runs: a second configure takes a second)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "..", "run.sh")
PHASES = ["preflight", "configure", "build", "test_gpu", "test_engine", "bench_attention_cuda",
          "bench_forward", "bench_sampling", "bench_attention_cuda_fast_paths_0"]
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}")


def run(out, build, env_extra=None, budget=None, timeout=120):
    cmd = [RUN, "--dry-run", "--build-dir", build, out]
    if budget is not None:
        cmd[1:1] = ["--budget", str(budget)]
    env = dict(os.environ, **(env_extra or {}))
    start = time.time()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print(proc.stdout)
    return proc.returncode, time.time() - start


def load(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def phase_map(summary):
    return {p["name"]: p for p in summary["phases"]}


def whole_run(tmp, build):
    out = os.path.join(tmp, "whole")
    rc, _ = run(out, build)
    s = load(out)
    phases = phase_map(s)
    check(rc == 1, f"a failing test case makes run.sh fail (rc {rc})")
    check([p["name"] for p in s["phases"]] == PHASES, f"every phase, in order: {list(phases)}")
    check(s["status"] == "failed" and s["failed_phases"] == ["test_gpu"], f"only test_gpu failed: {s['failed_phases']}")
    check(s["finished"] and s["current_phase"] is None and s["mode"] == "dry", "a finished dry run")
    for tool in ("nvcc", "g++", "cmake", "ninja", "pkg-config", "driver"):
        check(tool in s["tools"], f"preflight records {tool}")
    check(s["tools"]["driver"] == "580.159.04", "the driver version from the stand-in nvidia-smi")
    check(s["machine"]["gpu"] == "NVIDIA H200" and s["machine"]["arch"] == "90a", f"an H200 gives sm_90a: {s['machine']}")
    check(isinstance(s["missing"], list) and isinstance(s["budget_s"], int) and s["budget_s"] == 540, "missing list, budget 540 s")
    check(all(p["status"] == "passed" for n, p in phases.items() if n != "test_gpu"), "every other phase passed")
    check(s["build"] == {"warnings": 0}, f"the build's warnings counted: {s['build']}")
    check(phases["build"]["timeout_s"] <= 540 - 10, "the build's limit leaves the reserve and the SIGKILL grace")

    failed = s["tests"]["test_gpu"]["failed"]
    check(s["tests"]["test_gpu"]["cases"] == 3 and [f["name"] for f in failed] ==
          ["paged decode attention matches the host reference [gpu]/fp8 KV"], f"the failing case by name: {failed}")
    check("max |err| 0.031" in failed[0]["message"], "the failure's message")
    check(s["tests"]["test_engine"] == {"cases": 1, "failures": 0, "failed": [], "junit": "parsed"}, "test_engine passed")

    forward = s["bench"]["forward"]
    check(forward["complete"] and len(forward["rows"]) == 20 and forward["fits_8k"] == {"bf16": 95, "fp8": 190},
          f"bench_forward's rows and fits: {len(forward['rows'])} {forward['fits_8k']}")
    check(forward["rows"][0] == {"kv": "bf16", "phase": "decode", "batch": 1, "context": 1024, "ms_per_step": 4.61,
                                 "tokens_per_s": 216.9, "percent_of_bound": 80.0}, f"a decode row: {forward['rows'][0]}")
    fp8 = forward["fp8_linear"]
    check(len(fp8) == 32 and fp8[0]["proj"] == "qkv" and fp8[0]["tokens"] == 1 and fp8[0]["scales"] == "row"
          and 0 < fp8[0]["fraction_of_copy"] < 1.5 and "fraction_of_fp8_peak" in fp8[3],
          f"bench_forward's FP8-weight projection rows: {len(fp8)} {fp8[:1]}")
    sampling = s["bench"]["sampling"]
    # The stand-in's fastest batch-64 decode step: (4.6 + 64 * 1024e-5) * 0.9 ms (fp8), printed 4.730.
    check(sampling["complete"] and [r["request"] for r in sampling["rows"]] == ["greedy", "top-p"]
          and sampling["decode_step_us_batch_64"] == 4730.0
          and sampling["rows"][1]["percent_of_decode_step"] == round(100 * 92.0 / 4730.0, 3),
          f"bench_sampling's rows against the decode step: {sampling}")
    attention = s["bench"]["attention"]
    check(attention["complete"] and attention["source"] == "json" and len(attention["decode"]) == 12
          and len(attention["prefill"]) == 4 and len(attention["decode_groups"]) == 8, "bench_attention_cuda's json line")
    ab = s["bench"]["decode_ab"]
    check(len(ab) == 12 and {r["ratio"] for r in ab if r["kv"] == "bf16"} == {1.0}
          and {r["ratio"] for r in ab if r["kv"] != "bf16"} == {1.25}, f"the decode A/B ratios: {ab[:3]}")
    pab = s["bench"]["prefill_ab"]
    check(len(pab) == 4 and [r["ratio"] for r in pab] == [1.0, 1.25, 1.0, 1.25] and "ms_fast_paths_0" in pab[0],
          f"the prefill A/B: {pab[:2]}")
    check(s["bench_args"]["bench_forward"] == "--device cuda --shape llama3-8b", f"bench args: {s['bench_args']}")
    # The static model's estimates beside the measured rows (the stand-ins': the GEMV's three
    # shapes at 1 and 16 tokens, decode at batch 1 and 1k / 8k, bf16 at batch 16 and 8k, sampling).
    model = s["model_check"]
    o_proj = next(r for r in model["rows"] if r["kernel"] == "FP8 GEMV" and r["shape"] == "4096x4096" and r["batch"] == 1)
    measured_o = next(r for r in forward["fp8_linear"] if r["proj"] == "o" and r["scales"] == "row" and r["tokens"] == 1)
    check(model["same_device"] and model["matched"] == 11 and o_proj["measured_us"] == measured_o["us"]
          and o_proj["measured_over_model_time"] == round(o_proj["measured_us"] / o_proj["model_us"], 3),
          f"the model check: {model['matched']} rows matched, {o_proj}")

    check(s["out_files"] == ["bench.log", "build.log", "run.log", "summary.json", "tests.log"] and s["out_files_max"] <= 8,
          f"at most 8 files in the output folder: {s['out_files']} (max {s['out_files_max']})")
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        cache = dict(line.split(":", 1)[0:1] + line.rstrip("\n").split("=", 1)[1:] for line in f if ":" in line and "=" in line)
    for key, value in (("FP8SERVE_CUDA_EMU", "OFF"), ("FP8SERVE_WARNINGS_AS_ERRORS", "OFF"), ("CMAKE_CUDA_ARCHITECTURES", "90a"),
                       ("CMAKE_BUILD_TYPE", "Release"), ("FP8SERVE_CUDA", "ON")):
        check(cache.get(key) == value, f"configured with {key}={value}: {cache.get(key)}")


def hanging_phase(tmp, build):
    # test_engine hangs: 30 s leave it about 10 s after preflight, configure and test_gpu, then
    # nothing else fits.
    out = os.path.join(tmp, "hang")
    rc, seconds = run(out, build, {"FP8SERVE_DRY_HANG": "test_engine"}, budget=30)
    s = load(out)
    phases = phase_map(s)
    check(rc == 1 and seconds < 35, f"the run ends within its budget ({seconds:.0f} s)")
    check(phases["test_engine"]["status"] == "timed_out" and phases["test_engine"]["rc"] == 124,
          f"test_engine timed out: {phases['test_engine']}")
    check(s["tests"]["test_engine"]["failed"] == [{"name": "hung case [gpu]", "message": "SIGTERM - Termination request signal"}],
          f"the hung case from Catch2's SIGTERM JUnit: {s['tests']['test_engine']}")
    skipped = [n for n in PHASES[5:] if phases[n]["status"] == "skipped" and "left" in phases[n]["note"]]
    check(skipped == PHASES[5:], f"the benches no longer fit and are skipped: {[phases[n] for n in PHASES[5:]]}")
    check(s["finished"] and s["status"] == "failed" and s["failed_phases"] == ["test_gpu", "test_engine"],
          f"a complete summary: {s['status']} {s['failed_phases']}")


def killed_run(tmp, build):
    out = os.path.join(tmp, "killed")
    env = dict(os.environ, FP8SERVE_DRY_HANG="bench_attention_cuda")
    proc = subprocess.Popen([RUN, "--dry-run", "--build-dir", build, out], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 60
    summary = None
    while time.time() < deadline and proc.poll() is None:
        try:
            summary = load(out)
            if summary["current_phase"] == "bench_attention_cuda":
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    s = load(out)
    check(s["status"] == "running" and not s["finished"] and s["current_phase"] == "bench_attention_cuda",
          f"a killed run's summary names the running phase: {s['status']} {s['current_phase']}")
    check(s["tests"]["test_gpu"]["cases"] == 3, "and keeps what ran before")
    # SIGKILL left run.sh's private folder behind: each JUnit went once parsed, tests.json stays.
    left = [os.path.join(d, f) for d in os.listdir(tmp) if d.startswith("fp8serve-gpu.")
            for f in os.listdir(os.path.join(tmp, d))]
    check(any(f.endswith("tests.json") for f in left) and not any(f.endswith(".xml") for f in left),
          f"JUnit parsed and deleted: {sorted(os.path.basename(f) for f in left)}")


def shellcheck():
    if not shutil.which("shellcheck"):
        print("shellcheck not installed: skipped")
        return
    scripts = [RUN, os.path.join(HERE, "..", "fetch-deps.sh"), os.path.join(HERE, "fake-build.sh"),
               os.path.join(HERE, "nvidia-smi")]
    proc = subprocess.run(["shellcheck", *scripts], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout)
    check(proc.returncode == 0, "shellcheck is clean")


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="gpu-run-dry-") as tmp:
        os.environ["TMPDIR"] = tmp  # run.sh's work folders, also the killed run's
        whole_run(tmp, build)
        hanging_phase(tmp, build)
        killed_run(tmp, build)
        shellcheck()
    print(f"{len(failures)} failure(s)" if failures else "gpu_run_dry: ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
