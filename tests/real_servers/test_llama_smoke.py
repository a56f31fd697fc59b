"""The real llama-server answers tokenbench, and tokenbench's token counts are the server's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.real_servers.llama_server import LlamaServer


def test_one_request_counts_the_tokens_the_server_predicted(llama_server: LlamaServer, tmp_path):
    before = llama_server.metrics()
    out = tmp_path / "s.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--base-url", llama_server.url,
         "--model", llama_server.model_name, "--num-prompts", "1", "--request-rate", "inf",
         "--random-input-len", "32", "--random-output-len", "16",
         "--summary-json", str(out), "--db", f"sqlite:///{tmp_path / 'tb.db'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    after = llama_server.metrics()
    summary = json.loads(out.read_text())
    assert summary["completed"] == 1 and summary["failed"] == 0
    predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert predicted == 16  # ignore_eos honoured: exactly the asked-for output length
    output_tps = summary["throughput"]["output_tokens_per_s"]
    assert output_tps * summary["duration_s"] == pytest.approx(16, rel=0.01)
