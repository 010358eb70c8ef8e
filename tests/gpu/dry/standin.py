#!/usr/bin/env python3
"""Stand-ins for the GPU executables in tests/gpu/run.sh --dry-run: fake-build.sh links each
target's path in the build folder to this file, which acts by the name it is called as.

  test_*                    Catch2 with `[gpu] -r junit -o FILE`: writes JUnit as Catch2 2.13 does
                            (test_gpu: one failing section, to check failing names reach the summary)
  bench_forward             bench_forward's text (the printf formats of tests/bench/bench_forward.cpp)
  bench_sampling            bench_sampling --device cuda's table (tests/bench/bench_sampling.cpp)
  bench_attention_cuda*     bench_attention_cuda's table and its `json:` line; the _fast_paths_0
                            build prints the FP8 rows 1.25x slower, so the A/B has a known ratio

FP8SERVE_DRY_HANG=NAME makes NAME hang after half its output, as a stuck kernel would: a test
answers SIGTERM as Catch2 does (JUnit with the running case failed by "SIGTERM"), a bench dies.
"""
import os
import signal
import sys
import time
from xml.sax.saxutils import quoteattr

NAME = os.path.basename(sys.argv[0])
HANG = os.environ.get("FP8SERVE_DRY_HANG") == NAME

# (case name, failure or None): Catch2 names a section's result "case/section".
TEST_CASES = {
    "test_gpu": [
        ("paged decode attention matches the host reference [gpu]/bf16 KV", None),
        ("paged decode attention matches the host reference [gpu]/fp8 KV", "max |err| 0.031 > 0.02\nat test_paged_attention_decode_gpu.cpp:88"),
        ("device FP8 codec round-trips every code [gpu]", None),
    ],
    "test_engine": [("the engine on CUDA gives the CPU engine's greedy tokens [gpu]", None)],
}


def junit(cases, path):
    failures = sum(1 for _, failure in cases if failure)
    rows = []
    for name, failure in cases:
        attrs = f'classname="{NAME}.global" name={quoteattr(name)} time="0.010" status="run"'
        if failure is None:
            rows.append(f"    <testcase {attrs}/>")
        else:
            kind = "error" if failure.startswith("SIGTERM") else "failure"
            rows.append(f'    <testcase {attrs}>\n      <{kind} type="CHECK">\nFAILED:\n{failure}\n      </{kind}>\n    </testcase>')
    body = "\n".join(rows)
    with open(path, "w") as f:
        f.write(f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n  <testsuite name="{NAME}" errors="0" '
                f'failures="{failures}" tests="{len(cases)}" hostname="tbd" time="0.1">\n{body}\n'
                f"    <system-out/>\n    <system-err/>\n  </testsuite>\n</testsuites>\n")


def run_test(args):
    if args[:1] != ["[gpu]"] or "-o" not in args or "junit" not in args:
        sys.exit(f"{NAME} (stand-in): run.sh must call [gpu] -r junit -o FILE, got {args}")
    path = args[args.index("-o") + 1]
    cases = TEST_CASES.get(NAME, [(f"{NAME} case [gpu]", None)])
    if HANG:
        done = cases[:1]

        def on_term(signum, frame):  # Catch2's fatal-signal handler: the running case fails
            junit(done + [(cases[1][0] if len(cases) > 1 else "hung case [gpu]", "SIGTERM - Termination request signal")], path)
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)
        time.sleep(3600)
    junit(cases, path)
    print(f"{NAME} (stand-in): {len(cases)} cases")
    sys.exit(1 if any(failure for _, failure in cases) else 0)


def bench_forward_lines():
    yield "bench_forward: llama3-8b, cuda: NVIDIA H200 (stand-in)"
    yield "random weights: 16.1 GB bf16 in 12.3 s"
    yield "bandwidth: 4310 GB/s (device-to-device copy, measured)\n"
    yield "\nFP8-weight projections (cuda: NVIDIA H200 (stand-in); dense FP8 peak 1979 TFLOP/s, data sheet)"
    for proj, k, n in (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)):
        for scales in ("row", "blk128"):
            for m in (1, 8, 16, 4096):
                us = k * n / 3.9e3 * (1 if m <= 16 else m / 16 * 0.2)
                gb_s = k * n / us / 1e3
                tflops = 2 * m * k * n / us / 1e6
                yield "%-10s %-8s %-6s %6d %6d %6d %10.2f %8.1f %6.1f%% %9.2f %6.2f%%" % (
                    "fp8-linear", proj, scales, m, k, n, us, gb_s, 100 * gb_s / 4310, tflops, 100 * tflops / 1979)
    yield "%-5s %-8s %6s %8s %10s %10s %8s" % ("KV", "phase", "batch", "context", "ms/step", "tok/s", "%bound")
    for kv, kv_factor in (("bf16", 1.0), ("fp8", 0.9)):
        for context in (1024, 8192):
            for batch in (1, 8, 32, 64):
                ms = (4.6 + batch * context * 1e-5) * kv_factor
                yield "%-5s %-8s %6d %8d %10.3f %10.1f %7.1f%%" % (kv, "decode", batch, context, ms, batch / ms * 1e3, 80.0 / kv_factor)
        for prompt in (1024, 8192):
            ms = prompt * 0.04
            yield "%-5s %-8s %6d %8d %10.3f %10.1f %8s" % (kv, "prefill", 1, prompt, ms, prompt / ms * 1e3, "")
        yield "%-5s fits     %6d sequences of 8192 tokens in %.1f GiB of KV (%d bytes/token)" % (
            kv, 95 if kv == "bf16" else 190, 104.2, 131072 if kv == "bf16" else 65536)


