#!/usr/bin/env python3
"""KV-cache quantization study for issue 4: which FP8 scale scheme keeps SmolLM2-135M's greedy
output equal to the bf16-KV run? A torch simulation, not the engine: fp32 math on the GGUF's
weights (Q4_1 dequantized by transformers, then rounded to bf16 as the engine does), with every
K/V written to the cache (after RoPE, the prefill's too) passed through a quantize-dequantize of
the scheme under test. Frozen scales are calibrated on the prompt's tokens only.

    /work/refvenv/venv/bin/python tests/scripts/kv_scale_study.py [--workload short|long|both]
        [--schemes bf16,fp8-tensor-m2,...] [--quick] [--text FILE ...]

Tested with torch 2.15, transformers 5.24 (the reference venv); one torch thread.

Workloads, as tests/bench/bench_kv_quality.cpp builds them: the text is README.md, docs/*.md
(by name) and tests/fixtures/README.md, each + "\\n", tokenized without special tokens; short = 50 windows of
20 + (i * 37 % 81) tokens starting at i * ((n - 100) // 50), + 128 greedy tokens each;
long = the first 1000 tokens + 256 greedy tokens.

Per scheme, against the bf16-KV run (the reference, "bf16"):
  free run        greedy decoding; sequences whose 128 tokens all equal the reference's, and the
                  sum over sequences of the matching prefix length (a sequence leaves the batch
                  at its first difference).
  teacher-forced  one causal forward over prompt + the reference's tokens (the same as decoding
                  them one by one: every K/V is quantized on write with the frozen state);
                  KL(p_bf16 || p_scheme) of each of the 128 next-token distributions, mean, max.
  saturated       fraction of K/V elements with |x / scale| > 464 (448 + half an ulp: those that
                  clip; the engine's kv_write counts the same), over the teacher-forced writes
                  (prompt + the reference's tokens: the same tokens for every scheme).

The bf16 recent window (issue 17, --kv-bf16-window): a scheme name ending in +w<N> keeps each
sequence's newest N tokens (whole blocks of 16 leave: the engine's rule, KvWindow::fp8_len)
exact in bf16 and reads the older ones as the FP8 scheme quantized them, from the bf16 value;
+w<N>k keeps K alone (V always FP8). Which positions are FP8 depends on the step that computes a
query - the prompt's length for the prefill, t + 1 for the decode step of position t - so the
teacher-forced forward selects FP8 or bf16 per (query, key) pair. Saturation is counted over
every written element, those still in the window at the end too.
"""

import argparse
import math
import pathlib
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# README.md, docs/*.md by name, tests/fixtures/README.md (tests/bench/bench_inputs.hpp).
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "fixtures" / "README.md"]
BLOCK = 16  # the engine's default block size: whole blocks leave the window

# format: (torch dtype, largest finite value, threshold beyond which a value clips)
FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0, 464.0), "e5m2": (torch.float8_e5m2, 57344.0, 61440.0),
           "int8": (torch.int8, 127.0, 127.5)}


# --- KV schemes -------------------------------------------------------------------------------

class KvScheme:
    """Quantize-dequantize of one layer's K or V, [B, H, T, d]. `calib` [B, T] marks the prompt
    tokens that calibrate the frozen state (None after the prefill); `valid` [B, T] the tokens
    that are not padding (None: all), which alone count in the saturation figures."""

    def __init__(self, fmt="e4m3", granularity="tensor", margin=2.0, smooth=False):
        self.fmt, self.granularity, self.margin, self.smooth = fmt, granularity, margin, smooth
        self.scale = self.mean = None
        self.num_elements = self.num_saturated = 0

    def select(self, rows):
        """Keeps the state of the sequences `rows` (the free run drops diverged ones)."""
        self.scale = None if self.scale is None else self.scale[rows]
        self.mean = None if self.mean is None else self.mean[rows]

    def __call__(self, x, calib, valid):
        dtype, fmax, clip = FORMATS[self.fmt]
        if calib is not None and self.granularity != "token":
            m = calib[:, None, :, None].to(x.dtype)  # [B, 1, T, 1]
            if self.smooth:  # per-channel mean of the prompt's values, per kv head
                self.mean = (x * m).sum(2, keepdim=True) / m.sum(2, keepdim=True)  # [B, H, 1, d]
            r = (x - self.mean if self.smooth else x).abs() * m
            dims = {"tensor": (1, 2, 3), "head": (2, 3), "channel": (2,)}[self.granularity]
            amax = r.amax(dim=dims, keepdim=True)
            self.scale = torch.clamp(amax * self.margin / fmax, min=torch.finfo(torch.float32).tiny)
        r = x - self.mean if self.smooth else x
        if self.granularity == "token":  # per token per head, computed at write time
            scale = torch.clamp(r.abs().amax(3, keepdim=True) * self.margin / fmax,
                                min=torch.finfo(torch.float32).tiny)
        else:
            scale = self.scale
        y = r / scale
        sat = y.abs() > clip
        if valid is None:
            self.num_elements += y.numel()
            self.num_saturated += int(sat.sum())
        else:
            self.num_elements += int(valid.sum()) * y.shape[1] * y.shape[3]
            self.num_saturated += int((sat & valid[:, None, :, None]).sum())
        y = y.clamp(-fmax, fmax)
        q = (torch.round(y) if self.fmt == "int8" else y.to(dtype).float()) * scale  # both nearest-even
        return q + self.mean if self.smooth else q


