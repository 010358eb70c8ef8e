"""The control flow of a kernel's sm_90a SASS, for tests/scripts/kernel_model.py.

Basic blocks and natural loops (dominators: a back edge goes to a block that dominates its
source, so out-of-line code that jumps back into a loop is not a loop). The walk of a work item
goes from its start block to its end: at each branch the fall-through is taken unless only the
branch target still reaches the end, or reaches it without meeting another instantiation's
streaming loop (`forbidden`); so out-of-line cold code (slow paths, divergent-shuffle fallbacks)
is left out and inline rarely-taken branches are counted (an upper bound, as sass_count.py's loop
counts). Each loop met on the way is walked once and counted x its trips (phases_of: rules, in
walk order, checked against the loop's opcodes). An unrolled loop's remainder code (a peeled
iteration, the 8- and 4-wide tails of a 16-wide body: straight code that loads what the loop next
to it loads) is not counted: the loop's fractional trips carry all its elements.

The scoreboard (Tally): a global load (LDG, LD, ATOMG) marks its destination registers pending;
the first instruction that names a pending register waits one round trip, after which every
pending load has landed; a MEMBAR is one round trip. A loop counts its second of two simulated
iterations per further trip (a load consumed in the next iteration counts there), a fractional
trip waits a whole round trip. Instructions predicated @!PT never execute (no round trip), but
they take issue slots, as sass_count counts them.
"""
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_resources  # noqa: E402  ptxas's report: registers, static shared memory, block size
import sass_count  # noqa: E402  tool lookup, cubin extraction, disassembly

BANKS, BANK_BYTES, WAVEFRONT_BYTES = 32, 4, 128


# ---- the SASS: control flow, the walk, the scoreboard --------------------------------------------

