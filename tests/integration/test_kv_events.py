"""KV-cache events (--kv-events-config) read as routers read them.

- Our own subscriber: a ZMQ SUB socket and msgpack (pyzmq, msgpack: nothing of our encoder), a
  router's index built from the events' token ids alone, compared after every change with what
  the replica really maps (`usage.prompt_tokens_details.cached_tokens` of a request that can use
  every cached block): after prefill, decoding, a partial hit, eviction and a reset; the replay
  socket gives the same batches again; a late subscriber sees what follows.
- Dynamo's standalone KV indexer (ai-dynamo-runtime, in .venv-routers: python -m dynamo.indexer)
  subscribed to three replicas: its per-replica scores equal each replica's own cached prefix,
  fall after eviction and a reset, and a replica it registers late is caught up by replay.
"""
import json
import random
import subprocess
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq

from conftest import ROOT, TINY_QWEN3, Server, binary, free_port

BS = 16      # --block-size (default)
# --kv-bf16-window, pinned (the block counts below are worked out for it): a sequence's newest
# WINDOW tokens are never in a cached block.
WINDOW = 64
ROUTERS_PYTHON = ROOT / ".venv-routers" / "bin" / "python"


def events_config(port, replay_port=None, topic="kv@tiny"):
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}", "topic": topic}
    if replay_port:
        config["replay_endpoint"] = f"tcp://127.0.0.1:{replay_port}"
    return json.dumps(config)


def start_replica(tmp_path, port, replay_port, *flags):
    return Server(TINY_QWEN3, "--served-model-name", "tiny", "--kv-cache-memory", "700KB", "--max-model-len", 1024,
                  "--kv-bf16-window", WINDOW,
                  "--kv-events-config", events_config(port, replay_port), *flags, tmp_path=tmp_path)


def complete(server, ids, max_tokens=1):
    status, _, body = server.post("/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": max_tokens,
                                                      "temperature": 0})
    assert status == 200, body
    usage = json.loads(body)["usage"]
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def pool_tokens(server):
    """The KV pool's size in tokens, from fp8serve:cache_config_info."""
    info = next(k for k in server.metrics() if k.startswith("fp8serve:cache_config_info"))
    return int(info.split('num_gpu_blocks="')[1].split('"')[0]) * BS