class Plain:
    """fp32 (no rounding) or bf16 (round to nearest even) storage."""

    def __init__(self, bf16):
        self.bf16 = bf16
        self.num_elements = self.num_saturated = 0

    def select(self, rows):
        pass

    def __call__(self, x, calib, valid):
        return x.to(torch.bfloat16).float() if self.bf16 else x


def split_window(name):
    """'<scheme>+w<N>[k]' -> (scheme, N, values); no suffix -> (name, 0, True)."""
    if "+w" not in name:
        return name, 0, True
    base, w = name.split("+w")
    return base, int(w.rstrip("k")), not w.endswith("k")


def make_scheme(name):
    """'bf16', 'fp32', or '{fp8|int8}-<granularity>[-smooth][-e5m2]-m<margin>' for K and V, with
    'K:<scheme>/V:<scheme>' to give them different ones. Granularity: tensor (layer), head (layer,
    kv head), channel (layer, kv head, channel), all frozen on the prompt; token (per token per
    kv head, at write time). fp8 is E4M3FN unless -e5m2; int8 is symmetric, scale amax / 127.
    A '+w<N>[k]' suffix (the bf16 window) is the Runner's business: see split_window."""
    name = split_window(name)[0]
    if name.startswith("K:"):
        k, v = name[2:].split("/V:")
        return lambda: (make_scheme(k)()[0], make_scheme(v)()[1])
    if name in ("bf16", "fp32"):
        return lambda: (Plain(name == "bf16"), Plain(name == "bf16"))
    parts = name.split("-")
    assert parts[0] in ("fp8", "int8"), name
    kw = dict(granularity=parts[1], margin=float(parts[-1][1:]), smooth="smooth" in parts,
              fmt="int8" if parts[0] == "int8" else "e5m2" if "e5m2" in parts else "e4m3")
    return lambda: (KvScheme(**kw), KvScheme(**kw))


# In the order they run (most decisive first, so a cut-short run still answers the question).
SCHEMES = [
    ("fp32", "fp32 KV (noise floor: how far bf16 itself is)"),
    ("fp8-tensor-m2", "per-tensor, margin 2 (contract default)"),
    ("fp8-tensor-m1", "per-tensor, margin 1 (seed)"),
    ("fp8-tensor-m4", "per-tensor, margin 4"),
    ("fp8-head-m2", "per-head (layer, kv head), margin 2"),
    ("K:fp8-tensor-smooth-m2/V:fp8-tensor-m2", "per-tensor, K smoothed (prompt channel mean), m 2"),
    ("fp8-token-m1", "per-token per-head scales (nothing frozen), m 1"),
    ("K:fp8-tensor-m2/V:bf16", "diagnostic: only K in FP8 (per-tensor m 2)"),
    ("K:bf16/V:fp8-tensor-m2", "diagnostic: only V in FP8 (per-tensor m 2)"),
    ("int8-token-m1", "INT8 per-token per-head (nothing frozen)"),
    ("int8-head-m1.25", "INT8 per-head, frozen, margin 1.25"),
    ("K:int8-token-m1/V:fp8-tensor-m2", "K INT8 per-token, V FP8 per-tensor m 2"),
    ("fp8-head-smooth-m2", "per-head, K and V smoothed, m 2"),
    ("K:fp8-channel-m2/V:fp8-head-m2", "K per-channel (frozen) m 2, V per-head m 2"),
    ("fp8-tensor-e5m2-m1", "E5M2 per-tensor, margin 1"),
    ("fp8-tensor-m2+w16", "bf16 window 16 (K and V), per-tensor m 2"),
    ("fp8-tensor-m2+w32", "bf16 window 32 (K and V), per-tensor m 2"),
    ("fp8-tensor-m2+w64", "bf16 window 64 (K and V), per-tensor m 2"),
    ("fp8-tensor-m2+w128", "bf16 window 128 (K and V), per-tensor m 2"),
    ("fp8-tensor-m2+w32k", "bf16 window 32 (K only), per-tensor m 2"),
    ("fp8-tensor-m2+w64k", "bf16 window 64 (K only), per-tensor m 2"),
]


