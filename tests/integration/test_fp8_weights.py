"""FP8 weights through the real server: an FP8 checkpoint served as published, --quantization fp8,
and the load errors a user sees for what fp8serve does not read."""
import json
import shutil
import subprocess

import openai
import pytest

from conftest import FIXTURES, Server, binary

FP8_BLOCK = FIXTURES / "models" / "tiny-qwen3-fp8-block"


def agreeing_steps(server, greedy_ids, text):
    """How many reference tokens our text reproduces (the longest decoded prefix it starts with)."""
    for k in range(len(greedy_ids), -1, -1):
        if text.startswith(json.loads(server.post("/detokenize", {"tokens": greedy_ids[:k]})[2])["prompt"]):
            return k
    return 0


def test_fp8_checkpoint_serves_the_greedy_tokens_of_its_dequantized_weights(tmp_path):
    """The block-scaled FP8 checkpoint (Qwen3-FP8's layout) through the HTTP API: the numpy
    reference's greedy tokens on its dequantized weights, or a departure at a near-tie (the
    engine test's rule, test_fp8_weights.cpp: margin below 2 x 0.05 with the bf16 dot)."""
    s = Server(FP8_BLOCK, "--kv-cache-memory", 8_000_000, "--kv-cache-dtype", "bf16", "--max-model-len", 512,
               tmp_path=tmp_path)
    try:
        log = s.log_text()
        assert "FP8 checkpoint (fp8)" in log and "FP8 projections" in log, log
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        for name in ("tiny-qwen3-fp8-block.kv-bf16.act-bf16.json", "tiny-qwen3-fp8-block.kv-bf16.json"):
            reference = json.loads((FIXTURES / "engine" / name).read_text())
            agreements = []
            for case in reference["prompts"]:
                r = client.completions.create(model=model, prompt=case["prompt_ids"], max_tokens=16, temperature=0,
                                              extra_body={"ignore_eos": True, "skip_special_tokens": False})
                agreements.append(agreeing_steps(s, case["greedy_ids"][:16], r.choices[0].text))
            print(f"[fp8 checkpoint via HTTP] {name}: {agreements} of 16 greedy tokens")
            # One of the two references is this CPU's arithmetic; the other departs at near-ties.
            ok = all(a == 16 or case["greedy_steps"][a]["margin"] < 0.1
                     for a, case in zip(agreements, reference["prompts"]))
            if ok:
                break
        assert ok, agreements
    finally:
        assert s.stop() == 0


def test_quantization_fp8_serves_and_reports_its_weights(tmp_path):
    s = Server(FIXTURES / "models" / "tiny-llama", "--quantization", "fp8", "--kv-cache-memory", 8_000_000,
               "--max-model-len", 512, tmp_path=tmp_path)
    try:
        log = s.log_text()
        assert "FP8 projections" in log and "scales" in log, log
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        full = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0,
                                         extra_body={"ignore_eos": True})
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        assert full.usage.completion_tokens == 12 and streamed == full.choices[0].text
    finally:
        assert s.stop() == 0


def test_unknown_quantization_is_a_clear_error():
    r = subprocess.run([str(binary()), "serve", str(FP8_BLOCK), "--quantization", "int4"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--quantization: must be one of none, fp8" in r.stderr, r.stderr


@pytest.mark.parametrize("patch,needle", [
    ({"quant_method": "gptq"}, "quantization_config.quant_method = \"gptq\" is not supported"),
    ({"fmt": "e5m2"}, "quantization_config.fmt"),
    ({"weight_block_size": [128, 32]}, "quantization_config.weight_block_size"),
    ({"kv_cache_quant_method": "fp8"}, "quantization_config.kv_cache_quant_method is not supported"),
])
def test_unsupported_quantization_config_stops_startup_naming_it(tmp_path, patch, needle):
    model = tmp_path / "model"
    shutil.copytree(FP8_BLOCK, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"].update(patch)
    (model / "config.json").write_text(json.dumps(config))
    r = subprocess.run([str(binary()), "serve", str(model), "--kv-cache-memory", "8000000"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
