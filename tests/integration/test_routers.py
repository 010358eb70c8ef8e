"""Routers from PyPI in front of three real fp8serve replicas (the default model), as operators
run them: SGLang's model gateway (`smg`) with round-robin and cache-aware routing, and
vllm-router, which adds fields of its own to every request. The routers live in .venv-routers
(tests/requirements-routers.txt, made by .ci/install test).

Four shared ~400-token prefixes, five requests each with a distinct question, interleaved and
sequential (so the replica whose request count moved is the one that served). Run with -s to see
the figures docs/routing.md quotes."""
import json
import random
import subprocess
import time
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, ROOT, Server, free_port

ROUTERS_BIN = ROOT / ".venv-routers" / "bin"
# What vllm-router 0.1.17 adds that fp8serve does not know (the others it adds are fields we
# serve, at their defaults): docs/routing.md.
VLLM_ROUTER_FIELDS = "no_stop_trim,return_hidden_states,separate_reasoning,stream_reasoning"

pytestmark = [
    pytest.mark.skipif(not (ROUTERS_BIN / "smg").exists(), reason=".venv-routers absent: run .ci/install test"),
    pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="default model absent: run .ci/fetch-model"),
]

WORDS = ("river mountain silver engine garden window pocket marble lantern harbor violin copper meadow thunder "
         "blanket canyon pepper rocket saddle feather glacier island jungle kettle ladder magnet needle orchard "
         "parrot quilt ribbon shadow tunnel umbrella valley wagon zebra anchor biscuit candle dolphin falcon").split()


def replicas(tmp_path, *flags):
    return [Server(DEFAULT_MODEL, "--threads", 1, "--kv-cache-memory", "64MiB", "--max-model-len", 2048,
                   "--served-model-name", "smol", *flags, tmp_path=tmp_path) for _ in range(3)]


class Router:
    def __init__(self, tmp_path, argv, name):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / f"{name}.log", "w")
        self.proc = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(self.port),
                                      "--prometheus-port", str(free_port())], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:  # ready: every worker registered and healthy
            assert self.proc.poll() is None, (tmp_path / f"{name}.log").read_text()
            try:
                with urllib.request.urlopen(self.base + "/readiness", timeout=2) as r:
                    if json.loads(r.read()).get("healthy_workers") == 3:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not become ready")

    def post(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def first_token_s(self, body):
        """Seconds to the first streamed chunk with text."""
        req = urllib.request.Request(self.base + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        start = time.time()
        first = None
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
            for line in r:
                if first is None and line.startswith(b"data: {"):
                    first = time.time() - start
        return first

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def smg(tmp_path, policy, servers):
    return Router(tmp_path, [ROUTERS_BIN / "smg", "launch", "--policy", policy,
                             "--worker-urls", *[s.base for s in servers]], f"smg-{policy}")


def vllm_router(tmp_path, policy, servers):
    return Router(tmp_path, [ROUTERS_BIN / "vllm-router", "--policy", policy, "--worker-startup-check-interval", "1",
                             "--worker-urls", *[s.base for s in servers]], f"vllm-router-{policy}")


def counters(server):
    m = server.metrics()
    served = sum(v for k, v in m.items() if k.startswith("fp8serve:request_success_total"))
    return served, m["fp8serve:prefix_cache_queries_total"], m["fp8serve:prefix_cache_hits_total"]


def workload(router, servers, seed, rounds=5):
    """Four prefixes x `rounds` requests; returns the hit rate over the replicas, the replicas
    each prefix landed on, and the mean time to first token."""
    rng = random.Random(seed)
    prefixes = [f"Document {seed}.{i}. " + " ".join(rng.choice(WORDS) for _ in range(330)) + "\n" for i in range(4)]
    before = [counters(s) for s in servers]
    landed = {i: set() for i in range(4)}
    ttft = []
    for r in range(rounds):
        for i, prefix in enumerate(prefixes):
            served = [counters(s)[0] for s in servers]
            ttft.append(router.first_token_s({"model": "smol", "prompt": prefix + f"Question {r}: name item {r * 7 + i}.",
                                              "max_tokens": 4, "temperature": 0}))
            # A replica counts a request once its response is out: the client may see the end first.
            deadline = time.time() + 10
            while True:
                now = [counters(s)[0] for s in servers]
                moved = [k for k in range(3) if now[k] > served[k]]
                if moved or time.time() > deadline:
                    break
                time.sleep(0.02)
            assert len(moved) == 1
            landed[i].add(moved[0])
    after = [counters(s) for s in servers]
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    hits = sum(a[2] - b[2] for a, b in zip(after, before))
    return hits / queries, [len(landed[i]) for i in range(4)], sum(ttft) / len(ttft)


def test_smg_cache_aware_pins_each_prefix_and_hits_more(tmp_path):
    servers = replicas(tmp_path)
    try:
        results = {}
        for seed, policy in enumerate(["round_robin", "cache_aware"], start=1):
            router = smg(tmp_path, policy, servers)
            try:
                results[policy] = workload(router, servers, seed)
            finally:
                router.stop()
        for policy, (hit_rate, spread, ttft) in results.items():
            print(f"smg {policy}: prefix-cache hit rate {hit_rate:.3f}, replicas per prefix {spread}, "
                  f"mean time to first token {ttft * 1000:.0f} ms")
        rr_hits, rr_spread, _ = results["round_robin"]
        ca_hits, ca_spread, _ = results["cache_aware"]
        assert ca_spread == [1, 1, 1, 1]            # each prefix pinned to one replica
        assert all(n >= 2 for n in rr_spread)       # round robin spreads them
        # Of ~400 prompt tokens a repeat maps ~336 (never the last block, never its own bf16
        # window): the cache-aware ceiling is 4/5 of that, round robin's about 2/5.
        assert ca_hits > 0.55 and rr_hits < 0.45 and ca_hits > rr_hits + 0.2
        for s in servers:
            assert s.wait_kv_idle() == 0, "KV blocks leaked"
    finally:
        for s in servers:
            assert s.stop() == 0, s.log_text()


def test_vllm_router_needs_only_the_documented_ignore_list(tmp_path):
    body = {"model": "smol", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    chat = {"model": "smol", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}
    servers = replicas(tmp_path)
    try:
        router = vllm_router(tmp_path, "round_robin", servers)
        try:
            status, answer = router.post("/v1/completions", body)
            assert status == 400 and json.loads(answer)["error"]["code"] == "unknown_parameter"
        finally:
            router.stop()
    finally:
        for s in servers:
            assert s.stop() == 0, s.log_text()
    servers = replicas(tmp_path, "--ignore-request-fields", VLLM_ROUTER_FIELDS)
    try:
        router = vllm_router(tmp_path, "cache_aware", servers)
        try:
            for _ in range(3):
                assert router.post("/v1/completions", body)[0] == 200
                assert router.post("/v1/chat/completions", chat)[0] == 200
            hit_rate, spread, _ = workload(router, servers, seed=3, rounds=2)
            assert spread == [1, 1, 1, 1]
        finally:
            router.stop()
    finally:
        for s in servers:
            assert s.stop() == 0, s.log_text()
