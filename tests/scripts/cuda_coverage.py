#!/usr/bin/env python3
"""Line coverage of the CUDA backend by the emulated tests, measured on what an sm_90a build compiles.

    cuda_coverage.py GCOVR_JSON REPORT [--min PERCENT]

GCOVR_JSON is gcovr's --json output over the emulated build (tests/scripts/cuda_coverage.sh makes it).
The measured files are kernels/cuda/*.cu, *.cuh and linear_cublaslt.cpp. A line is measured when an
sm_90a build compiles it:
- the lines gcov reports as executable in the emulated build (which compiles the same files with
  FP8SERVE_CUDA_FAST_PATHS=1, as the GPU build does), less those only the emulated build compiles
  (an `#if FP8SERVE_CUDA_EMU` branch);
- plus the lines only nvcc compiles (the inline PTX of ptx.cuh, `#if defined(__CUDA_ARCH__)` and
  `#if !FP8SERVE_CUDA_EMU` branches), found by evaluating each file's #if conditions for the
  emulated build and for nvcc's two sm_90a passes (device: __CUDA_ARCH__ 900; host). gcov cannot see
  them, so they count as uncovered. They are counted as statements: a line that starts one (not a
  continuation, comment, directive, brace or `template <...>` line).

Every uncovered line needs a reason in the source: a comment `// coverage: <reason>`
- at the end of a line: that line's statement;
- on its own line: the next line's statement, through its end (a whole `{...}` block when the
  statement opens one), or, when the next line is #if / #ifdef / #ifndef / #elif / #else, that
  branch up to its matching #elif / #else / #endif.
It also explains a function never run (each template instantiation counts: a kernel<128, 8> that no
test launches is reported even when kernel<64, 8> ran every line) when it covers the function's
first line. The report lists every uncovered line by reason; the exit status is 1 when the figure
is under --min (default 95) or a line or a function is uncovered without a reason. A marker that
explains nothing any more is reported (not an error: a rare path may be reached in one run of the
seeded thread orders and not in another).
"""
import argparse
import collections
import glob
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MEASURED = ["kernels/cuda/*.cu", "kernels/cuda/*.cuh", "kernels/cuda/linear_cublaslt.cpp"]
# Built by the emulated build only once the emulator has a cuBLASLt stand-in
# (tests/cuda_emu/cublaslt.cpp): until then the report names it and leaves it out of the figure.
NEEDS_STAND_IN = {"kernels/cuda/linear_cublaslt.cpp": "tests/cuda_emu/cublaslt.cpp"}

# The macros the measured files' #if conditions may read, per build. An unknown one is an error.
EMULATED = {"FP8SERVE_CUDA_EMU": 1, "FP8SERVE_CUDA_FAST_PATHS": 1}
NVCC_DEVICE = {"FP8SERVE_CUDA_EMU": 0, "FP8SERVE_CUDA_FAST_PATHS": 1, "__CUDACC__": 1, "__CUDA_ARCH__": 900,
               "__CUDA_ARCH_FEAT_SM90_ALL": 1}
NVCC_HOST = {"FP8SERVE_CUDA_EMU": 0, "FP8SERVE_CUDA_FAST_PATHS": 1, "__CUDACC__": 1}
KNOWN_MACROS = set(NVCC_DEVICE)

MARKER = re.compile(r"//\s*coverage:\s*(.*\S)")


class SourceError(Exception):
    pass


# ---- #if conditions ------------------------------------------------------------------------------

