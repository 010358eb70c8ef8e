#!/usr/bin/env python3
"""What ptxas says each CUDA kernel uses on sm_90a, checked in CI.

    kernel_resources.py check  OBJECT_DIR   (CTest test kernel_resources, after the nvcc build)
    kernel_resources.py update OBJECT_DIR   (rewrites the committed table and docs/cuda.md's)

The nvcc build compiles every kernels/cuda/*.cu with -Xptxas=-v; kernels/cuda/tools/ptxas_log.sh
keeps ptxas's report next to each object (OBJECT.ptxas). From the sm_90a entries this script
builds one row per kernel - registers, stack frame, spill stores and loads, static shared memory -
and:
  - fails if a kernel of the attention, kv_write, kv_spill, linear or sampling families (process_logits too) spills (or uses a
    stack frame: local memory at every access), on sm_90a and on the sm_80 build target too
    (SM80_SPILLS names the one known sm_80 exception and why it stays);
  - prints the table, with the CTAs one H200 SM holds by registers and threads alone (at the
    kernel's block size: its __launch_bounds__);
  - compares it with the committed kernels/cuda/kernel_resources.inc, which the CUDA emulator
    compiles in to compute occupancy as an H200 would (tests/cuda_emu/occupancy.cpp), and with
    docs/cuda.md's copy between its kernel-resources markers: a difference fails, `update` rewrites both.
Kernel names are demangled (c++filt) and normalised as the emulator normalises its own symbols:
return type and parameter list dropped, anonymous namespaces as "(anonymous namespace)".
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TABLE = os.path.join(ROOT, "kernels", "cuda", "kernel_resources.inc")
DOC = os.path.join(ROOT, "docs", "cuda.md")
BEGIN, END = "<!-- kernel-resources:begin -->", "<!-- kernel-resources:end -->"

# Threads per block: each kernel's __launch_bounds__(N), which every launch of ours uses, read
# from its source file (the .cu the report came from) with the file's constexpr ints resolved.
NO_SPILLS = ("paged_", "kv_write_kernel", "kv_amax_kernel", "kv_spill_kernel", "linear_", "sample_", "process_logits_kernel")
# sm_80 (a build target, not the one tuned for): the FP8 GEMV's __launch_bounds__(256, 2) hold it
# to 128 registers for sm_90a's 2 CTAs an SM; at two tokens with 16-byte x staging and element-wise
# W (sm_80 has no E4M3 conversion instruction) ptxas spills a few bytes there, which costs less
# than halving its CTAs. Any other sm_80 spill fails like an sm_90a one.
SM80_SPILLS = {"linear_fp8_gemv_kernel<2, true, false>": 68}  # kernel: most bytes (stores + loads + stack) allowed

# H200 (sm_90): 65536 registers per SM, allocated per warp in units of 256; 2048 threads and 32
# CTAs per SM.
REGISTERS_PER_SM, REGISTER_UNIT, THREADS_PER_SM, CTAS_PER_SM = 65536, 256, 2048, 32


def normalise(demangled):
    """'void ns::(anonymous namespace)::k<128, 4>(Args, Work)' -> 'ns::(anonymous namespace)::k<128, 4>'."""
    name = demangled.strip()
    if name.endswith(")"):  # drop the parameter list: the last balanced (...)
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    # drop a return type: the text before the last space outside <> and ()
    depth, cut = 0, -1
    for i, ch in enumerate(name):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i
    return name[cut + 1:] if cut >= 0 else name


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def launch_bounds(cu_path):
    """{kernel base name: threads} from `__launch_bounds__(EXPR[, MIN_CTAS]) name(` in a .cu file
    (constants from it and from the .cuh headers next to it)."""
    text = ""
    for path in [cu_path] + sorted(glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cuh"))):
        text += re.sub(r"//.*", "", open(path).read()) + "\n"
    constants, definitions = {}, re.findall(r"constexpr int (\w+) = ([^;]+);", text)
    for _ in range(len(definitions)):  # until every definition that can be resolved is
        for name, expr in definitions:
            try:
                constants.setdefault(name, int(eval(expr, {"__builtins__": {}}, dict(constants))))
            except Exception:
                pass  # not (yet) a plain integer expression
    bounds = {}
    for expr, name in re.findall(r"__launch_bounds__\(([^)]+)\)\s*(\w+)\s*\(", text):
        bounds[name] = int(eval(expr.split(",")[0], {"__builtins__": {}}, constants))
    return bounds


def read_reports(object_dir, arch="sm_90a"):
    """{mangled: {registers, stack, spill_stores, spill_loads, shared, threads}} per entry for arch."""
    rows = {}
    files = sorted(glob.glob(os.path.join(object_dir, "*.ptxas")))
    if not files:
        sys.exit(f"kernel_resources: no *.ptxas reports in {object_dir} (is this the nvcc build's object folder?)")
    for path in files:
        cu = os.path.join(ROOT, "kernels", "cuda", os.path.basename(path)[: -len(".o.ptxas")])
        bounds = launch_bounds(cu) if os.path.exists(cu) else {}
        current = None
        for line in open(path):
            m = re.match(r"ptxas info\s*: Compiling entry function '(\S+)' for '(\w+)'", line)
            if m:
                current = m[1] if m[2] == arch else None
                if current:
                    rows[current] = {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0, "shared": 0,
                                     "bounds": bounds, "source": os.path.basename(cu)}
                continue
            if current is None:
                continue
            m = re.match(r"\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                rows[current].update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
                continue
            m = re.match(r"ptxas info\s*: Used (\d+) registers(?:.*?, (\d+) bytes smem)?", line)
            if m:
                rows[current].update(registers=int(m[1]), shared=int(m[2] or 0))
    return rows


def ctas_by_registers(registers, threads):
    warps = (threads + 31) // 32
    per_warp = (registers * 32 + REGISTER_UNIT - 1) // REGISTER_UNIT * REGISTER_UNIT
    by_registers = REGISTERS_PER_SM // (per_warp * warps) if per_warp else CTAS_PER_SM
    return min(by_registers, THREADS_PER_SM // threads, CTAS_PER_SM)


def short_name(name):
    return name.replace("fp8serve::cuda::", "").replace("(anonymous namespace)::", "")


def base_name(name):
    return re.sub(r"<.*", "", name).split("::")[-1]


def build(object_dir):
    reports = read_reports(object_dir)
    mangled = sorted(reports)
    kernels = []
    for m, demangled in zip(mangled, demangle(mangled)):
        name = normalise(demangled)
        row = dict(reports[m], name=name)
        base = base_name(name)
        if base not in row["bounds"]:
            sys.exit(f"kernel_resources: kernel {name} ({row['source']}) has no __launch_bounds__(N) this script can "
                     "read: give every kernel one (its block size)")
        row["threads"] = row["bounds"][base]
        row["ctas"] = ctas_by_registers(row["registers"], row["threads"])
        kernels.append(row)
    kernels.sort(key=lambda r: r["name"])
    return kernels


def table_inc(kernels):
    lines = ["// Generated by tests/scripts/kernel_resources.py from ptxas's sm_90a report of the nvcc build:",
             "// {kernel, registers, static shared bytes, stack bytes}. CI's kernel_resources test fails when",
             "// it differs from a fresh build's; `tests/scripts/kernel_resources.py update OBJECT_DIR` rewrites it."]
    for r in kernels:
        lines.append(f'{{"{r["name"]}", {r["registers"]}, {r["shared"]}, {r["stack"]}}},')
    return "\n".join(lines) + "\n"


def table_markdown(kernels):
    lines = ["| kernel (sm_90a) | registers | CTAs/SM by registers (threads) | spills (bytes st/ld) | stack | static smem |",
             "|---|---|---|---|---|---|"]
    for r in kernels:
        lines.append(f'| `{short_name(r["name"])}` | '
                     f'{r["registers"]} | {r["ctas"]} ({r["threads"]}) | {r["spill_stores"]}/{r["spill_loads"]} | '
                     f'{r["stack"]} | {r["shared"]} |')
    return "\n".join(lines) + "\n"


def doc_with(text, markdown):
    if BEGIN not in text or END not in text:
        sys.exit(f"kernel_resources: docs/cuda.md lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + markdown + END + tail


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "update"):
        sys.exit(__doc__)
    kernels = build(sys.argv[2])
    markdown = table_markdown(kernels)
    print(markdown)
    failures = []
    for arch, allowed in (("sm_90a", {}), ("sm_80", SM80_SPILLS)):
        reports = read_reports(sys.argv[2], arch)
        for mangled, demangled in zip(sorted(reports), demangle(sorted(reports))):
            r, name = reports[mangled], normalise(demangled)
            if base_name(name).startswith(NO_SPILLS) and (
                    r["spill_stores"] + r["spill_loads"] + r["stack"] > allowed.get(short_name(name), 0)):
                failures.append(f'{name} spills on {arch} ({r["spill_stores"]} bytes stored, {r["spill_loads"]} '
                                f'loaded, {r["stack"]}-byte stack frame): a hot kernel must keep its state in registers')
    inc, doc = table_inc(kernels), open(DOC).read()
    if sys.argv[1] == "update":
        open(TABLE, "w").write(inc)
        open(DOC, "w").write(doc_with(doc, markdown))
        print(f"kernel_resources: wrote {os.path.relpath(TABLE, ROOT)} and docs/cuda.md")
    else:
        fix = f"run tests/scripts/kernel_resources.py update {sys.argv[2]}"
        if not os.path.exists(TABLE) or open(TABLE).read() != inc:
            failures.append(f"{os.path.relpath(TABLE, ROOT)} differs from this build's ptxas report: {fix}")
        if doc_with(doc, markdown) != doc:
            failures.append(f"docs/cuda.md's kernel resources table differs from this build's: {fix}")
    for f in failures:
        print("kernel_resources: FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
