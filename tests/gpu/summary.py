#!/usr/bin/env python3
"""summary.json for tests/gpu/run.sh, rewritten after every phase so that a run cut short still
returns one. Standard library only (the device image's python3 is not the project's venv).

  summary.py junit WORK NAME FILE   parse one test executable's JUnit into WORK/tests.json, then
                                    delete FILE (the device tool brings back at most 8 files)
  summary.py write WORK OUT         OUT/summary.json from what WORK holds:
      facts.tsv    KEY<TAB>VALUE from the preflight ("tools.nvcc", "missing", "run.budget_s", ...;
                   a dotted key nests, a repeated "missing" makes a list)
      phases.tsv   NAME<TAB>STATUS<TAB>SECONDS<TAB>TIMEOUT_S<TAB>RC<TAB>NOTE, the last line of a
                   name wins (running -> passed | failed | timed_out | skipped)
      tests.json   from `junit`
      NAME.log     each phase's output: the benches' are parsed
  and docs/cuda.md's whole-kernel model table (tests/scripts/kernel_model.py): each estimate beside
  the measured figure of the same kernel and shape ("model_check"), so a GPU run says how wrong the
  static model was.
"""
import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET

MAX_OUT_FILES = 8
DOCS_CUDA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "cuda.md")


def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def number(text):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text else value


def facts(work):
    out = {"missing": []}
    for row in read_tsv(os.path.join(work, "facts.tsv")):
        key, value = row[0], row[1] if len(row) > 1 else ""
        if key == "missing":
            out["missing"].append(value)
            continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = number(value) if parents in (["run"], ["build"]) else value
    return out


def phases(work):
    order, last = [], {}
    for row in read_tsv(os.path.join(work, "phases.tsv")):
        row += [""] * (6 - len(row))
        name, status, seconds, timeout_s, rc, note = row[:6]
        if name not in last:
            order.append(name)
        last[name] = {"name": name, "status": status, "seconds": number(seconds) if seconds else None,
                      "timeout_s": number(timeout_s) if timeout_s else None,
                      "rc": number(rc) if rc else None, "note": note}
    return [last[name] for name in order]