def evaluate(condition, macros, where):
    """The value of a preprocessor condition (defined, !, &&, ||, comparisons, integers)."""
    tokens = re.findall(r"\d+|[A-Za-z_]\w*|&&|\|\||==|!=|>=|<=|[()!<>]", condition)
    if "".join(tokens) != re.sub(r"\s+", "", condition):
        raise SourceError(f"{where}: cannot evaluate #if {condition}")
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take(expected=None):
        nonlocal pos
        token = peek()
        if token is None or (expected is not None and token != expected):
            raise SourceError(f"{where}: cannot evaluate #if {condition}")
        pos += 1
        return token

    def value_of(name):
        if name not in KNOWN_MACROS:
            raise SourceError(f"{where}: #if reads {name}, unknown to cuda_coverage.py (add it to its builds)")
        return macros.get(name, 0)

    def primary():
        token = take()
        if token == "(":
            v = disjunction()
            take(")")
            return v
        if token == "!":
            return int(not primary())
        if token == "defined":
            name = take()
            if name == "(":
                name = take()
                take(")")
            value_of(name)  # known?
            return int(name in macros)
        if token.isdigit():
            return int(token)
        return value_of(token)

    def comparison():
        v = primary()
        ops = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">=": lambda a, b: a >= b,
               "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}
        while peek() in ops:
            op = take()
            v = int(ops[op](v, primary()))
        return v

    def conjunction():
        v = comparison()
        while peek() == "&&":
            take()
            v = int(comparison() and v)
        return v

    def disjunction():
        v = conjunction()
        while peek() == "||":
            take()
            v = int(conjunction() or v)
        return v

    result = disjunction()
    if peek() is not None:
        raise SourceError(f"{where}: cannot evaluate #if {condition}")
    return bool(result)


def strip_comment(line):
    return re.sub(r"//.*", "", re.sub(r"/\*.*?\*/", "", line))


DIRECTIVE = re.compile(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)")


def compiled_lines(lines, macros, path):
    """Line numbers (1-based) that the preprocessor keeps under `macros`."""
    kept = set()
    stack = []  # per open #if: [parent active, a branch already taken, this branch active]
    active = True
    for number, line in enumerate(lines, 1):
        m = DIRECTIVE.match(strip_comment(line))
        where = f"{path}:{number}"
        if m:
            kind, rest = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                if kind == "if":
                    value = evaluate(rest, macros, where)
                else:
                    evaluate(f"defined({rest})", macros, where)
                    value = (rest in macros) == (kind == "ifdef")
                stack.append([active, value, active and value])
            elif not stack:
                raise SourceError(f"{where}: #{kind} without #if")
            elif kind == "elif":
                frame = stack[-1]
                value = not frame[1] and evaluate(rest, macros, where)
                frame[1] = frame[1] or value
                frame[2] = frame[0] and value
            elif kind == "else":
                frame = stack[-1]
                frame[2] = frame[0] and not frame[1]
                frame[1] = True
            else:
                stack.pop()
            active = stack[-1][2] if stack else True
            continue
        if active:
            kept.add(number)
    if stack:
        raise SourceError(f"{path}: #if without #endif")
    return kept


# ---- statements ----------------------------------------------------------------------------------

def code_of(line):
    """A line without comments and string or character literals (their brackets do not count)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return strip_comment(line).strip()


def statement_starts(lines, numbers):
    """Of `numbers`, the lines that start a statement: not a continuation (inside parentheses),
    comment, directive, lone brace or else, namespace or template header."""
    starts = set()
    depth = 0
    for number, line in enumerate(lines, 1):
        code = code_of(line)
        starts_here = depth == 0
        depth = max(0, depth + code.count("(") - code.count(")"))
        if number not in numbers or not starts_here or not code or code.startswith("#"):
            continue
        if re.fullmatch(r"[{}();\s]*|}?\s*else\s*{?", code) or re.match(r"(namespace\b|template\s*<)", code):
            continue
        starts.add(number)
    return starts


def statement_extent(lines, first):
    """The lines of the statement that starts at `first`: through the line where its parentheses
    and braces close and it ends with ';' or '}' (a block), or a lone line otherwise."""
    parens = braces = 0
    opened = False
    for number in range(first, len(lines) + 1):
        code = code_of(lines[number - 1])
        parens += code.count("(") - code.count(")")
        braces += code.count("{") - code.count("}")
        opened = opened or "{" in code
        if parens <= 0 and braces <= 0 and (code.endswith(";") or code.endswith("}") or (opened and braces <= 0)):
            return range(first, number + 1)
    return range(first, first + 1)


def branch_extent(lines, first):
    """The lines of the #if / #elif / #else branch whose directive is at `first`, up to the matching
    #elif / #else / #endif."""
    depth = 0
    for number in range(first + 1, len(lines) + 1):
        m = DIRECTIVE.match(strip_comment(lines[number - 1]))
        if not m:
            continue
        if m.group(1) in ("if", "ifdef", "ifndef"):
            depth += 1
        elif depth == 0:
            return range(first, number)
        elif m.group(1) == "endif":
            depth -= 1
    raise SourceError(f"line {first}: unterminated #if branch")