def bench_sampling_lines():
    yield "bench_sampling: device cuda (stand-in), batch 64, vocab 128256, 50 steps per figure"
    yield "%-8s %10s %10s %10s %12s" % ("request", "device us", "host us", "step us", "host path us")
    yield "%-8s %10.1f %10.1f %10.1f %12.1f" % ("greedy", 30.0, 5.0, 35.0, 7000.0)
    yield "%-8s %10.1f %10.1f %10.1f %12.1f" % ("top-p", 60.0, 32.0, 92.0, 17000.0)
    yield "top-p rows the candidates could not decide: 0 of 3264"


def bench_attention_lines():
    slow = 1.25 if NAME.endswith("_fast_paths_0") else 1.0
    copy = 4310.0
    yield "device: NVIDIA H200, 132 SMs, L2 60 MiB"
    yield "bandwidth: %.0f GB/s (device-to-device copy, bytes read + written)" % copy
    yield "\n%-9s %6s %6s %10s %9s %7s %10s" % ("kv", "batch", "context", "us/call", "GB/s", "%copy", "vs bf16")
    decode, prefill = [], []
    for batch in (1, 16):
        for context in (1024, 8192):
            bf16_us = 0.0
            for kv in ("bf16", "fp8", "fp8+tail"):
                tokens_bytes = batch * context * 2 * 8 * 128 * (2 if kv == "bf16" else 1)
                us = (5.0 + tokens_bytes / 3.0e3 * 1e-3) * (1.0 if kv == "bf16" else slow)
                bf16_us = us if kv == "bf16" else bf16_us
                gbs = tokens_bytes / (us * 1e-6) / 1e9
                yield "%-9s %6d %6d %10.1f %9.0f %6.1f%% %9.2fx" % (kv, batch, context, us, gbs, 100 * gbs / copy, bf16_us / us)
                decode.append('{"kv": "%s", "batch": %d, "context": %d, "us": %g, "gb_s": %g, "percent_of_copy": %g}'
                              % (kv, batch, context, us, gbs, 100 * gbs / copy))
    yield "\n%-9s %6s %6s %6s %10s %12s %8s" % ("kv", "prompt", "chunk", "cached", "ms", "tokens/s", "TFLOP/s")
    for prompt, chunk in ((1024, 1024), (8192, 2048)):
        for kv in ("bf16", "fp8"):
            ms = prompt * 1e-3 * (1.0 if kv == "bf16" else slow)
            yield "%-9s %6d %6d %6s %10.2f %12.0f %8.1f" % (kv, prompt, chunk, "yes" if chunk < prompt else "no", ms, prompt / ms * 1e3, 300.0)
            prefill.append('{"kv": "%s", "prompt": %d, "chunk": %d, "ms": %g, "tokens_s": %g, "tflop_s": 300}'
                           % (kv, prompt, chunk, ms, prompt / ms * 1e3))
    yield "\n%-5s %-5s %-5s %6s %6s %10s %9s %7s" % ("group", "kv", "math", "batch", "context", "us/call", "GB/s", "%copy")
    groups = []
    for group in (1, 8):
        for kv in ("fp8", "bf16"):
            for math in ("simt", "mma"):
                tokens_bytes = 4 * 4096 * 2 * 8 * 128 * (2 if kv == "bf16" else 1)
                us = 5.0 + tokens_bytes / 3.0e3 * 1e-3 * (group if math == "simt" and kv == "fp8" else 1)
                gbs = tokens_bytes / (us * 1e-6) / 1e9
                yield "%-5d %-5s %-5s %6d %6d %10.1f %9.0f %6.1f%%" % (group, kv, math, 4, 4096, us, gbs, 100 * gbs / copy)
                groups.append('{"group": %d, "kv": "%s", "math": "%s", "batch": 4, "context": 4096, "us": %g, "gb_s": %g,'
                              ' "percent_of_copy": %g}' % (group, kv, math, us, gbs, 100 * gbs / copy))
    yield ('\njson: {"device": "NVIDIA H200", "copy_gb_s": %g, "decode": [%s], "prefill": [%s], "decode_groups": [%s]}'
           % (copy, ", ".join(decode), ", ".join(prefill), ", ".join(groups)))


def run_bench(lines):
    lines = list(lines)
    for i, line in enumerate(lines):
        if HANG and i == len(lines) // 2:
            sys.stdout.flush()
            time.sleep(3600)
        print(line)
    sys.exit(0)


if __name__ == "__main__":
    if NAME.startswith("test_"):
        run_test(sys.argv[1:])
    elif NAME == "bench_forward":
        run_bench(bench_forward_lines())
    elif NAME == "bench_sampling":
        run_bench(bench_sampling_lines())
    elif NAME.startswith("bench_attention_cuda"):
        run_bench(bench_attention_lines())
    else:
        sys.exit(f"standin.py: no stand-in for {NAME}")