# --- the model --------------------------------------------------------------------------------

def load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(MODEL.parent), gguf_file=MODEL.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL.parent), gguf_file=MODEL.name)
    return model, tokenizer


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Runner:
    """The Llama forward pass over a right-padded batch with a per-layer K/V cache that holds the
    dequantized values, [B, kv_heads, max_len, head_dim]."""

    def __init__(self, model, scheme_name, batch, max_len):
        self.m = model.model
        scheme_factory = make_scheme(scheme_name)
        _, self.window, self.window_values = split_window(scheme_name)
        self.head = model.lm_head
        c = model.config
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.schemes = [scheme_factory() for _ in range(c.num_hidden_layers)]  # (K, V) per layer
        shape = (batch, self.nkv, max_len, self.d)
        self.k = [torch.zeros(shape) for _ in self.schemes]
        self.v = [torch.zeros(shape) for _ in self.schemes]
        if self.window:  # the tail: what the window holds exact (bf16)
            self.kx = [torch.zeros(shape) for _ in self.schemes]
            self.vx = [torch.zeros(shape) for _ in self.schemes]

    def fp8_len(self, ctx):
        """KvWindow::fp8_len: positions out of the window for a context of ctx tokens."""
        return torch.where(ctx > self.window, (ctx - self.window) // BLOCK * BLOCK, torch.zeros_like(ctx))

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def select(self, rows):
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]
        if self.window:
            self.kx = [k[rows] for k in self.kx]
            self.vx = [v[rows] for v in self.vx]
        for pair in self.schemes:
            for s in pair:
                s.select(rows)

    def hidden(self, ids, pos, calib, valid=None, ctx=None):
        """ids, pos: [B, T] (pos = cache slot), calib, valid: [B, T] bool or None (see KvScheme);
        ctx: [B, T] context length of the step that computes each query (the window's reference;
        needed with a window). Writes K/V at pos, attends to slots <= pos. Returns the
        final-normed hidden states."""
        B, T = ids.shape
        x = self.m.embed_tokens(ids)
        cos, sin = self.m.rotary_emb(x, pos)  # [B, T, d]
        cos, sin = cos[:, None], sin[:, None]
        kmax = int(pos.max()) + 1
        mask = torch.arange(kmax)[None, None, :] > pos[:, :, None]  # [B, T, kmax]
        if self.window:  # [B, 1, T, kmax]: keys the query reads from FP8 (the rest: bf16)
            from_fp8 = (torch.arange(kmax)[None, None, :] < self.fp8_len(ctx)[:, :, None])[:, None]
        rows = torch.arange(B)[:, None].expand(B, T)
        group = self.nh // self.nkv
        for i, layer in enumerate(self.m.layers):
            a = layer.self_attn
            h = self.norm(x, layer.input_layernorm.weight)
            q = a.q_proj(h).view(B, T, self.nh, self.d).transpose(1, 2)  # [B, nh, T, d]
            k = a.k_proj(h).view(B, T, self.nkv, self.d).transpose(1, 2)  # [B, nkv, T, d]
            v = a.v_proj(h).view(B, T, self.nkv, self.d).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            ks, vs = self.schemes[i]
            if self.window:  # FP8 of the bf16 value, as kv_spill and kv_write store it
                k, v = k.to(torch.bfloat16).float(), v.to(torch.bfloat16).float()
                self.kx[i][rows, :, pos] = k.transpose(1, 2)
                self.vx[i][rows, :, pos] = v.transpose(1, 2)
            self.k[i][rows, :, pos] = ks(k, calib, valid).transpose(1, 2)
            self.v[i][rows, :, pos] = vs(v, calib, valid).transpose(1, 2)
            kc = self.k[i][:, :, :kmax].repeat_interleave(group, dim=1)  # [B, nh, kmax, d]
            vc = self.v[i][:, :, :kmax].repeat_interleave(group, dim=1)
            s = (q @ kc.transpose(2, 3)) / math.sqrt(self.d)  # [B, nh, T, kmax]
            if self.window:
                kxc = self.kx[i][:, :, :kmax].repeat_interleave(group, dim=1)
                s = torch.where(from_fp8, s, (q @ kxc.transpose(2, 3)) / math.sqrt(self.d))
            s = s.masked_fill(mask[:, None], float("-inf"))
            p = torch.softmax(s, dim=-1)
            if self.window and self.window_values:
                vxc = self.vx[i][:, :, :kmax].repeat_interleave(group, dim=1)
                o = (p * from_fp8) @ vc + (p * ~from_fp8) @ vxc
            else:
                o = p @ vc
            o = o.transpose(1, 2).reshape(B, T, -1)
            x = x + a.o_proj(o)
            h = self.norm(x, layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            x = x + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        return self.norm(x, self.m.norm.weight)

    def saturation(self):
        n = sum(s.num_elements for pair in self.schemes for s in pair)
        sat = sum(s.num_saturated for pair in self.schemes for s in pair)
        return sat / n if n else 0.0


def pad(seqs):
    lens = torch.tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    pos = torch.arange(ids.shape[1])[None].expand_as(ids).contiguous()
    return ids, pos, lens


def free_run(model, scheme, prompts, num_generate, ref_tokens=None):
    """Greedy decoding of all prompts in one batch. Without ref_tokens, returns the tokens
    [B, num_generate]; with them, the length of each sequence's prefix equal to ref_tokens (a
    sequence leaves the batch at its first difference: what follows cannot change that)."""
    ids, pos, lens = pad(prompts)
    runner = Runner(model, scheme, len(prompts), int(lens.max()) + num_generate)
    h = runner.hidden(ids, pos, pos < lens[:, None], ctx=lens[:, None].expand_as(pos))
    last = h[torch.arange(len(prompts)), lens - 1]  # [B, D]
    out, active = [], torch.arange(len(prompts))
    same = torch.full((len(prompts),), num_generate)
    for step in range(num_generate):
        nxt = runner.head(last).argmax(-1)  # [active]
        out.append(nxt)
        if ref_tokens is not None:
            keep = nxt == ref_tokens[active, step]
            same[active[~keep]] = step
            if not keep.all():
                active, nxt, last = active[keep], nxt[keep], last[keep]
                runner.select(keep.nonzero()[:, 0])
            if len(active) == 0:
                break
        if step + 1 < num_generate:
            at = (lens[active] + step)[:, None]
            last = runner.hidden(nxt[:, None], at, None, ctx=at + 1)[:, 0]
    return same if ref_tokens is not None else torch.stack(out, 1)


def forced_hidden(model, scheme, prompts, ref_tokens):
    """Final hidden states [B, G, D] before each of the G next tokens, fed prompt + ref_tokens,
    and the saturated fraction of the K/V written for them."""
    G = ref_tokens.shape[1]
    seqs = [list(p) + ref_tokens[i, :G - 1].tolist() for i, p in enumerate(prompts)]
    ids, pos, total = pad(seqs)
    lens = torch.tensor([len(p) for p in prompts])
    runner = Runner(model, scheme, len(prompts), ids.shape[1])
    # The step computing query t: the prefill (the prompt's length) or t's own decode step.
    ctx = torch.maximum(pos + 1, lens[:, None])
    h = runner.hidden(ids, pos, pos < lens[:, None], pos < total[:, None], ctx)
    at = lens[:, None] - 1 + torch.arange(G)[None]  # [B, G]
    return h[torch.arange(len(prompts))[:, None], at], runner.saturation()


def kl_stats(model, h_ref, h):
    """Mean and max KL(p_ref || p) over all rows of [B, G, D] hidden states."""
    total, worst, n = 0.0, 0.0, 0
    a, b = h_ref.reshape(-1, h_ref.shape[-1]), h.reshape(-1, h.shape[-1])
    for i in range(0, a.shape[0], 256):
        lp = torch.log_softmax(model.lm_head(a[i:i + 256]).double(), -1)
        lq = torch.log_softmax(model.lm_head(b[i:i + 256]).double(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)
        total, worst, n = total + float(kl.sum()), max(worst, float(kl.max())), n + kl.numel()
    return total / n, worst


def min_top2_gaps(model, h):
    """[B]: each sequence's smallest top-1 minus top-2 logit over its steps (how close greedy
    decoding comes to a tie: a KV error that moves logits by more than this can flip a token)."""
    gaps = torch.stack([model.lm_head(h[:, g]).topk(2, -1).values.diff(dim=-1)[:, 0].neg()
                        for g in range(h.shape[1])], 1)
    return gaps.min(1).values


def check_fp8_casts():
    """torch's casts round to nearest even (the clamp before them gives satfinite)."""
    x = torch.tensor([17.0, 19.0, 0.5 + 1 / 32, 448.0, 2.0**-10, 1.5 * 2.0**-10])  # ties, max, subnormal ties
    assert x.to(torch.float8_e4m3fn).float().tolist() == [16.0, 20.0, 0.5, 448.0, 0.0, 2.0**-9]
    y = torch.tensor([2.25, 2.75, 0.875, 57344.0])
    assert y.to(torch.float8_e5m2).float().tolist() == [2.0, 3.0, 0.875, 57344.0]


def check_against_transformers(model, ids):
    """Our forward with fp32 KV must equal transformers' eager forward (same weights)."""
    runner = Runner(model, "fp32", 1, len(ids))
    t = torch.tensor([ids])
    ours = runner.head(runner.hidden(t, torch.arange(len(ids))[None], t >= 0))
    theirs = model(t).logits
    err = float((ours - theirs).abs().max())
    assert err < 1e-3, f"forward differs from transformers by {err}"
    return err


# --- the study --------------------------------------------------------------------------------

def workloads(tokenizer, which, quick, texts):
    text = "".join(pathlib.Path(p).read_text() + "\n" for p in texts)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = []
    if which in ("long", "both"):
        n, g = (300, 64) if quick else (1000, 256)
        out.append(("long prompt", [ids[:n]], g))
    if which in ("short", "both"):
        num, g = (12, 32) if quick else (50, 128)
        stride = (len(ids) - 100) // num
        out.append(("short prompts", [ids[i * stride:i * stride + 20 + i * 37 % 81] for i in range(num)], g))
    return len(ids), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="short", choices=["short", "long", "both"])
    ap.add_argument("--schemes", default=",".join(s for s, _ in SCHEMES))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--text", action="append", help="text files, in order (default: the README, docs/*.md, the fixtures' README)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import transformers

    print(f"# kv_scale_study: torch {torch.__version__}, transformers {transformers.__version__}, 1 thread")
    model, tokenizer = load()
    num_text, loads = workloads(tokenizer, args.workload, args.quick, args.text or TEXTS)
    descr = dict(SCHEMES)
    check_fp8_casts()
    with torch.no_grad():
        err = check_against_transformers(model, loads[0][1][0][:40])
        print(f"{num_text} text tokens; our forward vs transformers, fp32 KV: max |dlogit| {err:.1e}")
        for title, prompts, gen in loads:
            lens = [len(p) for p in prompts]
            print(f"\n## {title}: {len(prompts)} prompt(s) of {min(lens)}-{max(lens)} tokens, {gen} generated each, "
                  f"reference = bf16 KV\n")
            t0 = time.time()
            ref_tokens = free_run(model, "bf16", prompts, gen)
            h_ref, _ = forced_hidden(model, "bf16", prompts, ref_tokens)
            gaps = min_top2_gaps(model, h_ref)
            print(f"(reference: {time.time() - t0:.0f} s) Smallest top-1/top-2 logit gap of each bf16 sequence over its "
                  f"{gen} steps: " + ", ".join(f"{int((gaps < g).sum())} below {g}" for g in (0.01, 0.03, 0.1, 0.3)) +
                  f" (of {len(prompts)}); median {float(gaps.median()):.3f}\n")
            print("| KV scheme | what | sequences all = bf16 | greedy tokens = bf16 | mean KL | max KL | saturated | s |")
            print("|---|---|---|---|---|---|---|---|")
            for name in args.schemes.split(","):
                t0 = time.time()
                same = free_run(model, name, prompts, gen, ref_tokens)  # matching prefix per sequence
                h, sat = forced_hidden(model, name, prompts, ref_tokens)
                mean_kl, max_kl = kl_stats(model, h_ref, h)
                print(f"| {name} | {descr.get(name, '')} | {int((same == gen).sum())}/{len(prompts)} | "
                      f"{int(same.sum())}/{gen * len(prompts)} | {mean_kl:.2e} | {max_kl:.2e} | {sat:.2e} | "
                      f"{time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
