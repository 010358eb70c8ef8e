#!/usr/bin/env python3
"""Speculative decoding, fp8serve against llama.cpp's server (issue 23), on the same GGUF and the
very same prompt text: bench_speculative's workloads (`bench_speculative --dump-prompts`), sent
as chat messages through each server's /v1/chat/completions (each applies the GGUF's chat
template), greedy (temperature 0), the same max_tokens, one request at a time, streamed.

    compare_llama_spec.py --llama-server PATH [--fp8serve build/server/fp8serve]
        [--bench build/tests/bench/bench_speculative] [--model .models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--threads 2] [--k 6] [--ngram-n 3] [--reps 2] [--quick] [--only SERVER] [--json FILE]
        [--fp8serve-flags "..."] [--llama-flags "..."]

Each server runs, in turn, as a real process on loopback with every method:
  plain     no speculation;
  ngram     fp8serve: prompt lookup (`--speculative-method ngram`, K proposals), once with its
            default lookup lengths (2-4: the longest of the last 4, 3, 2 tokens that occurred
            before) and once with both set to N (`--ngram-n`); llama.cpp: `--spec-type
            ngram-simple` with `--spec-ngram-simple-size-n N --spec-ngram-simple-size-m K`, its
            type closest to prompt lookup (docs/speculative-decoding.md says how they differ);
  draft     the model drafting for itself, K tokens a step: fp8serve `--speculative-method draft
            --speculative-model MODEL`; llama.cpp `--spec-type draft-simple --model-draft MODEL
            --spec-draft-n-max K` (its draft takes its top candidate; --spec-draft-p-min is 0 by
            default, so it never stops a draft early).
Both servers get `threads` CPU threads (llama.cpp: -t, -tb and -td) and a 4,096-token context;
neither reuses cached prefixes across requests (fp8serve --no-enable-prefix-caching, llama.cpp
"cache_prompt": false), so every request starts from an empty cache. KV caches are each
server's default: fp8serve FP8 (E4M3) with its bf16 K window, llama.cpp f16.

Per workload and method: completion tokens, drafted and accepted tokens (fp8serve: the deltas of
its /metrics counters around the request; llama.cpp: the response's `timings.draft_n` and
`timings.draft_n_accepted`), the acceptance rate (accepted / drafted), tokens per target forward
pass (completion tokens / (completion tokens - accepted): every pass yields one token plus its
accepted proposals, the prefill's pass the first token), the decode rate (completion tokens - 1
over the time from the first streamed token to the last, best of `reps`) and whether the text
equals the same server's plain text. Speed figures only mean something on a quiet machine:
`uptime` is recorded before and after each server run and printed with the tables.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from conftest import Server  # noqa: E402  (the integration tests' process wrapper)

DEFAULT_MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUICK_WORKLOADS = ("repeat document", "JSON from fields", "story")
CONTEXT = 4096


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def load_average(uptime_line):
    return uptime_line.rsplit("load average:", 1)[-1].strip()


def stream_chat(base, body):
    """POSTs a streamed chat completion; returns the text, the final usage and timings objects,
    and the times of the first and last chunk that carried text."""
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    text, usage, timings, first, last = "", None, None, None, None
    with urllib.request.urlopen(request, timeout=1800) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"{base}: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    text += piece
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    if usage is None:
        raise RuntimeError(f"{base}: no usage in the stream")
    return text, usage, timings, first, last


class Fp8serveCounters:
    """Drafted / accepted tokens of one request: the deltas of fp8serve's /metrics counters."""
    DRAFTED = "fp8serve:spec_decode_num_draft_tokens_total"
    ACCEPTED = "fp8serve:spec_decode_num_accepted_tokens_total"

    def __init__(self, server):
        self.server = server
        # A stream can end before the engine's step that produced its last tokens has finished
        # (and counted its draft): both readings wait until no request runs.
        server.wait_kv_idle()
        self.before = server.metrics()

    def after(self, _timings):
        self.server.wait_kv_idle()
        now = self.server.metrics()
        delta = [now.get(k, 0.0) - self.before.get(k, 0.0) for k in (self.DRAFTED, self.ACCEPTED)]
        return int(delta[0]), int(delta[1])