def parse_junit(path):
    """Counts and failing case names ("case/section", as Catch2 names them) with their message."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cases, failed = 0, []
    for suite in suites:
        for case in suite.iter("testcase"):
            cases += 1
            for problem in list(case.findall("failure")) + list(case.findall("error")):
                text = (problem.text or "").strip().replace("FAILED:\n", "")
                failed.append({"name": case.get("name"), "message": " | ".join(text.splitlines()[:6])[:400]})
                break
    return {"cases": cases, "failures": len(failed), "failed": failed}


def cmd_junit(work, name, path):
    tests_path = os.path.join(work, "tests.json")
    tests = json.load(open(tests_path)) if os.path.exists(tests_path) else {}
    if not os.path.exists(path):
        tests[name] = {"junit": "missing: the executable ended before Catch2 wrote it (see tests.log)"}
    else:
        try:
            tests[name] = dict(parse_junit(path), junit="parsed")
        except (ET.ParseError, ValueError) as e:
            tests[name] = {"junit": f"unreadable: {e}"}
        os.remove(path)
    with open(tests_path, "w") as f:
        json.dump(tests, f, indent=1)


def read_log(work, name):
    path = os.path.join(work, name + ".log")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


FP8_LINEAR_ROW = re.compile(r"fp8-linear\s+(\S+)\s+(row|blk128)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+"
                            r"([\d.]+)%\s+([\d.]+)\s+([\d.]+)%$")
FORWARD_ROW = re.compile(r"(bf16|fp8)\s+(decode|prefill)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*([\d.]*)%?\s*$")


def parse_bench_forward(text):
    """bench_forward's rows (tests/bench/bench_forward.cpp's printf formats)."""
    out = {"rows": [], "fits_8k": {}, "complete": False, "fp8_linear": []}
    for line in text.splitlines():
        if m := FP8_LINEAR_ROW.match(line):
            # The FP8 weights' projections alone: the GEMV's share of the copy bandwidth (decode
            # token counts) and the prefill's share of the dense FP8 peak, as ratios.
            out["fp8_linear"].append({"proj": m[1], "scales": m[2], "tokens": int(m[3]), "in": int(m[4]),
                                      "out": int(m[5]), "us": float(m[6]), "gb_s": float(m[7]),
                                      "fraction_of_copy": float(m[8]) / 100, "tflops": float(m[9]),
                                      "fraction_of_fp8_peak": float(m[10]) / 100})
        elif m := FORWARD_ROW.match(line):
            out["rows"].append({"kv": m[1], "phase": m[2], "batch": int(m[3]), "context": int(m[4]),
                                "ms_per_step": float(m[5]), "tokens_per_s": float(m[6]),
                                "percent_of_bound": float(m[7]) if m[7] else None})
        elif m := re.match(r"(bf16|fp8)\s+fits\s+(\d+) sequences", line):
            out["fits_8k"][m[1]] = int(m[2])
            out["complete"] = m[1] == "fp8"
        elif m := re.match(r"bandwidth: ([\d.]+) GB/s", line):
            out["copy_gb_s"] = float(m[1])
        elif m := re.match(r"random weights: ([\d.]+) GB bf16 in ([\d.]+) s", line):
            out["weights_gb"], out["weights_seconds"] = float(m[1]), float(m[2])
        elif line.startswith("bench_forward: "):
            out["backend"] = line[len("bench_forward: "):]
    return out


SAMPLING_ROW = re.compile(r"(greedy|top-p)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def parse_bench_sampling(text, forward):
    """bench_sampling --device cuda's rows, each step's sampling set against bench_forward's
    fastest decode step at batch 64 (the target: top-p under 2% of it)."""
    out = {"rows": []}
    steps = [r["ms_per_step"] for r in (forward or {}).get("rows", []) if r["phase"] == "decode" and r["batch"] == 64]
    decode_us = 1e3 * min(steps) if steps else None
    out["decode_step_us_batch_64"] = decode_us
    for line in text.splitlines():
        if m := SAMPLING_ROW.match(line):
            row = {"request": m[1], "device_us": float(m[2]), "host_us": float(m[3]), "step_us": float(m[4]),
                   "host_path_us": float(m[5])}
            if decode_us:
                row["percent_of_decode_step"] = round(100.0 * row["step_us"] / decode_us, 3)
                row["host_path_percent_of_decode_step"] = round(100.0 * row["host_path_us"] / decode_us, 3)
            out["rows"].append(row)
        elif m := re.match(r"top-p rows the candidates could not decide: (\d+) of (\d+)", line):
            out["declined"], out["drawn"] = int(m[1]), int(m[2])
    out["complete"] = "declined" in out
    return out


DECODE_ROW = re.compile(r"(bf16|fp8|fp8\+tail)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)x$")
PREFILL_ROW = re.compile(r"(bf16|fp8|fp8\+tail)\s+(\d+)\s+(\d+)\s+(yes|no)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
# bench_attention_cuda's decode-by-GQA-group table: group, kv, math (simt | mma), batch, context, us, GB/s, %copy.
GROUP_ROW = re.compile(r"(\d+)\s+(bf16|fp8)\s+(simt|mma)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")


def parse_bench_attention(text):
    """bench_attention_cuda's `json:` line; from its table when the run was cut short before it."""
    for line in text.splitlines():
        if line.startswith("json: "):
            try:
                return dict(json.loads(line[len("json: "):]), complete=True, source="json")
            except ValueError:
                break
    out = {"decode": [], "prefill": [], "decode_groups": [], "complete": False, "source": "table"}
    for line in text.splitlines():
        if m := GROUP_ROW.match(line.strip()):
            out["decode_groups"].append({"group": int(m[1]), "kv": m[2], "math": m[3], "batch": int(m[4]),
                                         "context": int(m[5]), "us": float(m[6]), "gb_s": float(m[7]),
                                         "percent_of_copy": float(m[8])})
        elif m := DECODE_ROW.match(line.strip()):
            out["decode"].append({"kv": m[1], "batch": int(m[2]), "context": int(m[3]), "us": float(m[4]),
                                  "gb_s": float(m[5]), "percent_of_copy": float(m[6])})
        elif m := PREFILL_ROW.match(line.strip()):
            out["prefill"].append({"kv": m[1], "prompt": int(m[2]), "chunk": int(m[3]), "ms": float(m[5]),
                                   "tokens_s": float(m[6]), "tflop_s": float(m[7])})
        elif m := re.match(r"bandwidth: ([\d.]+) GB/s", line):
            out["copy_gb_s"] = float(m[1])
        elif m := re.match(r"device: ([^,]+),", line):
            out["device"] = m[1]
    return out