def markers(lines, path):
    """{line: reason} for every line some `// coverage:` marker explains, and the markers as
    (line, reason, explained lines)."""
    explained = {}
    found = []
    for number, line in enumerate(lines, 1):
        m = MARKER.search(line)
        if not m:
            continue
        reason = m.group(1)
        before = line[:m.start()].strip()
        if before and not before.startswith("//"):
            target = number  # at the end of a code line
        else:
            target = number + 1
            while target <= len(lines) and (not lines[target - 1].strip() or lines[target - 1].strip().startswith("//")):
                target += 1
            if target > len(lines):
                raise SourceError(f"{path}:{number}: coverage marker with nothing after it")
        if DIRECTIVE.match(strip_comment(lines[target - 1])):
            if DIRECTIVE.match(strip_comment(lines[target - 1])).group(1) == "endif":
                raise SourceError(f"{path}:{number}: coverage marker on an #endif")
            extent = branch_extent(lines, target)
        else:
            extent = statement_extent(lines, target)
        for n in extent:
            explained.setdefault(n, reason)
        found.append((number, reason, set(extent)))
    return explained, found


# ---- the report ----------------------------------------------------------------------------------

def ranges(numbers):
    """'3-5, 9' from [3, 4, 5, 9]."""
    out, numbers = [], sorted(numbers)
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ", ".join(out)