def hit_cap(n):
    """The most a prompt of n tokens may map: never the block of its last token, never its own
    bf16 window (docs/routing.md)."""
    return max(0, min((n - 1) // BS, (n - WINDOW) // BS)) * BS


def probe_cached(server, prefix, rng):
    """Tokens of `prefix` the replica maps now: a request of prefix + 100 new tokens, whose caps
    lie past every full block of the prefix."""
    return complete(server, prefix + [rng.randrange(500) for _ in range(100)])


class RouterIndex:
    """What a router keeps from the events: each announced block as the whole token prefix it
    ends (its own hash of the tokens), found by the engine's opaque id for parents and removals.
    A block whose parent it does not know is an error here (a router would drop it)."""

    def __init__(self):
        self.blocks = {}  # id -> token prefix (tuple)

    def apply(self, events):
        for event in events:
            kind = event[0]
            if kind == "BlockStored":
                hashes, parent, tokens, block_size, lora_id, medium = event[1:7]
                assert (block_size, lora_id, medium) == (BS, None, "GPU")
                assert len(tokens) == len(hashes) * BS
                prefix = () if parent is None else self.blocks[parent]
                for i, h in enumerate(hashes):
                    assert 0 <= h < 2**64 and h not in self.blocks
                    prefix = prefix + tuple(tokens[i * BS:(i + 1) * BS])
                    self.blocks[h] = prefix
            elif kind == "BlockRemoved":
                assert event[2] == "GPU"
                for h in event[1]:
                    del self.blocks[h]  # only blocks it was told about are removed
            else:
                assert event == ["AllBlocksCleared"]
                self.blocks.clear()

    def match(self, ids):
        prefixes = set(self.blocks.values())
        n = 0
        while (n + 1) * BS <= len(ids) and tuple(ids[:(n + 1) * BS]) in prefixes:
            n += 1
        return n * BS


class Subscriber:
    def __init__(self, port, topic=b"kv@tiny"):
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.topic = topic
        self.batches = []  # (seq, payload)
        time.sleep(0.5)  # ZMQ's slow joiner: subscribed before the first event

    def receive(self, server, timeout=10):
        """Everything the server has published, as (seq, [events]) batches received now."""
        new = []
        deadline = time.time() + timeout
        while True:
            while self.socket.poll(50):
                topic, seq, payload = self.socket.recv_multipart()
                assert topic == self.topic and len(seq) == 8
                new.append((int.from_bytes(seq, "big"), payload))
            self.batches += new
            published = server.metrics()["fp8serve:kv_events_published_total"]
            if sum(len(decode(p)[1]) for _, p in self.batches) >= published or time.time() > deadline:
                return [(seq, decode(p)[1]) for seq, p in new]
            time.sleep(0.05)

    def close(self):
        self.socket.close(linger=0)


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float) and batch[2] == 0
    return batch


def replay(port, start):
    """The batches from `start` on, as vLLM's replay protocol gives them to a DEALER (what
    Dynamo's indexer uses): [b"", start] asked, [b"", seq, payload] each, [b"", -1, b""] last."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        assert dealer.poll(5000), "no replay answer"
        frames = dealer.recv_multipart()
        assert frames[0] == b"" and len(frames) == 3
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq == -1:
            assert frames[2] == b""
            dealer.close(linger=0)
            return out
        out.append((seq, frames[2]))


def test_events_follow_the_prefix_cache(tmp_path):
    port, replay_port = free_port(), free_port()
    server = start_replica(tmp_path, port, replay_port)
    rng = random.Random(7)
    sub = Subscriber(port)
    index = RouterIndex()
    try:
        assert f"KV-cache events: published on tcp://127.0.0.1:{port}" in server.startup_log()
        assert server.metrics()["fp8serve:kv_events_published_total"] == 0

        # Prefill and decode: 150 prompt tokens, 8 generated (7 of them computed into the KV).
        p1 = [rng.randrange(500) for _ in range(150)]
        assert complete(server, p1, max_tokens=8) == 0
        index.apply(e for _, events in sub.receive(server) for e in events)
        # Final in FP8 and cached: (157 - 64) // 16 = 5 blocks; the rest is in the window.
        assert index.match(p1) == 80
        assert probe_cached(server, p1, rng) == 80

        # A prompt sharing 100 tokens: 6 full blocks in common, its own caps allow 7.
        index.apply(e for _, events in sub.receive(server) for e in events)
        p2 = p1[:100] + [rng.randrange(500) for _ in range(80)]
        assert index.match(p2) == 96
        assert complete(server, p2) == min(index.match(p2), hit_cap(len(p2))) == 96

        # Eviction: distinct prompts until twice the pool has passed through.
        stored = {h for h in index.blocks}
        for _ in range(2 * pool_tokens(server) // 200 + 1):
            complete(server, [rng.randrange(500) for _ in range(200)])
        batches = sub.receive(server)
        removed = {h for _, events in batches for e in events if e[0] == "BlockRemoved" for h in e[1]}
        assert removed & stored, "no announced block was evicted"
        index.apply(e for _, events in batches for e in events)
        assert index.match(p1) < 80
        assert probe_cached(server, p1, rng) == index.match(p1)

        # A reset: one AllBlocksCleared, nothing cached, nothing indexed.
        index.apply(e for _, events in sub.receive(server) for e in events)
        assert index.blocks
        assert server.post("/reset_prefix_cache", b"")[0] == 200
        batches = sub.receive(server)
        assert batches[-1][1][-1] == ["AllBlocksCleared"]
        index.apply(e for _, events in batches for e in events)
        assert not index.blocks
        last = [rng.randrange(500) for _ in range(200)]
        assert complete(server, last) == 0
        index.apply(e for _, events in sub.receive(server) for e in events)
        assert probe_cached(server, last, rng) == index.match(last) > 0

        # The live stream had every batch, numbered 0, 1, 2, ...; the replay gives the same bytes.
        sub.receive(server)
        seqs = [seq for seq, _ in sub.batches]
        assert seqs == list(range(len(seqs)))
        assert replay(replay_port, 0) == sub.batches
        assert replay(replay_port, seqs[-3]) == sub.batches[-3:]

        # A subscriber that joins late sees what follows, numbered on.
        late = Subscriber(port)
        complete(server, [rng.randrange(500) for _ in range(120)])
        later = late.receive(server)
        assert later and later[0][0] == seqs[-1] + 1
        late.close()

        metrics = server.metrics()
        assert metrics["fp8serve:kv_events_dropped_total"] == 0
        assert server.wait_kv_idle() == 0, "KV blocks leaked"
    finally:
        sub.close()
        assert server.stop() == 0, server.log_text()


def run_bad(*flags):
    return subprocess.run([str(binary()), "serve", str(TINY_QWEN3), "--port", str(free_port()), *map(str, flags)],
                          capture_output=True, text=True, timeout=60)


def test_bad_event_configs_fail_the_start_clearly():
    taken = zmq.Context.instance().socket(zmq.PUB)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        r = run_bad("--kv-events-config", events_config(port))
        assert r.returncode != 0
        assert f"cannot bind the event endpoint 'tcp://127.0.0.1:{port}'" in r.stderr + r.stdout
    finally:
        taken.close(linger=0)
    r = run_bad("--kv-events-config", '{"enable_kv_cache_events": true, "endpont": "tcp://*:5557"}')
    assert r.returncode != 0 and "--kv-events-config: unknown key 'endpont'" in r.stderr
    r = run_bad("--kv-events-config", "yes")
    assert r.returncode != 0 and "--kv-events-config: expected a JSON object" in r.stderr
    r = run_bad("--kv-events-config", events_config(free_port()), "--no-enable-prefix-caching")
    assert r.returncode != 0 and "need --enable-prefix-caching" in r.stderr


class Indexer:
    """Dynamo's standalone KV indexer (python -m dynamo.indexer) on loopback."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "indexer.log", "w")
        self.proc = subprocess.Popen([str(ROUTERS_PYTHON), "-m", "dynamo.indexer", "--port", str(self.port),
                                      "--threads", "1"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2):
                    return
            except OSError:
                assert self.proc.poll() is None, (tmp_path / "indexer.log").read_text()
                time.sleep(0.1)
        raise RuntimeError("the indexer did not start")

    def call(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
            return json.loads(text) if text else None

    def register(self, worker, port, replay_port):
        self.call("/register", {"instance_id": worker, "endpoint": f"tcp://127.0.0.1:{port}",
                                "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "model_name": "tiny",
                                "block_size": BS})

    def scores(self, ids):
        """Matched tokens per worker id (0 when it matches nothing)."""
        try:
            answer = self.call("/query", {"token_ids": ids, "model_name": "tiny"})
        except urllib.error.HTTPError as e:
            assert e.code == 404  # no worker registered yet
            return {}
        return {int(w): ranks.get("0", 0) for w, ranks in answer["scores"].items()}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def settle(replicas):
    """Until every replica's published count holds still, then a moment for the indexer."""
    counts = None
    while True:
        now = [r.metrics()["fp8serve:kv_events_published_total"] for r in replicas]
        if now == counts:
            break
        counts = now
        time.sleep(0.2)
    time.sleep(0.5)


@pytest.mark.skipif(not ROUTERS_PYTHON.exists(), reason=".venv-routers absent: run .ci/install test")
def test_dynamo_indexer_scores_equal_each_replicas_cache(tmp_path):
    ports = [(free_port(), free_port()) for _ in range(3)]
    replicas = [start_replica(tmp_path, p, rp) for p, rp in ports]
    indexer = Indexer(tmp_path)
    rng = random.Random(11)
    try:
        indexer.register(1, *ports[0])
        indexer.register(2, *ports[1])
        time.sleep(1.0)  # the indexer's SUB sockets connect before the first event
        a, b, c = ([rng.randrange(500) for _ in range(130)] for _ in range(3))
        complete(replicas[0], a, max_tokens=4)
        complete(replicas[0], a[:100] + [7] * 40, max_tokens=4)
        complete(replicas[1], b, max_tokens=4)
        complete(replicas[2], a, max_tokens=4)  # replica 3 is not registered yet
        complete(replicas[2], c, max_tokens=4)

        def check(prompts, registered=3):
            """The indexer's score of each prompt on each registered replica equals the tokens
            the replica then maps for it."""
            settle(replicas)
            seen = 0
            for prompt in prompts:
                scores = indexer.scores(prompt)
                for worker, replica in enumerate(replicas[:registered], start=1):
                    cached = probe_cached(replica, prompt, rng)
                    assert scores.get(worker, 0) == cached, (worker, scores, cached)
                    seen += cached
                settle(replicas)
            assert seen > 0

        check([a, b], registered=2)
        # Replica 3 registered late: its next event shows the gap, the replay fills it.
        indexer.register(3, *ports[2])
        time.sleep(1.0)
        complete(replicas[2], [rng.randrange(500) for _ in range(100)])
        check([a, b, c])

        # Eviction on replica 1 (distinct prompts through twice its pool), a reset of replica 2.
        before_a, before_b = indexer.scores(a), indexer.scores(b)
        assert before_a.get(1, 0) > 0 and before_b.get(2, 0) > 0
        for _ in range(2 * pool_tokens(replicas[0]) // 200 + 1):
            complete(replicas[0], [rng.randrange(500) for _ in range(200)])
        assert replicas[1].post("/reset_prefix_cache", b"")[0] == 200
        settle(replicas)
        assert indexer.scores(a).get(1, 0) < before_a[1]
        assert indexer.scores(b).get(2, 0) == 0
        check([a, b, c])
        for replica in replicas:
            assert replica.metrics()["fp8serve:kv_events_dropped_total"] == 0
    finally:
        indexer.stop()
        for replica in replicas:
            assert replica.stop() == 0, replica.log_text()