class Sass:
    """One kernel's disassembly as basic blocks and natural loops."""

    def __init__(self, code):
        flat, where = [], {}
        for label, op, text in code:
            if label:
                where[label] = len(flat)
            else:
                flat.append((op, text))
        ends = {i + 1 for i, (op, _) in enumerate(flat) if op.startswith(("BRA", "EXIT", "RET"))}
        lead = sorted(x for x in {0} | set(where.values()) | ends if x < len(flat))
        index = {s: k for k, s in enumerate(lead)}
        self.flat = flat
        self.blocks = [(s, (lead[k + 1] if k + 1 < len(lead) else len(flat)) - 1) for k, s in enumerate(lead)]
        self.fall, self.taken = [], []
        for k, (_, e) in enumerate(self.blocks):
            op, text = flat[e]
            cond = bool(re.match(r"@!?U?P\d", text)) or op == "BRA.DIV"
            nxt = k + 1 if k + 1 < len(self.blocks) else None
            m = re.search(r"`\((\.L_x_\d+)\)", text)
            jump = op.startswith("BRA") and m and m[1] in where
            self.taken.append(index[where[m[1]]] if jump else None)
            self.fall.append(nxt if cond or not op.startswith(("BRA", "EXIT", "RET")) else None)
        self._loops()

    def succ(self, u):
        return [v for v in (self.fall[u], self.taken[u]) if v is not None]

    def _loops(self):
        preds = [[] for _ in self.blocks]
        for u in range(len(self.blocks)):
            for v in self.succ(u):
                preds[v].append(u)
        order, seen, stack = [], {0}, [(0, iter(self.succ(0)))]
        while stack:
            u, it = stack[-1]
            v = next(it, None)
            if v is None:
                order.append(stack.pop()[0])
            elif v not in seen:
                seen.add(v)
                stack.append((v, iter(self.succ(v))))
        rpo = order[::-1]
        pos = {u: i for i, u in enumerate(rpo)}
        idom, changed = {0: 0}, True
        while changed:  # Cooper, Harvey and Kennedy's iteration
            changed = False
            for u in rpo[1:]:
                ps = [p for p in preds[u] if p in idom]
                d = ps[0]
                for p in ps[1:]:
                    a, b = d, p
                    while a != b:
                        while pos[a] > pos[b]:
                            a = idom[a]
                        while pos[b] > pos[a]:
                            b = idom[b]
                    d = a
                if idom.get(u) != d:
                    idom[u], changed = d, True

        def dominates(a, b):
            while b != a and idom[b] != b:
                b = idom[b]
            return a == b
        self.reachable, self.loops, self.back = set(idom), {}, set()
        for u in idom:
            for h in self.succ(u):
                if dominates(h, u):
                    loop = self.loops.setdefault(h, {"latches": set(), "body": {h}})
                    loop["latches"].add(u)
                    self.back.add((u, h))
                    stack = [u]
                    while stack:
                        x = stack.pop()
                        if x not in loop["body"]:
                            loop["body"].add(x)
                            stack.extend(p for p in preds[x] if p in idom)

    def ops(self, blocks):
        return [self.flat[i][0] for b in sorted(blocks) for i in range(self.blocks[b][0], self.blocks[b][1] + 1)]

    def count(self, blocks, prefix):
        return sum(1 for op in self.ops(blocks) if op.startswith(prefix))

    def reaches(self, start, within, targets, avoid=frozenset()):
        seen, stack = set(), [start]
        while stack:
            x = stack.pop()
            if x in seen or x in avoid:
                continue
            if x in targets:
                return True
            seen.add(x)
            stack.extend(v for v in self.succ(x) if v in within and (x, v) not in self.back)
        return False

    def region(self, start, within, targets):
        """Blocks reachable from start inside `within`, by forward edges, stopping at targets."""
        seen, stack = set(), [start]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x not in targets:
                stack.extend(v for v in self.succ(x) if v in within and (x, v) not in self.back)
        return seen

    def toward(self, ways, within, targets, toward):
        want, shun = toward
        regions = [self.region(v, within, targets) for v in ways]
        common = set.intersection(*regions)
        scores = [bool((r - common) & set(want)) - bool((r - common) & set(shun)) for r in regions]
        return ways[scores.index(max(scores))]

    def walk(self, start, targets, within, header, forbidden, toward=(frozenset(), frozenset())):
        """The item's path from block start to a block of targets, inside `within` (a loop's body,
        whose header is `header`, or the kernel): [("b", block) | ("L", loop header, body path)].
        toward = (want, shun): at a branch, each way scores +1 if the blocks only it reaches (before
        the ways join) hold one of `want`, -1 if they hold one of `shun` (code the modelled shape
        does not run); the walk takes the first of the best, whatever the layout."""
        path, u = [], start
        for _ in range(len(self.blocks) * 4):
            loop = self.loops.get(u)
            if loop is not None and u != header and loop["body"] <= within and u not in targets:
                path.append(("L", u, self.walk(u, loop["latches"], loop["body"], u, forbidden, toward)))
                # leave by the latch's exit, else the header's, else the first
                exits = sorted(((x not in loop["latches"], x != u, x), v) for x in loop["body"]
                               for v in self.succ(x) if v not in loop["body"] and v in within)
                u = next(v for _, v in exits if self.reaches(v, within, targets))
                continue
            path.append(("b", u))
            if u in targets:
                return path
            nxt = [v for v in self.succ(u)
                   if v in within and (u, v) not in self.back and self.reaches(v, within, targets)]
            if not nxt:
                raise RuntimeError(f"sass_flow: the walk from block {u} reaches no end")
            # the fall-through first; but not into code that can enter another instantiation's loop
            clean = [v for v in nxt if not self.reaches(v, within, forbidden, avoid=targets)] or nxt
            u = self.toward(clean, within, targets, toward) if len(clean) > 1 and any(toward) else clean[0]
        raise RuntimeError("sass_flow: the walk does not end")


def loops_of(path):
    """The loops of a path in the order the walk meets them (pre-order)."""
    out = []
    for item in path:
        if item[0] == "L":
            out.append(item)
            out.extend(loops_of(item[2]))
    return out