def short_name(name):
    """A demangled function name without its namespaces and parameter list."""
    name = re.sub(r"fp8serve::(cuda::)?(attn::)?(\(anonymous namespace\)::)?", "", name)
    depth, cut = 0, None
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not name[:i].endswith("operator"):
            cut = i
            break
    return name[:cut] if cut else name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gcovr_json")
    parser.add_argument("report")
    parser.add_argument("--min", type=float, default=95.0)
    args = parser.parse_args()

    with open(args.gcovr_json) as f:
        data = json.load(f)
    counts = {}      # file -> {line: count}, every function's (instantiation's) lines summed
    functions = {}   # file -> [(first line, name)] never run
    for entry in data["files"]:
        path = os.path.relpath(os.path.join(ROOT, entry["file"]), ROOT)
        lines = collections.defaultdict(int)
        for line in entry["lines"]:
            lines[line["line_number"]] += line["count"]
        counts[path] = lines
        functions[path] = [(fn["lineno"], fn.get("demangled_name", fn.get("name", "?")))
                           for fn in entry.get("functions", [])
                           if not fn.get("gcovr/excluded") and fn.get("execution_count", 1) == 0]

    paths = sorted({os.path.relpath(p, ROOT) for pattern in MEASURED for p in glob.glob(os.path.join(ROOT, pattern))})
    table, notes, errors = [], [], []
    by_reason = collections.defaultdict(list)  # reason -> [(path, lines)]
    unexplained, unrun, stale = [], [], []
    total = covered = 0
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            lines = f.read().split("\n")
        try:
            emulated = compiled_lines(lines, EMULATED, path)
            nvcc = compiled_lines(lines, NVCC_DEVICE, path) | compiled_lines(lines, NVCC_HOST, path)
            explained, found = markers(lines, path)
        except SourceError as e:
            errors.append(str(e))
            continue
        if path not in counts:
            stand_in = NEEDS_STAND_IN.get(path)
            if stand_in and not os.path.exists(os.path.join(ROOT, stand_in)):
                notes.append(f"{path}: not compiled by the emulated build until the emulator has its cuBLASLt "
                             f"stand-in ({stand_in}): {len(statement_starts(lines, nvcc))} statements left out")
                continue
            if not path.endswith(".cuh"):  # a header may hold nothing the emulated build executes (ptx.cuh)
                errors.append(f"{path}: no coverage data (is it compiled into fp8serve_cuda_emu, with "
                              "FP8SERVE_CUDA_COVERAGE=ON, and did the emulated tests run?)")
                continue
        gcov = counts.get(path, {})
        measured = {n: c for n, c in gcov.items() if n in nvcc}
        nvcc_only = statement_starts(lines, nvcc - emulated) - set(gcov)
        uncovered = {n for n, c in measured.items() if c == 0} | nvcc_only
        file_total = len(measured) + len(nvcc_only)
        file_covered = file_total - len(uncovered)
        total += file_total
        covered += file_covered
        table.append((path, file_total, file_covered, len(nvcc_only)))
        groups = collections.defaultdict(list)
        for n in sorted(uncovered):
            if n in explained:
                groups[explained[n]].append(n)
            else:
                unexplained.append(f"{path}:{n}: {lines[n - 1].strip()}")
        for reason, numbers in groups.items():
            by_reason[reason].append((path, numbers))
        never_run = collections.defaultdict(set)  # a lambda's instantiations share its first line
        for first, name in functions.get(path, []):
            if first not in explained:
                never_run[short_name(name)].add(first)
        unrun += [f"{path}:{ranges(firsts)}: {name}" for name, firsts in sorted(never_run.items())]
        for number, reason, extent in found:
            if not (extent & uncovered) and not any(first in extent for first, _ in functions.get(path, [])):
                stale.append(f"{path}:{number}: {reason}")

    percent = 100.0 * covered / total if total else 0.0
    out = ["CUDA backend line coverage by the emulated tests (lines an sm_90a build compiles)", ""]
    out.append(f"{'file':44} {'lines':>6} {'covered':>8} {'nvcc only':>10}")
    for path, n, c, only in table:
        out.append(f"{path:44} {n:6} {c:8} {only:10}   {100.0 * c / n if n else 100.0:5.1f}%")
    out.append(f"{'total':44} {total:6} {covered:8} {sum(t[3] for t in table):10}   {percent:5.1f}%")
    out += [""] + [f"note: {n}" for n in notes]
    out.append("")
    out.append(f"uncovered lines, by reason ({total - covered}):")
    for reason, places in sorted(by_reason.items(), key=lambda item: -sum(len(p[1]) for p in item[1])):
        count = sum(len(numbers) for _, numbers in places)
        out.append(f"  {reason} [{count}]")
        for path, numbers in places:
            out.append(f"      {path}: {ranges(numbers)}")
    if stale:
        out += ["", "markers that explain no uncovered line or unrun function (covered now? drop them):"]
        out += [f"  {s}" for s in stale]
    failed = False
    if unexplained:
        failed = True
        out += ["", f"FAIL: {len(unexplained)} uncovered lines without a reason (write a test, or a "
                "`// coverage: <reason>` where no test can reach them):"]
        out += [f"  {u}" for u in unexplained]
    if unrun:
        failed = True
        out += ["", f"FAIL: {len(unrun)} functions or template instantiations no emulated test runs:"]
        out += [f"  {u}" for u in unrun]
    if errors:
        failed = True
        out += ["", "FAIL:"] + [f"  {e}" for e in errors]
    if percent < args.min:
        failed = True
        out += ["", f"FAIL: {percent:.1f}% is under {args.min:g}%"]
    out += ["", f"cuda coverage: {covered}/{total} lines, {percent:.1f}% (minimum {args.min:g}%): "
            + ("FAILED" if failed else "ok")]
    text = "\n".join(out) + "\n"
    with open(args.report, "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