class LlamaCounters:
    """llama.cpp's per-request figures: `timings.draft_n` and `timings.draft_n_accepted` (present
    only when something was drafted). Its /metrics counters are flushed when a slot is reset, at
    the next request, so they cannot be read per request."""

    def __init__(self, _server):
        pass

    def after(self, timings):
        timings = timings or {}
        return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def configurations(args):
    """Every run: server, method, settings, the server's argv, how its drafts are counted and the
    request fields it needs."""
    model = str(args.model)
    t = str(args.threads)
    ours = [str(args.fp8serve), "serve", model, "--threads", t, "--max-model-len", str(CONTEXT),
            "--served-model-name", "m", "--no-enable-prefix-caching", *args.fp8serve_flags.split()]
    llama = [str(args.llama_server), "-m", model, "--host", "127.0.0.1", "-t", t, "-tb", t, "-c", str(CONTEXT),
             "-np", "1", "--jinja", "--no-webui", "--no-warmup", "-a", "m", *args.llama_flags.split()]
    k, n = str(args.k), str(args.ngram_n)
    configs = [
        ("fp8serve", "plain", "", ours, []),
        ("fp8serve", "ngram", f"K={k}, lookup 2-4", ours, ["--speculative-method", "ngram", "--num-speculative-tokens", k]),
        ("fp8serve", "ngram", f"K={k}, lookup {n}-{n}", ours,
         ["--speculative-method", "ngram", "--num-speculative-tokens", k, "--prompt-lookup-min", n, "--prompt-lookup-max", n]),
        ("fp8serve", "draft", f"K={k}, self-draft", ours,
         ["--speculative-method", "draft", "--speculative-model", model, "--num-speculative-tokens", k]),
        ("llama.cpp", "plain", "", llama, []),
        ("llama.cpp", "ngram", f"ngram-simple N={n} M={k}", llama,
         ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", n, "--spec-ngram-simple-size-m", k]),
        ("llama.cpp", "draft", f"draft-simple n-max={k}, self-draft", llama,
         ["--spec-type", "draft-simple", "--model-draft", model, "--spec-draft-n-max", k, "-td", t, "-tbd", t]),
    ]
    out = []
    for server, method, settings, base, extra in configs:
        if server == "fp8serve":
            counters, body_extra = Fp8serveCounters, {}
        else:
            counters, body_extra = LlamaCounters, {"cache_prompt": False}
        out.append({"server": server, "method": method, "settings": settings, "argv": base + extra,
                    "counters": counters, "body_extra": body_extra})
    return out


def run_config(config, workloads, reps, log_dir):
    argv = config["argv"]
    name = f"{config['server']} {config['method']} {config['settings']}".strip()
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    load_before = uptime()
    server = Server(None, command=argv, tmp_path=log_dir, timeout=300)
    results = []
    try:
        # A warm-up request, not measured (first-touch page faults, thread pools).
        stream_chat(server.base, {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                  "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                                  **config["body_extra"]})
        for w in workloads:
            body = {"model": "m", "messages": w["messages"], "max_tokens": w["max_tokens"], "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}, **config["body_extra"]}
            runs = []
            for _ in range(reps):
                counters = config["counters"](server)
                text, usage, timings, first, last = stream_chat(server.base, body)
                drafted, accepted = counters.after(timings)
                tokens = usage["completion_tokens"]
                decode_s = (last - first) if first is not None and last is not None else 0.0
                runs.append({"text": text, "prompt_tokens": usage["prompt_tokens"], "completion_tokens": tokens,
                             "drafted": drafted, "accepted": accepted, "decode_s": decode_s})
            best = min(runs, key=lambda r: r["decode_s"])
            first_run = runs[0]
            results.append({
                "workload": w["name"], "grounded": w["grounded"], "text": first_run["text"],
                "prompt_tokens": first_run["prompt_tokens"], "completion_tokens": first_run["completion_tokens"],
                "drafted": first_run["drafted"], "accepted": first_run["accepted"],
                "repeatable": all(r["text"] == first_run["text"] and r["accepted"] == first_run["accepted"] for r in runs),
                "decode_tok_s": (best["completion_tokens"] - 1) / best["decode_s"] if best["decode_s"] > 0 else 0.0,
            })
            print(f"  {w['name']}: {first_run['completion_tokens']} tokens, accepted {first_run['accepted']} of "
                  f"{first_run['drafted']}, {results[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return {"server": config["server"], "method": config["method"], "settings": config["settings"],
            "argv": argv, "load_before": load_before, "load_after": uptime(), "workloads": results}


def tokens_per_pass(r):
    return r["completion_tokens"] / (r["completion_tokens"] - r["accepted"]) if r["completion_tokens"] > r["accepted"] else 0.0


def acceptance(r):
    return f"{100 * r['accepted'] / r['drafted']:.0f}% ({r['accepted']}/{r['drafted']})" if r["drafted"] else "- (0/0)"


def label(run):
    return f"{run['server']} {run['method']}" + (f" ({run['settings']})" if run["settings"] else "")


def detail_table(runs):
    plain = {run["server"]: {r["workload"]: r for r in run["workloads"]} for run in runs if run["method"] == "plain"}
    lines = ["| server, method | workload | prompt | tokens | accepted / drafted | tokens / pass | decode tok/s | "
             "x plain | = plain text |", "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for r in run["workloads"]:
            base = plain.get(run["server"], {}).get(r["workload"])
            same = "-" if run["method"] == "plain" or base is None else ("yes" if r["text"] == base["text"] else "**no**")
            ratio = f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base and base["decode_tok_s"] else "-"
            lines.append(f"| {label(run)} | {r['workload']} | {r['prompt_tokens']} | {r['completion_tokens']} | "
                         f"{acceptance(r)} | {tokens_per_pass(r):.2f} | {r['decode_tok_s']:.1f} | {ratio} | {same} |")
    return "\n".join(lines)


def acceptance_table(runs):
    """Acceptance rates side by side: one row per workload, one column per speculative run."""
    spec = [run for run in runs if run["method"] != "plain"]
    names = [r["workload"] for r in spec[0]["workloads"]] if spec else []
    lines = ["| workload | " + " | ".join(label(run) for run in spec) + " |", "|---|" + "---|" * len(spec)]
    for i, name in enumerate(names):
        cells = [f"{acceptance(run['workloads'][i])}, {tokens_per_pass(run['workloads'][i]):.2f}/pass" for run in spec]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for grounded, title in ((True, "all input-grounded"), (False, "all open-ended")):
        if not any(r["grounded"] == grounded for r in spec[0]["workloads"] if spec):
            continue
        cells = []
        for run in spec:
            rs = [r for r in run["workloads"] if r["grounded"] == grounded]
            total = {key: sum(r[key] for r in rs) for key in ("drafted", "accepted", "completion_tokens")}
            cells.append(f"{acceptance(total)}, {tokens_per_pass(total):.2f}/pass")
        lines.append(f"| **{title}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fp8serve", type=Path, default=ROOT / "build" / "server" / "fp8serve")
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--bench", type=Path, default=ROOT / "build" / "tests" / "bench" / "bench_speculative",
                        help="bench_speculative, the source of the prompts (--dump-prompts)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=6, help="proposals per step")
    parser.add_argument("--ngram-n", type=int, default=3, help="llama.cpp's ngram-simple N, and fp8serve's fixed lookup length")
    parser.add_argument("--reps", type=int, help="runs per workload; the decode rate is the best (default 2, --quick 1)")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK_WORKLOADS)} only, one run each")
    parser.add_argument("--only", choices=["fp8serve", "llama.cpp"], help="run one server's configurations only")
    parser.add_argument("--fp8serve-flags", default="", help="more flags for every fp8serve run")
    parser.add_argument("--llama-flags", default="", help="more flags for every llama-server run")
    parser.add_argument("--json", type=Path, help="also write every result (texts included) here")
    args = parser.parse_args()
    for path in (args.fp8serve, args.llama_server, args.bench, args.model):
        if not path.exists():
            parser.error(f"{path} not found")

    with tempfile.TemporaryDirectory(prefix="compare_llama_spec_") as tmp:
        prompts = Path(tmp) / "workloads.json"
        subprocess.run([str(args.bench), "--dump-prompts", str(prompts)], check=True)
        workloads = json.loads(prompts.read_text())
        reps = args.reps or (1 if args.quick else 2)
        if args.quick:
            workloads = [w for w in workloads if w["name"] in QUICK_WORKLOADS]
        log_dir = Path(tmp) / "logs"
        log_dir.mkdir()
        started = uptime()
        runs = []
        for config in configurations(args):
            if args.only and config["server"] != args.only:
                continue
            runs.append(run_config(config, workloads, reps, log_dir))

    print(f"# Speculative decoding: fp8serve vs llama.cpp's server\n")
    print(f"{args.model.name}, {args.threads} threads each, greedy, one request at a time, streamed "
          f"chat completions, best decode rate of {reps} run(s); started: {started}\n")
    print("Load (uptime) before and after each server run:\n")
    for run in runs:
        print(f"- {label(run)}: {load_average(run['load_before'])} -> {load_average(run['load_after'])}")
    print("\n## Acceptance side by side (accepted / drafted, tokens per target forward pass)\n")
    print(acceptance_table(runs))
    print("\n## Every run\n")
    print(detail_table(runs))
    prompt_mismatch = [r["workload"] for i, r in enumerate(runs[0]["workloads"])
                       if len({run["workloads"][i]["prompt_tokens"] for run in runs}) > 1] if runs else []
    unrepeatable = [f"{label(run)}: {r['workload']}" for run in runs for r in run["workloads"] if not r["repeatable"]]
    print(f"\nPrompt tokens equal on every server: {'yes' if not prompt_mismatch else 'no: ' + ', '.join(prompt_mismatch)}")
    if reps > 1:
        print(f"Every run repeated its first run's text and counters: "
              f"{'yes' if not unrepeatable else 'no: ' + '; '.join(unrepeatable)}")
    ours_differs = []
    ours_plain = next((run for run in runs if run["server"] == "fp8serve" and run["method"] == "plain"), None)
    for run in runs:
        if ours_plain is not None and run["server"] == "fp8serve" and run["method"] != "plain":
            ours_differs += [f"{label(run)}: {r['workload']}" for r, p in zip(run["workloads"], ours_plain["workloads"])
                             if r["text"] != p["text"]]
    if args.json:
        args.json.write_text(json.dumps({"started": started, "reps": reps, "runs": runs}, indent=1))
    if ours_differs:
        print(f"\nfp8serve's speculative text differs from its plain text (a bug): {'; '.join(ours_differs)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