GLOBAL_LOAD = re.compile(r"^(LDG|LD|ATOMG|ATOM)(\.|$)")
FP64 = ("DFMA", "DADD", "DMUL", "DSETP", "DMNMX")


def registers(text):
    regs = set()
    for m in re.finditer(r"\bR(\d+)(\.64)?\b", text):
        regs.update(range(int(m[1]), int(m[1]) + (2 if m[2] else 1)))
    return regs


class Tally:
    """Instructions, FP64 instructions and round trips of a path (per warp), trips from `trips`."""

    def __init__(self, sass, trips, l1=()):
        self.sass, self.trips, self.l1 = sass, trips, set(l1)

    def block(self, b, pending, acc):
        for i in range(self.sass.blocks[b][0], self.sass.blocks[b][1] + 1):
            op, text = self.sass.flat[i]
            acc["instr"] += 1
            acc["fp64"] += op.startswith(FP64) or ".F64" in op
            if text.startswith("@!PT"):
                continue  # never executes
            body = re.sub(r"^@!?U?P\w+\s+", "", text)
            if op.startswith("MEMBAR") or (registers(body) & pending):
                acc["rt"] += 1
                pending.clear()
            if GLOBAL_LOAD.match(op):
                width = 4 if ".128" in op else 2 if ".64" in op else 1
                acc["bytes"] += 32 * (2 if ".U16" in op or ".S16" in op else 1 if ".U8" in op else 4 * width)
                dest = next((x for x in body.split(None, 1)[-1].split(",") if re.match(r"\s*R(\d+|Z)\b", x)), "RZ")
                if dest.strip() != "RZ":
                    first = int(re.search(r"R(\d+)", dest)[1])
                    pending.update(range(first, first + width))

    def remainder(self, path, i):
        """Whether straight block path[i] is an unrolled loop's remainder (a peeled iteration, the
        8- and 4-wide tails of a 16-wide body): it loads as the nearest loop before or after it does.
        Its elements are in that loop's (fractional) trips instead."""
        first, last = self.sass.blocks[path[i][1]]
        mine = {self.sass.flat[x][0] for x in range(first, last + 1) if GLOBAL_LOAD.match(self.sass.flat[x][0])}
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(path) and path[j][0] == "b":
                j += step
            if mine and 0 <= j < len(path) and mine & set(self.sass.ops(self.sass.loops[path[j][1]]["body"])):
                return True
        return False

    def path(self, path, pending, acc, top=None):
        for i, item in enumerate(path):
            if item[0] == "b":
                if not self.remainder(top or path, i if top is None else top.index(item)):
                    self.block(item[1], pending, acc)
                continue
            trips = self.trips(item[1])
            if not trips:
                continue  # never runs here (a stream counted apart)
            first, second = dict.fromkeys(acc, 0), dict.fromkeys(acc, 0)  # two iterations
            self.path(item[2], pending, first)
            self.path(item[2], pending, second)
            for key in first:  # a fractional trip (a remainder) still waits its whole round trip
                whole = math.ceil(trips) if key.startswith("rt") else trips
                into = "rt_l1" if key == "rt" and item[1] in self.l1 else key
                acc[into] += first[key] * min(whole, 1) + second[key] * max(whole - 1, 0)

    def phases(self, path):
        """[{instr, fp64, rt, bytes}] per top-level element of the path (per warp)."""
        out, pending = [], set()
        for item in path:
            acc = {"instr": 0, "fp64": 0, "rt": 0, "rt_l1": 0, "bytes": 0}
            self.path([item], pending, acc, top=path)
            out.append(acc)
        return out


def hmma_chain(sass, path):
    """The longest chain of HMMAs each accumulating onto the previous one's result, along a path."""
    chain = {}
    for item in path:
        blocks = [item[1]] if item[0] == "b" else [b for _, b in walk_blocks(item[2])]
        for b in blocks:
            for i in range(sass.blocks[b][0], sass.blocks[b][1] + 1):
                op, text = sass.flat[i]
                if op.startswith("HMMA"):
                    regs = re.findall(r"\b(R\d+|RZ)\b", text)
                    chain[regs[0]] = chain.get(regs[3], 0) + 1
    return max(chain.values(), default=0)


