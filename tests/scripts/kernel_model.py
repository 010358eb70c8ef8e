#!/usr/bin/env python3
"""A whole-kernel static performance model of the sm_90a CUDA kernels (issue 32, item 1).

sass_count.py counts one hot loop per byte; this script estimates whole kernels at Llama-3-8B
shapes on an H200, from the nvcc build's own cubins (SASS, nvdisasm) and ptxas report (registers,
static shared memory, kernel_resources.py) and the kernels' own constants (kSlots,
kStages, ... read from their sources). Nothing here ran on a GPU: every figure is an estimate, and
the constants below are stated guesses, not fits to a measurement.

Work items. An item is what one CTA does at a time: a GEMV CTA (128 rows x one k slice), a decode
item (sequence, KV head, partition), a sampling row's slice. CTAs/SM = min(by registers, threads and 32
CTAs: kernel_resources.ctas_by_registers; by shared memory: 228 KiB / (static + dynamic + 1 KiB));
slots = CTAs/SM x SMs; slot s (on SM s mod SMs) runs items s, s + slots, ... one after another:
the persistent decode grid does exactly this, a grid of equal CTAs does it in effect (waves =
items / slots; "slots busy" = items / (rounds x slots)).

An item's SASS is its path through the kernel's control flow, loops counted x their trips from the
shape (sass_flow.py: the walk, the remainder rule, the scoreboard that counts dependent global
round trips; RULES here name each loop on the path and its trips). The streamed data (W, K/V) is
a stream of units (a 256-input k step, a 4 KiB chunk) per warp, the hot loop counted as
sass_count.py counts it. Round trips on the path are L2 hits (metadata, what the previous kernel
wrote; a rule may mark a second pass over the same data an L1 hit); the stream's first is DRAM.

Time of one launch, the largest bound plus what cannot overlap:
  T = KERNEL_FIXED + prologue + max(serial, issue, FP64, shared, SM, HBM) + epilogue
  serial = items of the busiest slot x item, where item (a CTA alone on an SM) =
           sum over its path's phases (each top-level loop, each straight block) of
             max(round trips x latency + instructions / (WARP_IPC x clock),        one warp
                 warps x instructions / (4 x ISSUE_EFFICIENCY x clock), FP64, bytes / SM_BYTES)
           + stream: DRAM_LATENCY + unit + (units - 1) x max(unit, DRAM_LATENCY / units in flight),
             unit = max(instructions / WARP_IPC, HMMA accumulator chain x HMMA_LATENCY, CTA issue)
  issue  = busiest SM's items x warps x instructions per item / (4 x ISSUE_EFFICIENCY x clock)
  FP64   = the same at FP64_PER_CLOCK; SM = its bytes / SM_BYTES_PER_CLOCK
  shared = its shared-memory wavefronts (1 per clock): per chunk from the hot loop's LDS / LDGSTS
           and the access pattern (32 banks of 4 bytes; a request takes max(bytes / 128, most
           distinct words in one bank) wavefronts)
  HBM    = bytes moved / min(HBM_EFFICIENCY x peak, sum over SMs of min(SM_BYTES, bytes in flight /
           DRAM_LATENCY)): Little's law, 4.8 TB/s x 0.8 us / 132 SMs = 28 KiB per SM
  fraction of HBM = the kernel's compulsory bytes (weights or KV, activations) / T / peak
The decode attention's time includes its merge launch (paged_merge_kernel) when a context may
split; sampling's is the sum of its launches (each row in slices, as sampling.cu cuts it), set
against a batch-64 decode step's HBM time (8.03 GB of FP8 weights + the KV).

  kernel_model.py [--table] [--objects DIR]   the Markdown tables (docs/cuda.md keeps them)
  kernel_model.py --check-docs docs/cuda.md   exit 1 when the doc's copy differs (CTest kernel_model)
  kernel_model.py --update-docs docs/cuda.md  rewrite the doc's copy between its markers
Exit 77 (CTest: skipped) without the nvcc build's objects or cuobjdump/nvdisasm, as sass_budget.
"""
import argparse
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_resources  # noqa: E402  ptxas's report: registers, shared memory, block size
import sass_count  # noqa: E402  the tools, the issue budget's constants
from sass_flow import (Build, Tally, exit_blocks, hmma_chain, n_ops, phases_of, shared_wavefronts,  # noqa: E402
                       sum_phases, walk_blocks)

ROOT = kernel_resources.ROOT
OBJECTS = os.path.join(ROOT, "build", "kernels", "cuda", "CMakeFiles", "fp8serve_cuda.dir")
BEGIN, END = "<!-- kernel-model:begin -->", "<!-- kernel-model:end -->"