def ab(fast, portable, section, keys, value):
    """Each cell both builds measured: cvt (FAST_PATHS=1) against the bit-trick FP8 decode
    (FAST_PATHS=0); ratio = portable / fast, > 1 when the bit trick is slower. The bf16 rows use
    neither: their ratio is the run-to-run noise."""
    theirs = {tuple(r[k] for k in keys): r[value] for r in portable.get(section, [])}
    rows = []
    for r in fast.get(section, []):
        key = tuple(r[k] for k in keys)
        if key in theirs and r[value] > 0:
            rows.append(dict(zip(keys, key), **{value + "_fast_paths_1": r[value], value + "_fast_paths_0": theirs[key],
                                                "ratio": round(theirs[key] / r[value], 4)}))
    return rows


def out_files(out):
    names = []
    for folder, _, files in os.walk(out):
        names += [os.path.relpath(os.path.join(folder, f), out) for f in files]
    return sorted(names)


def model_rows(docs_path):
    """The static model's H200 estimates: docs/cuda.md's first kernel-model table (kernel, shape,
    batch, GPU, CTAs, waves, binds, est. time (us), est. % of HBM, ...)."""
    try:
        text = open(docs_path).read()
    except OSError:
        return []
    begin, end = text.find("<!-- kernel-model:begin -->"), text.find("<!-- kernel-model:end -->")
    rows = []
    for line in text[begin:end].splitlines() if begin >= 0 and end > begin else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 9 or cells[3] != "H200" or not cells[2].isdigit():
            continue
        percent = re.match(r"([\d.]+)%", cells[8])
        rows.append({"kernel": cells[0], "shape": cells[1], "batch": int(cells[2]), "binds": cells[6],
                     "model_us": number(cells[7]), "model_percent_of_hbm":
                     float(percent[1]) if percent and "of a step" not in cells[8] else None})
    return rows


def peak_bytes_s(device):
    """The data sheet's HBM bandwidth of the device the benches ran on, if known."""
    device = device or ""
    if "H200" in device:
        return 4.8e12
    if "H100" in device:
        return 2.0e12 if "PCIe" in device else 3.9e12 if "NVL" in device else 3.35e12
    return None


def model_check(bench, docs_path):
    """Each model row beside the measured row of the same kernel and shape (None where no bench
    measured it): measured time and fraction of HBM, and measured / model time."""
    forward, attention = bench.get("forward", {}), bench.get("attention", {})
    sampling = {r["request"]: r for r in bench.get("sampling", {}).get("rows", [])}
    device = attention.get("device") or forward.get("backend")
    peak = peak_bytes_s(device)
    rows = []
    for m in model_rows(docs_path):
        measured = None  # (us, bytes per second or None)
        if m["kernel"] == "FP8 GEMV" and "x" in m["shape"]:
            n, k = (int(v) for v in m["shape"].split("x"))
            measured = next(((r["us"], r["gb_s"] * 1e9) for r in forward.get("fp8_linear", [])
                             if r["scales"] == "row" and r["tokens"] == m["batch"] and r["in"] == k and r["out"] == n), None)
        elif m["kernel"].startswith("decode attention") and m["shape"].endswith("k"):
            kv = "bf16" if "bf16" in m["kernel"] else "fp8"
            context = int(m["shape"][:-1]) * 1024
            measured = next(((r["us"], r["gb_s"] * 1e9) for r in attention.get("decode", [])
                             if r["kv"] == kv and r["batch"] == m["batch"] and r["context"] == context), None)
        elif m["kernel"] in ("sample_candidates", "sample_greedy") and m["batch"] == 64:
            row = sampling.get("top-p" if m["kernel"] == "sample_candidates" else "greedy")
            measured = (row["device_us"], None) if row else None
        row = dict(m, measured_us=None, measured_percent_of_hbm=None, measured_over_model_time=None)
        if measured:
            row["measured_us"] = measured[0]
            if measured[1] and peak:
                row["measured_percent_of_hbm"] = round(100 * measured[1] / peak, 1)
            if isinstance(m["model_us"], (int, float)) and m["model_us"] > 0:
                row["measured_over_model_time"] = round(measured[0] / m["model_us"], 3)
        rows.append(row)
    return {"device": device, "model_device": "H200", "same_device": bool(device and "H200" in device),
            "matched": sum(r["measured_us"] is not None for r in rows), "rows": rows}