def walk_blocks(path):
    for item in path:
        if item[0] == "b":
            yield item
        else:
            yield from walk_blocks(item[2])


def shared_wavefronts(addresses, width):
    """Wavefronts of one warp-wide shared-memory request: 32 lanes' byte addresses, `width` bytes each."""
    banks = {}
    for a in addresses:
        for w in range(a // BANK_BYTES, (a + width) // BANK_BYTES):
            banks.setdefault(w % BANKS, set()).add(w)
    return max(math.ceil(len(addresses) * width / WAVEFRONT_BYTES), max(len(s) for s in banks.values()))


# ---- inputs: the build's cubins and ptxas report -------------------------------------------------

class Build:
    """The nvcc build's object folder: each object's sm_90a SASS (disassembled once) and ptxas's report."""

    def __init__(self, objects):
        self.objects, self._code, self._sass, self._res = objects, {}, {}, None

    def sass(self, obj, pattern):
        if obj not in self._code:
            with tempfile.TemporaryDirectory() as work:
                self._code[obj] = sass_count.disassemble(sass_count.sm90_cubin(os.path.join(self.objects, obj), work))
        names = sorted((n for n in self._code[obj] if re.search(pattern, n)), key=len)
        if not names:
            sys.exit(f"kernel_model: no kernel matches {pattern!r} in {obj}")
        if names[0] not in self._sass:
            self._sass[names[0]] = Sass(self._code[obj][names[0]])
        return self._sass[names[0]]

    def resources(self, pattern):
        if self._res is None:
            self._res = kernel_resources.build(self.objects)
        rows = sorted((r for r in self._res if re.search(pattern, r["name"])), key=lambda r: len(r["name"]))
        if not rows:
            sys.exit(f"kernel_model: ptxas reports no kernel matching {pattern!r}")
        return rows[0]


def phases_of(sass, path, rules, hot=None):
    """Tally's phases of a path whose loops, in walk order, take the rules in order (a loop of
    `hot`, the stream, takes none: 0 trips). A rule is (tag, opcode prefixes the loop holds, prefixes
    it lacks, trips(its opcodes), optional[, "L1": its loads hit L1]); a loop that fits no rule, or a
    required rule that fits no loop, ends the script: the kernel changed."""
    trips, queue, l1 = {}, list(rules), set()
    for _, header, _ in loops_of(path):
        if header == hot:
            trips[header] = 0  # the stream: counted apart
            continue
        ops = sass.ops(sass.loops[header]["body"])
        while queue:
            tag, need, avoid, count, optional, *flags = queue.pop(0)
            fits = all(any(o.startswith(n) for o in ops) for n in need)
            if fits and not any(o.startswith(tuple(avoid)) for o in ops):
                trips[header] = count(ops)
                l1.update([header] if "L1" in flags else [])
                break
            if not optional:
                sys.exit(f"kernel_model: the loop at instruction {sass.blocks[header][0]} is not {tag!r} (the "
                         "kernel changed: update its rules in tests/scripts/kernel_model.py)")
        else:
            sys.exit(f"kernel_model: more loops on the path than rules (instruction {sass.blocks[header][0]})")
    if any(not r[4] for r in queue):
        sys.exit(f"kernel_model: loops {[r[0] for r in queue if not r[4]]} not found on the path")
    return Tally(sass, lambda h: trips.get(h, 1), l1).phases(path)


def n_ops(ops, prefix):
    return max(1, sum(1 for o in ops if o.startswith(prefix)))


def sum_phases(phases):
    return {k: sum(p[k] for p in phases) for k in ("instr", "fp64", "rt", "rt_l1", "bytes")}


def exit_blocks(sass):
    return sorted(b for b in sass.reachable if sass.flat[sass.blocks[b][1]][0].startswith("EXIT"))