H200 = {"name": "H200", "hbm": 4.8e12, "sms": 132, "clock": 1.98e9}
H100 = {"name": "H100 SXM", "hbm": 3.35e12, "sms": 132, "clock": 1.98e9}
SHARED_PER_SM, SHARED_RESERVED_PER_CTA = 228 * 1024, 1024  # sm_90; the runtime reserves 1 KiB a CTA
ISSUE_PER_CLOCK = sass_count.ISSUE_PER_CLOCK  # 4 schedulers
ISSUE_EFFICIENCY = 0.7  # sustained issue is typically 60-80% of 4 per clock
WARP_IPC = 0.75  # a lone warp: dependent instructions stall it about one clock in four
FP64_PER_CLOCK = 2  # warp instructions: 64 FP64 lanes per SM per clock (H100 / H200)
HMMA_LATENCY = 33  # clocks from one mma.sync m16n8k16 to the next on its accumulator
DRAM_LATENCY = 0.8e-6  # one dependent global round trip to HBM under load (the issue: 0.7-1 us)
DRAM_RANGE = (0.7e-6, 1.0e-6)  # the summary prints the estimate at both ends
L2_LATENCY = 0.2e-6  # a round trip that hits L2 (~260 clocks idle on Hopper, more under load)
L1_LATENCY = 20e-9  # one that hits L1: a second pass over what the warp just loaded
HBM_EFFICIENCY = 0.9  # a streaming copy reaches ~90% of the HBM peak
SM_BYTES_PER_CLOCK = 64  # what one SM can pull from L2 / HBM per clock
KERNEL_FIXED = 1.0e-6  # CTA launch ramp and drain of one kernel (host launch gaps not counted)

# Llama-3-8B: hidden 4096, intermediate 14336, vocabulary 128256, 32 layers, 32 query / 8 KV
# heads of 128, FP8 KV in blocks of 16 tokens.
LAYERS, KV_HEADS, GROUP, HEAD_DIM, BLOCK, VOCAB = 32, 8, 4, 128, 16, 128256
WEIGHT_BYTES = 8.03e9  # FP8 weights a decode step reads


def ctas_per_sm(res, dynamic_shared=0):
    by_regs = kernel_resources.ctas_by_registers(res["registers"], res["threads"])
    by_smem = SHARED_PER_SM // (res["shared"] + dynamic_shared + SHARED_RESERVED_PER_CTA)
    return max(0, min(by_regs, by_smem))


def phases_time(m, phases, warps):
    """A CTA alone: each phase takes its warp's chain or the CTA's share of the SM, whichever is longer."""
    total = 0.0
    for ph in phases:
        chain = ph["rt"] * L2_LATENCY + ph["rt_l1"] * L1_LATENCY + ph["instr"] / (WARP_IPC * m["clock"])
        share = max(warps * ph["instr"] / (ISSUE_PER_CLOCK * ISSUE_EFFICIENCY * m["clock"]),
                    warps * ph["fp64"] / (FP64_PER_CLOCK * m["clock"]),
                    warps * ph["bytes"] / (SM_BYTES_PER_CLOCK * m["clock"]))
        total += max(chain, share)
    return total


def stream_time(m, units, instr, chain, warps, in_flight, head=0.0):
    """A warp's stream of units (chunks, k steps): the first lands after a DRAM round trip (or after
    `head`, work done while its loads were in flight, if longer), then each takes its compute or its
    share of the latency, in_flight units being in the air."""
    compute = max(instr / (WARP_IPC * m["clock"]), chain * HMMA_LATENCY / m["clock"],
                  warps * instr / (ISSUE_PER_CLOCK * ISSUE_EFFICIENCY * m["clock"]))
    first = max(m["dram"], head)
    return first + compute + max(0, units - 1) * max(compute, m["dram"] / in_flight) if units else head


def kernel_time(m, k):
    """k: items, ctas (per SM), warps, item (seconds alone), instr / fp64 per item per warp,
    wavefronts, sm_bytes per item, hbm_bytes (moved), in_flight per CTA, prologue, epilogue."""
    slots = k["ctas"] * m["sms"]
    per_slot = [len(range(s, k["items"], slots)) for s in range(min(slots, k["items"]))]
    per_sm, busy = [0] * m["sms"], [0] * m["sms"]
    for s, n in enumerate(per_slot):
        per_sm[s % m["sms"]] += n
        busy[s % m["sms"]] += 1
    most, clock = max(per_sm), m["clock"]
    little = sum(min(SM_BYTES_PER_CLOCK * clock, b * k["in_flight"] / m["dram"]) for b in busy if b)
    bounds = {
        "serial chain": per_slot[0] * k["item"],
        "issue": most * k["warps"] * k["instr"] / (ISSUE_PER_CLOCK * ISSUE_EFFICIENCY * clock),
        "FP64": most * k["warps"] * k["fp64"] / (FP64_PER_CLOCK * clock),
        "shared memory": most * k["wavefronts"] / clock,
        "SM bandwidth": most * k["sm_bytes"] / (SM_BYTES_PER_CLOCK * clock),
        "HBM": k["hbm_bytes"] / min(HBM_EFFICIENCY * m["hbm"], little) if k["hbm_bytes"] else 0.0,
    }
    binds = max(bounds, key=bounds.get)
    time = KERNEL_FIXED + k.get("prologue", 0.0) + bounds[binds] + k.get("epilogue", 0.0)
    return {"time": time, "binds": binds, "bounds": bounds, "waves": k["items"] / slots,
            "tail": k["items"] / (per_slot[0] * slots), "in_flight_sm": min(k["ctas"], max(busy)) * k["in_flight"]}


