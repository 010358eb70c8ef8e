#!/usr/bin/env python3
"""Static SASS instruction counts of kernels' steady-state loops, per byte of memory they stream.

The issue budget (docs/cuda.md, "CUDA attention"): an H200 SM receives 4.8 TB/s / 132 SMs / 1.98 GHz =
18.4 bytes per clock and issues 4 warp instructions per clock, so a kernel that streams its bytes
at full bandwidth may spend at most 4 / 18.4 = 0.217 warp instructions per byte (892 per 4 KiB).

A loop is a backward branch: the instructions from its target label to the branch. For one kernel
(the demangled name matched by a regular expression) the script picks, among the loops that hold
every `--require` opcode (a regular expression over the opcode, e.g. HMMA or LDGSTS), the one with
the most `--rank` instructions (e.g. the E4M3 conversions: the FP8 segment's loop rather than the
bf16 tail's), and counts one iteration: every instruction of the loop's body once (branches never
taken in the steady state, such as a rescale that only a growing maximum needs, are included, so
the figure is an upper bound), inner loops (backward branches inside it) times `--trips` (one
count per inner loop in address order; 1 when not given). Divided by `--bytes` (what one iteration
streams) it is compared with the budget.

  sass_count.py OBJ --kernel REGEX --require OP [--require OP] [--rank OP] --bytes N [--trips N,...]
      one kernel, one loop (any kernel: the FP8-weight GEMV's row loop, ...)
  sass_count.py OBJ --table
      the decode attention's table (DECODE_ROWS below), as docs/cuda.md records it
  sass_count.py OBJ --check
      the same, exit status 1 when a hot loop exceeds the budget (CTest: sass_budget)

OBJ: an object or cubin of the nvcc build (build/kernels/cuda/CMakeFiles/fp8serve_cuda.dir/
paged_attention_decode.cu.o); its sm_90a cubin is disassembled. Tools: cuobjdump and nvdisasm from
PATH, CUDA_HOME/bin, or the PyPI wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
(tests/requirements.txt).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HBM_BYTES_PER_S = 4.8e12
SMS = 132
CLOCK_HZ = 1.98e9
ISSUE_PER_CLOCK = 4  # schedulers per SM
BUDGET = ISSUE_PER_CLOCK / (HBM_BYTES_PER_S / SMS / CLOCK_HZ)  # warp instructions per byte: 0.217

# The decode attention's hot loops at head_dim 128, block size 16: one iteration is one 4 KiB chunk
# (2 KiB of K + 2 KiB of V: 16 FP8 tokens). (label, kernel regex, required opcodes, ranking opcode,
# bytes, inner-loop trips, checked against the budget).
# The CUDA-core kernel's inner loops at <128, rows>: the p.V token loop (16 tokens, one lane row
# group), the score butterfly over lanes (quads = 4: offsets 4, 8, 16) and the per-row max / sum
# butterflies (offsets 1, 2); the script prints them so that their order can be checked.
def simt_trips(ops):
    """Trip count of an inner loop of the CUDA-core decode at <128, rows>, FP8, 16-token chunks,
    from its opcodes: the p.V token loop (16 tokens over the unroll ptxas chose: 2 F2FP per token),
    the score butterfly (4 x rows shuffles per step; offsets 4, 8, 16) and each row's max or sum
    butterfly (one shuffle; offsets 1, 2)."""
    f2fp = sum(1 for op in ops if op.startswith("F2FP"))
    shfl = sum(1 for op in ops if op.startswith("SHFL"))
    if f2fp:
        return max(1, 16 * 2 // f2fp)
    if shfl >= 4:
        return 3
    return 2 if shfl else 1


DECODE_ROWS = [
    ("simt <128,1> FP8", r"paged_decode_kernel<128, 1>", ["LDGSTS", "F2FP"], "F2FP", 4096, simt_trips, False),
    ("simt <128,2> FP8", r"paged_decode_kernel<128, 2>", ["LDGSTS", "F2FP"], "F2FP", 4096, simt_trips, False),
    ("simt <128,4> FP8", r"paged_decode_kernel<128, 4>", ["LDGSTS", "F2FP"], "F2FP", 4096, simt_trips, False),
    ("simt <128,8> FP8", r"paged_decode_kernel<128, 8>", ["LDGSTS", "F2FP"], "F2FP", 4096, simt_trips, False),
    ("mma <128,8> FP8 (groups 4-8)", r"paged_decode_mma_kernel<128, 8>", ["LDGSTS", "HMMA"], "F2FP", 4096, None, True),
    ("mma <128,16> FP8 (groups 9-16)", r"paged_decode_mma_kernel<128, 16>", ["LDGSTS", "HMMA"], "F2FP", 4096, None,
     True),
]


def tool(name):
    found = shutil.which(name)
    if found:
        return found
    for root in filter(None, [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]):
        if os.path.exists(os.path.join(root, "bin", name)):
            return os.path.join(root, "bin", name)
    try:
        import nvidia  # PyPI: nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump
        for base in nvidia.__path__:
            hits = glob.glob(os.path.join(base, "*", "bin", name))
            if hits:
                return hits[0]
    except ImportError:
        pass
    print(f"sass_count: {name} not found (pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump)")
    sys.exit(77)  # CTest: skipped (SKIP_RETURN_CODE), not passed


def sm90_cubin(obj, workdir):
    """The sm_90a cubin inside obj (or obj itself when it is one)."""
    with open(obj, "rb") as f:
        head = f.read(64)
    listing = subprocess.run([tool("cuobjdump"), "-lelf", obj], capture_output=True, text=True).stdout
    names = re.findall(r"ELF file\s+\d+:\s+(\S+)", listing)
    if not names:
        if head[:4] == b"\x7fELF":
            return obj  # a plain cubin
        sys.exit(f"sass_count: no cubin in {obj}")
    wanted = [n for n in names if "sm_90" in n] or names
    subprocess.run([tool("cuobjdump"), "-xelf", wanted[0], os.path.abspath(obj)], cwd=workdir, check=True,
                   capture_output=True)
    return os.path.join(workdir, wanted[0])


def disassemble(cubin):
    """{demangled kernel name: [(label or None, opcode, text)]} in address order."""
    text = subprocess.run([tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout
    kernels, current, mangled = {}, None, []
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):$", line)
        if m:
            mangled.append(m[1])
            current = kernels.setdefault(m[1], [])
            continue
        if current is None:
            continue
        m = re.match(r"^(\.L_x_\d+):$", line)
        if m:
            current.append((m[1], None, ""))
            continue
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            body = re.sub(r"^@!?U?P\w+\s+", "", m[2].strip())
            current.append((None, body.split()[0], m[2].strip()))
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
    names = {}
    for m, d in zip(mangled, demangled):
        names[re.sub(r"\(anonymous namespace\)::|fp8serve::cuda::", "", d)] = kernels[m]
    return names


def loops(code):
    """[(start, end)] index ranges of the instructions of each loop (label .. backward branch)."""
    where, found, index = {}, [], 0
    flat = []
    for label, opcode, text in code:
        if label:
            where[label] = len(flat)
        else:
            flat.append((opcode, text))
    for i, (opcode, text) in enumerate(flat):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", text)
        if m and m[1] in where and where[m[1]] <= i and opcode in ("BRA",):
            found.append((where[m[1]], i))
    return flat, found


def count_loop(flat, loop, trips):
    """Instructions of one iteration: the body, inner loops weighted by trips (in address order)."""
    start, end = loop
    _, all_loops = loops_cache[id(flat)]
    inner = sorted(l for l in all_loops if start <= l[0] and l[1] < end and l != loop)
    # Only the outermost of the nested inner loops get a trip count each.
    top = [l for l in inner if not any(o != l and o[0] <= l[0] and l[1] <= o[1] for o in inner)]
    weights = [1] * (end - start + 1)
    for k, (a, b) in enumerate(top):
        if callable(trips):
            t = trips([flat[i][0] for i in range(a, b + 1)])
        else:
            t = trips[k] if trips and k < len(trips) else 1
        for i in range(a, b + 1):
            weights[i - start] *= t
    return sum(weights), top


loops_cache = {}


def measure(kernels, pattern, require, rank, nbytes, trips):
    matches = [n for n in kernels if re.search(pattern, n)]
    if not matches:
        sys.exit(f"sass_count: no kernel matches {pattern!r}")
    name = sorted(matches, key=len)[0]
    flat, found = loops(kernels[name])
    loops_cache[id(flat)] = (flat, found)
    candidates = []
    for loop in found:
        ops = [flat[i][0] for i in range(loop[0], loop[1] + 1)]
        if all(any(re.match(r, op) for op in ops) for r in require):
            candidates.append((sum(1 for op in ops if re.match(rank, op)) if rank else 0, loop))
    # The innermost loops that hold the required opcodes (not the item loop around them all), and
    # of those the one with the most ranked instructions.
    innermost = [c for c in candidates
                 if not any(o[1] != c[1] and c[1][0] <= o[1][0] and o[1][1] <= c[1][1] for o in candidates)]
    if not innermost:
        sys.exit(f"sass_count: {name}: no loop holds {require}")
    best = max(innermost, key=lambda c: c[0])
    loop = best[1]
    total, inner = count_loop(flat, loop, trips)
    ops = [flat[i][0] for i in range(loop[0], loop[1] + 1)]
    classes = {}
    for op in ops:
        key = op.split(".")[0]
        classes[key] = classes.get(key, 0) + 1
    weights = [trips([flat[i][0] for i in range(a, b + 1)]) if callable(trips) else
               (trips[k] if trips and k < len(trips) else 1) for k, (a, b) in enumerate(inner)]
    return {"name": name, "instructions": total, "body": len(ops),
            "inner": [f"{b - a + 1} x {w}" for (a, b), w in zip(inner, weights)],
            "per_byte": total / nbytes, "bytes": nbytes, "classes": classes}


def print_row(label, r):
    share = r["per_byte"] / BUDGET
    print(f"| {label} | {r['instructions']} | {r['per_byte']:.3f} | {min(1.0, 1.0 / share) * 100:.0f}% |"
          f" {', '.join(str(x) for x in r['inner']) or '-'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("obj")
    ap.add_argument("--kernel")
    ap.add_argument("--require", action="append", default=[])
    ap.add_argument("--rank")
    ap.add_argument("--bytes", type=int)
    ap.add_argument("--trips", help="comma-separated trip counts of the inner loops, in address order")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--classes", action="store_true", help="print the opcodes' classes of the loop")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        kernels = disassemble(sm90_cubin(a.obj, work))
    print(f"budget: {ISSUE_PER_CLOCK} issues/clock / ({HBM_BYTES_PER_S / 1e12:.1f} TB/s / {SMS} SMs / "
          f"{CLOCK_HZ / 1e9:.2f} GHz) = {BUDGET:.3f} warp instructions per byte ({BUDGET * 4096:.0f} per 4 KiB)")
    print("| loop | instructions per iteration | per byte | allowed fraction of HBM (issue-bound) |"
          " inner loops (size x trips) |")
    print("|---|---|---|---|---|")
    if a.kernel:
        trips = [int(x) for x in a.trips.split(",")] if a.trips else None
        r = measure(kernels, a.kernel, a.require, a.rank, a.bytes, trips)
        print_row(r["name"], r)
        if a.classes:
            print(r["classes"])
        return 0
    over = []
    for label, pattern, require, rank, nbytes, trips, checked in DECODE_ROWS:
        r = measure(kernels, pattern, require, rank, nbytes, trips)
        print_row(label, r)
        if a.classes:
            print(r["classes"])
        if checked and r["per_byte"] > BUDGET:
            over.append(label)
    if a.check and over:
        print("over the budget: " + ", ".join(over))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
