"""The bf16 recent window on the real server: it starts with the tail pool reported, serves a
streaming request while /metrics shows the tail in use, gives every ring back afterwards, and
n > 1 choices (forked rings) equal the single greedy output."""
import openai

from conftest import TINY_QWEN3, Server


def test_window_tail_in_use_while_streaming_and_released_after(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 8_000_000, "--served-model-name", "tiny", "--kv-bf16-window", 32,
               "--kv-bf16-window-tensors", "k", "--max-num-seqs", 8, tmp_path=tmp_path)
    try:
        log = s.log_text()
        assert "bf16 window 32 tokens (K only): 8 rings x 3 blocks" in log, log
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.completions.create(model="tiny", prompt="count the colours of the rainbow " * 6,
                                           max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True})
        seen = None
        for chunk in stream:
            if seen is None:
                m = s.metrics()
                seen = (m["fp8serve:kv_bf16_tail_usage_perc"], m["fp8serve:kv_bf16_tail_tokens"])
        assert seen[0] == 1 / 8 and 32 <= seen[1] < 48, seen  # one ring of 8; 32-47 tokens in it
        s.wait_kv_idle()
        m = s.metrics()
        assert m["fp8serve:kv_bf16_tail_usage_perc"] == 0 and m["fp8serve:kv_bf16_tail_tokens"] == 0

        single = client.completions.create(model="tiny", prompt="the weather today", max_tokens=60, temperature=0,
                                           extra_body={"ignore_eos": True})
        many = client.completions.create(model="tiny", prompt="the weather today", max_tokens=60, temperature=0, n=3,
                                         extra_body={"ignore_eos": True})
        assert [c.text for c in many.choices] == [single.choices[0].text] * 3
        s.wait_kv_idle()
        assert s.metrics()["fp8serve:kv_bf16_tail_usage_perc"] == 0
    finally:
        assert s.stop() == 0, s.log_text()