# ---- the kernels ---------------------------------------------------------------------------------

def loop_walk(sass, header):
    """One iteration of a loop: its walk and its instructions (for the decode's hot loop the walk
    and sass_count's label-to-branch count agree: 683 at FP8; the GEMV's walk leaves out the masked
    loads of a slice's partial last step, which sass_count's 695 includes)."""
    path = sass.walk(header, sass.loops[header]["latches"], sass.loops[header]["body"], header, set())
    return path, sum(p["instr"] for p in Tally(sass, lambda h: 1).phases(path))


def source_constants(*paths):
    """The integer constexprs of kernel sources (kSlots, kStages, ...), resolved."""
    text = "".join(re.sub(r"//.*", "", open(os.path.join(ROOT, p)).read()) for p in paths)
    found, values = re.findall(r"constexpr\s+(?:int|int32_t|int64_t)\s+(\w+)\s*=\s*([^;]+);", text), {}
    for _ in found:
        for name, expr in found:
            try:
                values.setdefault(name, int(eval(expr, {"__builtins__": {}}, dict(values))))
            except Exception:
                pass
    return values


def gemv(b, m, n, k, tokens):
    c = source_constants("kernels/cuda/linear_fp8_gemv.cu")
    tiles = 1 if tokens <= 8 else 2
    pattern = rf"linear_fp8_gemv_kernel<{tiles}, false, true>"  # one scale per row, 16-byte loads
    res, sass = b.resources(pattern), b.sass("linear_fp8_gemv.cu.o", pattern)
    # plan_linear_fp8_gemv (one scale per row): each split count's balanced slice of 256..kMaxSlice
    # inputs, the fewest rounds of kSlots CTAs x (kFixedChunks + the slice's chunks)
    chunks, row_blocks = math.ceil(k / c["kChunk"]), math.ceil(n / c["kRowsPerBlock"])
    longest = min(c["kMaxSlice"] // c["kChunk"], chunks)
    shortest = min(c["kStep"] // c["kChunk"], longest)
    costs = [(math.ceil(row_blocks * math.ceil(chunks / p) / c["kSlots"]) * (c["kFixedChunks"] + p), s, p)
             for s in range(math.ceil(chunks / longest), math.ceil(chunks / shortest) + 1)
             for p in [max(math.ceil(chunks / s), shortest)]]
    per = min(costs)[2]
    splits = math.ceil(k / (per * c["kChunk"]))
    assert ctas_per_sm(res) == c["kCtasPerSm"], "the GEMV's occupancy is not the plan's"
    length = k / splits
    steps, warps = math.ceil(length / c["kStep"]), res["threads"] // 32
    hot = next(h for h in sass.loops if sass.count(sass.loops[h]["body"], "HMMA"))
    exits = exit_blocks(sass)
    # x staged 8 elements a lane at a time (16-byte aligned rows, as a model's activations are): the
    # walk shuns the 2-byte loads of the element-wise staging
    shun = {blk for blk in sass.reachable
            if any(op.startswith("LDG") and ".U16" in op for op in sass.ops([blk]))}
    rules = [("x rows", ["LDG", "SHFL"], [], lambda ops: tiles, True),  # nvcc may unroll its 1-2 rows
             ("last CTA: rows", ["LDG"], ["STS", "HMMA"],
              lambda ops: math.ceil(tokens * c["kRowsPerBlock"] / res["threads"]), True),
             ("last CTA: splits x16", ["LDG"], [], lambda ops: splits // n_ops(ops, "LDG"), True),
             ("last CTA: splits x4", ["LDG"], [], lambda ops: splits % 16 // n_ops(ops, "LDG"), True)]
    ph, paths = {}, {}
    for end in (exits[0], exits[-1]):  # a CTA that is not its row block's last; the last one
        paths[end] = sass.walk(0, {end}, sass.reachable, None, set(), (set(), shun))
        ph[end] = phases_of(sass, paths[end], rules, hot)
    common = ph[exits[0]]
    # The first step's W loads are issued before x is staged: the phases up to the stream overlap
    # their DRAM round trip.
    at = [i for i, item in enumerate(paths[exits[0]]) if item[0] != "b" and item[1] == hot]
    head = at[0] if at else len(common)
    body, per_iteration = loop_walk(sass, hot)
    unit = per_iteration / 2  # an iteration holds two k steps (the register double buffer)
    chain = hmma_chain(sass, body) / 2
    item = (stream_time(m, steps, unit, chain, warps, 1, phases_time(m, common[:head], warps))
            + phases_time(m, common[head:], warps))
    total = sum_phases(common)
    w_bytes, io = c["kRowsPerBlock"] * length, tokens * (k + n) * 2 + n * 4
    t = kernel_time(m, {"items": row_blocks * splits, "ctas": ctas_per_sm(res), "warps": warps, "item": item,
                        "instr": total["instr"] + steps * unit, "fp64": 0, "wavefronts": 0,
                        "sm_bytes": w_bytes + warps * total["bytes"], "hbm_bytes": n * k + io,
                        "in_flight": res["threads"] * 2 * c["kChunksPerStep"] * 16,
                        "epilogue": phases_time(m, ph[exits[-1]], warps) - phases_time(m, common, warps)})
    t.update(kernel="FP8 GEMV", shape=f"{n}x{k}", batch=tokens, grid=row_blocks * splits, ctas=ctas_per_sm(res),
             regs=res["registers"], items_cta=1, rt=f"{total['rt']} L2 + 1 DRAM",
             instr=f"{total['instr']} + {steps} x {unit:.0f}", wavefronts="-", useful=n * k + io,
             note=f"{splits} splits of {length:.0f} inputs, {steps} k step(s) per CTA")
    return t


def decode_sass(b, kv):
    """The tensor-core decode at <128, 8> (GQA 4-8), its item loop and the hot loop of `kv`'s segment."""
    sass = b.sass("paged_attention_decode.cu.o", r"paged_decode_mma_kernel<128, 8>")
    streams = {h: x["body"] for h, x in sass.loops.items()
               if sass.count(x["body"], "HMMA") and sass.count(x["body"], "LDGSTS")}
    inner = sorted(h for h, b in streams.items() if not any(o != h and ob < b for o, ob in streams.items()))
    # FP8 K and V: the most E4M3 conversions; bf16 (the pool's or the window's): the fewest
    hot = (max if kv == "fp8" else min)(inner, key=lambda h: sass.count(sass.loops[h]["body"], "F2FP"))
    item = min((h for h, x in sass.loops.items() if hot in x["body"] and h != hot),
               key=lambda h: len(sass.loops[h]["body"]))
    forbidden = set().union(*(sass.loops[h]["body"] for h in inner if h != hot))
    return sass, hot, item, forbidden


def q_wavefronts(kf16):
    """The Q fragment's LDS.64 (decode_mma.cuh, q_fragment): lane (g, t) reads q_s[q_index(g, d)], d =
    16j + 4t + 2h (f16 Q, FP8 K) or 16j + 2t + 8h (bf16); q_index puts rows HEAD_DIM + 32 floats
    apart, row g's start moved by 2 (g odd) and 16 (g & 2) floats. The worst k-step j and half h."""
    def q_index(row, d):
        return row * (HEAD_DIM + 32) + (2 if row & 1 else 0) + (16 if row & 2 else 0) + d
    return max(shared_wavefronts([4 * q_index(g, 16 * j + (4 * t + 2 * h if kf16 else 2 * t + 8 * h))
                                  for g in range(8) for t in range(4)], 8)
               for j in range(HEAD_DIM // 16) for h in range(2))


def kv_wavefronts():
    """FP8 at head_dim 128, 16-token chunks: the K word loads (k_off), the V word loads (v_off) and the
    cp.async stores of both (ChunkCopy), with decode_mma.cuh's swizzles."""
    lanes = [(lane // 4, lane % 4) for lane in range(32)]
    k = [4 * (16 * t + 4 * ((g >> 2) ^ (t & 2)) + (g & 3)) for g, t in lanes]  # n-tile 0, k-step 0
    v = [2048 + 2 * t * 128 + 4 * g + 32 * t for g, t in lanes]  # m-tile pair 0, token row 2t
    copy_k = [16 * ((v_ >> 2) * 4 + ((v_ & 3) ^ ((v_ >> 2) & 2))) for v_ in range(32)]
    copy_v = [2048 + 16 * ((v_ // 8) * 8 + ((v_ % 8) ^ (2 * ((v_ // 8 >> 1) & 3) & 7))) for v_ in range(32)]
    return (max(shared_wavefronts(k, 4), shared_wavefronts(v, 4)),
            max(shared_wavefronts(copy_k, 16), shared_wavefronts(copy_v, 16)))


def bf16_loaded(ops):
    """bf16 elements a trip of a loop with these opcodes loads from global memory."""
    width = {".U16": 2, ".S16": 2, ".64": 8, ".128": 16}
    return max(1, sum(next((w for s, w in width.items() if o.endswith(s)), 4) // 2
                      for o in ops if o.startswith("LDG")))


def decode(b, m, batch, context, kv="fp8"):
    c = source_constants("kernels/cuda/decode_stage.cuh", "kernels/cuda/paged_attention_kernels.hpp")
    pattern = r"paged_decode_mma_kernel<128, 8>"
    res = b.resources(pattern)
    sass, hot, item_loop, forbidden = decode_sass(b, kv)
    rows, real_rows, warps = 8, GROUP, c["kWarps"]
    elem = 1 if kv == "fp8" else 2
    q_base = warps * c["kStages"] * c["kStageBytes"]  # decode_smem: the stages, then q_s
    dynamic = q_base + rows * HEAD_DIM * 4 + warps * 4 + (batch + 1) * 4
    ctas = ctas_per_sm(res, dynamic)
    # decode_partition: >= kDecodeMinPartition tokens, <= kDecodeMaxParts partitions, whole blocks
    partition = math.ceil(max(math.ceil(context / c["kDecodeMaxParts"]), c["kDecodeMinPartition"]) / BLOCK) * BLOCK
    parts = math.ceil(context / partition)
    items = batch * parts * KV_HEADS
    chunk_tokens = min(BLOCK, c["kChunkBytes"] // (HEAD_DIM * elem))
    chunks = math.ceil(context / parts / chunk_tokens)
    per_warp = math.ceil(chunks / warps)
    body = sass.loops[item_loop]["body"]
    # The paths the shape takes, wherever nvcc laid them out: q 4 elements a load (aligned rows),
    # and the warps' merge ending in the partials (several partitions) or the bf16 output (one).
    def holding(op):
        return {x for x in body if any(sass.flat[i][0] == op for i in range(sass.blocks[x][0], sass.blocks[x][1] + 1))}
    bf16_out, partials = holding("STG.E.U16"), holding("STG.E")
    out_want, out_shun = (partials, bf16_out) if parts > 1 else (bf16_out, partials)
    q_fours = holding("LDG.E.64")
    toward = (q_fours | out_want, (holding("LDG.E.U16") if q_fours else set()) | out_shun)
    pre = sass.walk(item_loop, {hot}, body, item_loop, forbidden, toward)[:-1]
    latches = sass.loops[item_loop]["latches"]
    out = next(v for x in sorted(sass.loops[hot]["body"]) for v in sass.succ(x)
               if v not in sass.loops[hot]["body"] and v in body and sass.reaches(v, body, latches))
    path = pre + sass.walk(out, latches, body, item_loop, forbidden, toward)
    rules = [("find_owner", ["LDS"], ["LDG", "MUFU"], lambda ops: math.ceil(math.log2(batch)), False),
             ("q to shared", ["LDG", "STS"], ["LDGSTS"],
              lambda ops: rows * HEAD_DIM / (warps * 32) / bf16_loaded(ops), False),
             ("q amax", ["LDS", "FMNMX"], [], lambda ops: rows * HEAD_DIM / 32 / n_ops(ops, "LDS"), True),
             ("first copies", ["LDGSTS"], ["HMMA"], lambda ops: c["kStages"] - 1, True),
             ("warp merge", ["LDS", "MUFU"], [],  # a trip's outputs: 4 where it reads 16 bytes a warp
              lambda ops: real_rows * HEAD_DIM / (warps * 32) / (4 if "LDS.128" in ops else 1), False)]
    phases = phases_of(sass, path, rules)
    start = sass.walk(0, {item_loop}, sass.reachable, None, set())[:-1]  # the plan, once per CTA
    prologue = phases_time(m, Tally(sass, lambda h: 1).phases(start), warps)
    body_path, hot_n = loop_walk(sass, hot)
    q_wf, (kv_wf, copy_wf) = q_wavefronts(kv == "fp8"), kv_wavefronts()
    per_chunk = 0  # Q: an LDS at q_s (offset >= q_base); K, V: the swizzled stages (conflict-free)
    for op, text in (sass.flat[i] for _, blk in walk_blocks(body_path)
                     for i in range(sass.blocks[blk][0], sass.blocks[blk][1] + 1)):
        if text.startswith("@!PT") or not op.startswith(("LDS", "LDGSTS")):
            continue
        offset = int((re.search(r"\+(0x[0-9a-f]+)\]", text) or [0, "0"])[1], 16)
        wide = 2 if ".64" in op else 4 if ".128" in op else 1
        per_chunk += copy_wf if op.startswith("LDGSTS") else q_wf if offset >= q_base else max(kv_wf, wide)
    chain = hmma_chain(sass, body_path)
    item = phases_time(m, phases, warps) + stream_time(m, per_warp, hot_n, chain, warps, c["kStages"] - 1)
    total = sum_phases(phases)
    kv_bytes = batch * context * KV_HEADS * HEAD_DIM * 2 * elem
    io = 2 * batch * KV_HEADS * GROUP * HEAD_DIM * 2  # q in, out (bf16)
    slots = items * real_rows * (HEAD_DIM + 2) * 4 if parts > 1 else 0  # partials written for the merge
    t = kernel_time(m, {"items": items, "ctas": ctas, "warps": warps, "item": item,
                        "instr": total["instr"] + per_warp * hot_n, "fp64": 0, "wavefronts": chunks * per_chunk,
                        "sm_bytes": kv_bytes / items + warps * total["bytes"], "hbm_bytes": kv_bytes + io + slots,
                        "in_flight": warps * (c["kStages"] - 1) * c["kStageBytes"], "prologue": prologue})
    alone, merge = t["time"], None
    if context > c["kDecodeMinPartition"]:  # the host launches the merge when a context may split
        merge = merge_time(b, m, batch, parts)
        t["time"] += merge["time"]
        if merge["time"] > alone:
            t["binds"] = "merge: " + merge["binds"]
    t.update(kernel="decode attention" + (" (bf16 KV)" if kv != "fp8" else ""), shape=f"{context // 1024}k",
             batch=batch, grid=ctas * m["sms"], ctas=ctas, regs=res["registers"], items_cta=items / (ctas * m["sms"]),
             rt=f"{total['rt']} L2 + 1 DRAM", instr=f"{total['instr']} + {per_warp} x {hot_n}",
             wavefronts=f"{per_chunk} ({q_wf} per Q LDS.64)", useful=kv_bytes + io,
             note=f"{items} items, {parts} partition(s) of {chunks} chunks ({per_warp} per warp); decode kernel "
                  f"{us(alone)} us = {100 * (kv_bytes + io) / alone / m['hbm']:.0f}% of HBM"
                  + (f", merge {us(merge['time'])} us ({merge['binds']}, {merge['rt']} L2 round trips)"
                     if merge else ""))
    return t


def merge_time(b, m, batch, parts):
    pattern = r"paged_merge_kernel"
    res, sass = b.resources(pattern), b.sass("paged_attention_decode.cu.o", pattern)
    path = sass.walk(0, {exit_blocks(sass)[-1]}, sass.reachable, None, set())
    c = source_constants("kernels/cuda/paged_attention_decode.cu")
    # a thread kMergeDims outputs: an item's GROUP x HEAD_DIM outputs over `slices` CTAs (blockIdx.z);
    # a trip of the loop loads kMergePrefetch partitions, then combines them
    slices = math.ceil(GROUP * HEAD_DIM / (res["threads"] * c["kMergeDims"]))
    rules = [("partitions", ["LDG", "MUFU"], [], lambda ops: math.ceil(parts / c["kMergePrefetch"]), False)]
    phases = phases_of(sass, path, rules)
    warps, total = res["threads"] // 32, sum_phases(phases)
    # the partials were just written: L2 hits, no HBM bound
    t = kernel_time(m, {"items": KV_HEADS * batch * slices, "ctas": ctas_per_sm(res), "warps": warps,
                        "item": phases_time(m, phases, warps), "instr": total["instr"], "fp64": 0, "wavefronts": 0,
                        "sm_bytes": warps * total["bytes"], "hbm_bytes": 0, "in_flight": 0})
    t["rt"] = total["rt"]
    return t


def sampling_launches(kind, per, slices, bins, passes):
    """Each launch of a sampling kind (kernels/cuda/sampling.cu), in order: (kernel, CTAs a row,
    rules of the loops on the path). per: the ids a thread takes in its slice (for_each_logit,
    for_each_group: 4 loads a trip, no remainder loop); passes: the radix select's digits (the
    first histogram built in the best keys' launch, the second in the sums'); bins: the
    histogram bins a thread sums over the slices (select_digit: nvcc unrolls that loop by 4
    slices, with a one-slice remainder loop beside; zeroing and copying the bins is straight
    code)."""
    def elements(name, need, avoid=()):
        return [(name, need, list(avoid), lambda ops: per / n_ops(ops, "LDG"), False)]
    def unrolled(op, count, each=1):  # `count` things, `each` of `op` a thing
        def trips(ops):
            n = n_ops(ops, op) // each
            return count // n if n > 1 else count % 4
        return trips
    select = [("a bin's slices", ["LDG"], ["STS", "ATOMS", "VOTE"], unrolled("LDG", slices, bins), False),
              ("a bin's slices", ["LDG"], ["STS", "ATOMS", "VOTE"], unrolled("LDG", slices, bins), True),
              # the warps before's sums: at most 15 = 3 x 4 + 2 + 1; the average warp's 7.5 as once through each loop
              *[("warps before", ["LDS"], ["LDG", "STS"], lambda ops: 1, True)] * 3]
    best = ("sample_best_kernel", slices, elements("best key", ["LDG"], ["LDS", "ATOMS", "VOTE"]))
    if kind == "greedy":
        return [best, ("sample_greedy_sums_kernel", slices, elements("exp sum", ["LDG", "LDS"])),
                ("sample_greedy_rows_kernel", 1, [])]
    return [("sample_first_pass_kernel", slices, elements("best key, first digit", ["LDG", "ATOMS"])),
            ("sample_candidate_sums_kernel", slices,
             [*select, *elements("exp sums, second digit", ["LDG", "LDS", "ATOMS"])]),
            *[("sample_radix_kernel", slices, [*select, *elements("a digit", ["LDG", "ATOMS"])])] * (passes - 2),
            ("sample_count_kernel", slices, [*select, *elements("counts", ["LDG", "VOTE"], ["STG"])]),
            ("sample_write_kernel", slices, elements("writes", ["LDG", "VOTE"]))]


def sampling(b, m, rows, kind, context, raw=True):
    """The launches of one sampling step over `rows` rows, each cut into slices as sampling_slices()
    cuts them; the logits are in L2 (the LM head just wrote them). raw: the rows want their raw
    sums (logprobs asked for, at 1/T != 1: two exps an id in the candidates' sums), else one."""
    c = source_constants("kernels/cuda/sampling.cu", "kernels/cuda/device_util.cuh")
    slices = max(1, min(c["kTargetCtas"] // rows, math.ceil(VOCAB / c["kMinSlice"]), c["kMaxSlices"]))
    slices = math.ceil(VOCAB / math.ceil(VOCAB / slices))  # sampling_slices(): none empty
    per = math.ceil(VOCAB / slices) / c["kThreads"]
    total, launches, instr, fp64, rt, worst = 0.0, [], 0, 0, 0, None
    for name, per_row, rules in sampling_launches(kind, per, slices, c["kBinsPerThread"], c["kRadixPasses"]):
        res, sass = b.resources(name), b.sass("sampling.cu.o", name)
        # warp 0's path, into the loops that load (a branch may skip one for threads past the bins or
        # for no slices); past the candidates' stores (K of the row's ids: most groups hold none)
        loads = {h for h, l in sass.loops.items() if any(o.startswith("LDG") for o in sass.ops(l["body"]))}
        stores = {x for h in loads for x in sass.loops[h]["body"]
                  if any(sass.flat[i][0].startswith("STG") for i in range(sass.blocks[x][0], sass.blocks[x][1] + 1))}
        # the candidates' sums: the loop with two exps an id, or the one with one (the smaller)
        exps = sorted((len(sass.ops(sass.loops[h]["body"])), h) for h in loads
                      if {"LDS", "ATOMS"} <= {o.split(".")[0] for o in sass.ops(sass.loops[h]["body"])})
        other = set(sass.loops[exps[0 if raw else -1][1]]["body"]) if len(exps) == 2 else set()
        path = sass.walk(0, {exit_blocks(sass)[-1]}, sass.reachable, None, set(), (loads, stores | other))
        phases = phases_of(sass, path, rules)
        tot = sum_phases(phases)
        warps = res["threads"] // 32
        t = kernel_time(m, {"items": rows * per_row, "ctas": ctas_per_sm(res), "warps": warps,
                            "item": phases_time(m, phases, warps), "instr": tot["instr"], "fp64": tot["fp64"],
                            "wavefronts": 0, "sm_bytes": warps * tot["bytes"], "hbm_bytes": 0, "in_flight": 0})
        total += t["time"]
        instr, fp64, rt = instr + tot["instr"] * warps * per_row, fp64 + tot["fp64"] * warps * per_row, rt + tot["rt"]
        launches.append(f"{name.replace('sample_', '').replace('_kernel', '')} {us(t['time'])} ({t['binds']})")
        worst = t if worst is None or t["time"] > worst["time"] else worst
    step = (WEIGHT_BYTES + 64 * context * LAYERS * KV_HEADS * HEAD_DIM * 2) / m["hbm"]
    r = dict(worst)
    r.update(time=total, kernel=f"sample_{kind}" + ("" if raw or kind == "greedy" else " (no logprobs)"),
             shape=f"vocab {VOCAB}, {len(launches)} launches", batch=rows,
             grid=f"{rows} x {slices}", ctas="-", regs="-", items_cta=1, rt=f"{rt} L2", wavefronts="-", useful=0,
             instr=f"{instr / (VOCAB / 32):.0f} per 32 ids (all launches)",
             step=step, note=f"{slices} slices a row; " + ", ".join(launches) + f" us; {fp64 / (VOCAB / 32):.0f} "
             f"FP64 a 32 ids; a batch-64 step at {context // 1024}k context: {step * 1e3:.2f} ms")
    return r


# ---- the table -----------------------------------------------------------------------------------

CONTEXT = 1024  # sampling is set against a batch-64 decode step at this context
TILEOPS = "TileOPs FP8 decode, batch 1, {}: {}% (the same bytes)"
ROWS = [  # (model, machine, arguments, the issue's hand estimate, a published figure at comparable bytes)
    *[(gemv, H200, (n, k, 1), est, "") for n, k, est in [(4096, 4096, "~40%"), (14336, 4096, "~55%"),
                                                          (4096, 14336, "~65%"), (28672, 4096, "~70%"),
                                                          (VOCAB, 4096, "80-87%")]],
    *[(gemv, H200, (n, k, 16), "", "") for n, k in [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 4096),
                                                     (VOCAB, 4096)]],
    (gemv, H100, (4096, 14336, 1), "", "vLLM FP8 GEMM, M = 1: ~77%"),
    (gemv, H100, (VOCAB, 4096, 1), "", "vLLM FP8 GEMM, M = 1: ~77%"),
    (decode, H200, (1, 1024), "~6%", ""),
    (decode, H200, (1, 8192), "30-45%", TILEOPS.format("16k", 21)),
    (decode, H200, (1, 32768), "60-70%", TILEOPS.format("64k", 38)),
    (decode, H200, (64, 1024), "55-70%", ""),
    (decode, H200, (64, 8192), "55-70%", ""),
    (decode, H200, (16, 8192, "bf16"), "", "FA3 bf16 decode, batch 16: ~55%"),
    (sampling, H200, (1, "candidates", CONTEXT), "150-250 us a step", ""),
    (sampling, H200, (64, "candidates", CONTEXT), "150-250 us a step", ""),
    (sampling, H200, (64, "candidates", CONTEXT, False), "", ""),
    (sampling, H200, (64, "greedy", CONTEXT), "~46 us a row (its sums)", ""),
]


def us(seconds):
    return f"{seconds * 1e6:.1f}"


def evaluate(b):
    out = []
    for model, machine, args, issue, published in ROWS:
        runs = [model(b, dict(machine, dram=lat), *args) for lat in (DRAM_RANGE[0], DRAM_LATENCY, DRAM_RANGE[1])]
        r = runs[1]
        if r["useful"]:
            pct = [100 * x["useful"] / x["time"] / machine["hbm"] for x in runs]
            r["estimate"] = f"{pct[1]:.0f}% ({pct[0]:.0f}-{pct[2]:.0f})"
        else:
            r["estimate"] = f"{100 * r['time'] / r['step']:.1f}% of a step"
        r.update(gpu=machine["name"], issue=issue or "-", published=published or "-")
        out.append(r)
    return out


def markdown(rows):
    lines = [f"Constants: DRAM round trip {DRAM_LATENCY * 1e6:.1f} us ({DRAM_RANGE[0] * 1e6:.1f}-"
             f"{DRAM_RANGE[1] * 1e6:.1f} in brackets), L2 {L2_LATENCY * 1e6:.1f} us, L1 {L1_LATENCY * 1e9:.0f} ns; "
             f"issue "
             f"{ISSUE_PER_CLOCK} x {ISSUE_EFFICIENCY} per clock per SM, {WARP_IPC} per clock for a lone warp; HMMA "
             f"chain {HMMA_LATENCY} clocks; HBM {HBM_EFFICIENCY:.0%} of peak at most, {SM_BYTES_PER_CLOCK} B per clock "
             f"per SM; {us(KERNEL_FIXED)} us a launch. Little's law: "
             f"{H200['hbm'] * DRAM_LATENCY / H200['sms'] / 1024:.0f} KiB in flight per SM.", "",
             "| kernel | shape | batch | GPU | CTAs | waves (slots busy) | binds | est. time (us) | "
             "est. % of HBM (sampling: of a step) | issue's estimate | published |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['batch']} | {r['gpu']} | {r['grid']} | {r['waves']:.3g} "
                     f"({100 * r['tail']:.0f}%) | {r['binds']} | {us(r['time'])} | {r['estimate']} | {r['issue']} | "
                     f"{r['published']} |")
    lines += ["", "| kernel | shape | batch | registers: CTAs/SM | items per CTA | round trips per item | "
              "SASS per item per warp (path + stream) | shared wavefronts per chunk | in flight per SM (KiB) | "
              "serial / issue / FP64 / shared / SM / HBM (us) | notes |", "|---" * 11 + "|"]
    for r in rows:
        bounds = " / ".join(us(r["bounds"][k]) for k in ("serial chain", "issue", "FP64", "shared memory",
                                                           "SM bandwidth", "HBM"))
        lines.append(f"| {r['kernel']} ({r['gpu']}) | {r['shape']} | {r['batch']} | {r['regs']}: {r['ctas']} | "
                     f"{r['items_cta']:.2f} | {r['rt']} | {r['instr']} | {r['wavefronts']} | "
                     f"{r['in_flight_sm'] / 1024:.0f} | {bounds} | {r['note']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", default=OBJECTS, help="the nvcc build's object folder (fp8serve_cuda.dir)")
    ap.add_argument("--table", action="store_true", help="print the Markdown tables (the default)")
    ap.add_argument("--check-docs", metavar="DOC", help="exit 1 when DOC's copy between the markers differs")
    ap.add_argument("--update-docs", metavar="DOC", help="rewrite DOC's copy between the markers")
    a = ap.parse_args()
    missing = [n for n in ("linear_fp8_gemv.cu.o", "paged_attention_decode.cu.o", "sampling.cu.o",
                           "linear_fp8_gemv.cu.o.ptxas") if not os.path.exists(os.path.join(a.objects, n))]
    if missing:
        print(f"kernel_model: no nvcc build in {a.objects} (no {', '.join(missing)}): skipped")
        return 77  # CTest: skipped (SKIP_RETURN_CODE)
    sass_count.tool("cuobjdump"), sass_count.tool("nvdisasm")  # they exit 77 when missing
    table = markdown(evaluate(Build(a.objects)))
    print(table, end="")
    doc = a.check_docs or a.update_docs
    if doc:
        text = open(doc).read()
        if BEGIN not in text or END not in text:
            print(f"kernel_model: {doc} lacks the {BEGIN} / {END} markers")
            return 1
        head, rest = text.split(BEGIN, 1)
        fresh = head + BEGIN + "\n" + table + END + rest.split(END, 1)[1]
        if a.update_docs:
            open(doc, "w").write(fresh)
        elif fresh != text:
            print(f"kernel_model: FAIL: {doc}'s table differs from this build's: run "
                  f"tests/scripts/kernel_model.py --update-docs {doc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
