"""lm-evaluation-harness (PyPI lm-eval, pinned in tests/requirements.txt) against the real
server: its `local-completions` model on our own two-task suite (tests/integration/lm_eval_task:
a multiple-choice task scored by loglikelihood - echo with logprobs and max_tokens 1 - and a
generate_until task), tokenized by transformers' tokenizer of the tiny fixture. The results must
equal the same tasks scored with transformers on that fixture (tests/fixtures/reference/
prompt_logprobs.json): the same accuracy and exact-match, and every per-choice loglikelihood
within the FP8 tolerance of test_prompt_logprobs.py. Offline: the documents are local JSON, the
tokenizer a local folder, the hub is never asked."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, TINY_LLAMA, Server
from test_prompt_logprobs import REFERENCE_CACHE, TOL, reference_key

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_task"
EXPECTED = json.loads((FIXTURES / "reference" / "prompt_logprobs.json").read_text())["lm_eval"]


def test_lm_eval_loglikelihood_and_generate_until_equal_transformers(tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is installed by .ci/install (tests/requirements.txt)")
    s = Server(TINY_LLAMA, "--served-model-name", "tiny", "--kv-cache-memory", 16_000_000, *REFERENCE_CACHE,
               tmp_path=tmp_path)
    try:
        out = tmp_path / "lm_eval_out"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HOME": str(tmp_path / "hf_home"), "TOKENIZERS_PARALLELISM": "false"}
        model_args = ",".join([f"model=tiny", f"base_url={s.base}/v1/completions", "tokenizer_backend=huggingface",
                               f"tokenizer={TINY_LLAMA}", "tokenized_requests=True", "num_concurrent=1",
                               "max_retries=1"])
        run = subprocess.run([sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
                              "--model_args", model_args, "--tasks", "fp8serve_tiny_mc,fp8serve_tiny_gen",
                              "--include_path", str(TASK_DIR), "--output_path", str(out), "--log_samples",
                              "--batch_size", "4"],
                             cwd=TASK_DIR, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
        results_file = next(out.rglob("results_*.json"))
        results = json.loads(results_file.read_text())["results"]
        assert results["fp8serve_tiny_mc"]["acc,none"] == pytest.approx(EXPECTED["tiny_mc"]["acc"])
        assert results["fp8serve_tiny_gen"]["exact_match,none"] == pytest.approx(EXPECTED["tiny_gen"]["exact_match"])

        # Every choice's loglikelihood, as lm-eval logged it, against transformers'.
        # (The server runs FP8 KV: the reference is transformers through the same FP8 cache.)
        key = "loglikelihood" + reference_key(s, "_kv_fp8")
        samples = [json.loads(line) for line in next(out.rglob("samples_fp8serve_tiny_mc_*.jsonl")).open()]
        assert len(samples) == len(EXPECTED["tiny_mc"]["docs"])
        worst = 0.0
        for sample in samples:
            want = EXPECTED["tiny_mc"]["docs"][sample["doc_id"]]
            got = [r[0][0] if isinstance(r[0], list) else r[0] for r in sample["resps"]]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                worst = max(worst, abs(float(g) - w[key]))
                assert abs(float(g) - w[key]) <= TOL * len(w["continuation_ids"]), (sample["doc_id"], g, w)
        print(f"lm-eval: max |loglikelihood - transformers| = {worst:.4f}")
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()
