"""guidellm 0.8.1 against the real llama-server, then `tokenbench import` of what it wrote.

Needs guidellm installed where benchmarks/loadgen.py puts it (benchmarks/.venvs/guidellm,
`python -c "from benchmarks.loadgen import ensure_peer; ensure_peer('guidellm')"`, ~6 GB
with torch); skipped without it. tests/test_store_import.py checks a file it wrote earlier.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_servers.llama_server import LlamaServer

GUIDELLM = Path(__file__).resolve().parents[2] / "benchmarks" / ".venvs" / "guidellm" / "bin"


@pytest.mark.skipif(not (GUIDELLM / "guidellm").exists(), reason="guidellm not installed")
def test_a_guidellm_file_imports_with_the_latencies_guidellm_measured(
    llama_server: LlamaServer, tmp_path
):
    data = tmp_path / "data.jsonl"
    words = "the of and to in is it you that he was for on are with as his they be at".split()  # noqa: SIM905
    data.write_text(
        "".join(
            json.dumps({"prompt": " ".join(words[(i + k) % len(words)] for k in range(48)),
                        "output_tokens_count": 12}) + "\n"
            for i in range(16)
        )
    )  # fmt: skip
    out = tmp_path / "benchmarks.json"
    proc = subprocess.run(
        [str(GUIDELLM / "guidellm"), "run", "--backend",
         f"kind=openai_http,target={llama_server.url},request_format=/v1/completions,"
         f"model={llama_server.model_name}",
         "--profile", "kind=concurrent,streams=2", "--constraint", "kind=max_requests,count=12",
         "--data", f"kind=json_file,path={data}", "--output", f"kind=json,path={out}",
         "--disable-console-interactive"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    imported = subprocess.run(
        [sys.executable, "-m", "bench", "import", str(out), "--db", db],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    from bench.store import get_run, list_runs

    run = get_run(list_runs(db)[0].id, db)
    theirs = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    s = run.summary_json
    n = theirs["request_totals"]["successful"]
    assert s["completed"] == n > 0
    ttft = theirs["time_to_first_token_ms"]["successful"]["mean"]
    e2e = theirs["request_latency"]["successful"]["mean"] * 1000
    assert s["metrics"]["ttft_ms"]["mean"] == pytest.approx(ttft, rel=1e-6)
    assert s["metrics"]["e2el_ms"]["mean"] == pytest.approx(e2e, rel=1e-6)
    assert (run.model, run.endpoint) == (llama_server.model_name, llama_server.url)