def cmd_write(work, out):
    f = facts(work)
    run = f.pop("run", {})
    budget, started = run.get("budget_s", 0), run.get("started", time.time())
    elapsed = round(time.time() - started)
    steps = phases(work)
    running = [p["name"] for p in steps if p["status"] == "running"]
    bad = [p["name"] for p in steps if p["status"] in ("failed", "timed_out")]
    summary = {
        "status": "running" if running else "failed" if bad else "passed",
        "finished": bool(run.get("finished")) and not running,
        "current_phase": running[0] if running else None,
        "mode": run.get("mode"), "budget_s": budget, "elapsed_s": elapsed, "left_s": budget - elapsed,
        "machine": f.get("machine", {}), "tools": f.get("tools", {}), "missing": f.get("missing", []),
        "deps": f.get("deps"), "build": f.get("build", {}), "bench_args": f.get("args", {}),
        "phases": steps,
        "failed_phases": bad,
        "skipped_phases": [p["name"] for p in steps if p["status"] == "skipped"],
    }
    tests_path = os.path.join(work, "tests.json")
    summary["tests"] = json.load(open(tests_path)) if os.path.exists(tests_path) else {}
    bench = {}
    if (text := read_log(work, "bench_forward")) is not None:
        bench["forward"] = parse_bench_forward(text)
    if (text := read_log(work, "bench_sampling")) is not None:
        bench["sampling"] = parse_bench_sampling(text, bench.get("forward"))
    for phase, key in (("bench_attention_cuda", "attention"), ("bench_attention_cuda_fast_paths_0", "attention_fast_paths_0")):
        if (text := read_log(work, phase)) is not None:
            bench[key] = parse_bench_attention(text)
    if "attention" in bench and "attention_fast_paths_0" in bench:
        fast, portable = bench["attention"], bench["attention_fast_paths_0"]
        bench["decode_ab"] = ab(fast, portable, "decode", ("kv", "batch", "context"), "us")
        bench["prefill_ab"] = ab(fast, portable, "prefill", ("kv", "prompt", "chunk"), "ms")
    summary["bench"] = bench
    summary["model_check"] = model_check(bench, DOCS_CUDA)

    # The file count as the device tool will see it: what is there, summary.json, and the
    # temporary file that replaces it atomically (a reader never sees half a summary).
    files = sorted(set(out_files(out)) - {"summary.json.tmp"} | {"summary.json"})
    max_path = os.path.join(work, "out_files_max")
    seen = int(open(max_path).read()) if os.path.exists(max_path) else 0
    seen = max(seen, len(files) + 1)
    with open(max_path, "w") as fh:
        fh.write(str(seen))
    summary["out_files"], summary["out_files_max"] = files, seen
    if seen > MAX_OUT_FILES:
        summary["status"] = "failed"
        summary["error"] = f"more than {MAX_OUT_FILES} files under the output folder at some point"
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(tmp, os.path.join(out, "summary.json"))

if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    if verb == "junit":
        cmd_junit(*args)
    elif verb == "write":
        cmd_write(*args)
    else:
        sys.exit(f"summary.py: unknown verb {verb} (junit, write)")
