"""Block-exact trace replay against a real llama-server (issue 29 items 1 and 2).

The bundled agentic sample (scenarios/agentic-replay.yaml: 8 sessions of 5 turns, a shared
2-block system prompt, each turn re-sending its session's context) is replayed at its own
timestamps. The trace implies that 73% of prompt tokens could come from a cache (blocks of
64 tokens whose hash id was seen before); llama-server reports what it took from its prompt
cache per request (usage.prompt_tokens_details.cached_tokens) and in its counters. Both are
printed; the test asserts the server's reuse follows the trace's, within what llama-server's
per-slot cache can give.

Measured here (llama-server b0.3.36, 8 slots): intended 73.4% (8,192 of 11,157 tokens),
llama-server 62.2% (6,990 of 11,237: it counts a BOS and a leading-space token more per
prompt). Every request after the first was served the shared system prompt from cache
(130 tokens: 128 + those two), so equal hash ids were identical tokens for the server's
own (Llama-2) tokenizer; the shortfall is session context llama-server did not reuse when a
turn landed on a slot that held another session (its cache is per slot).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from bench.store import load_records
from tests.real_servers.llama_server import LlamaServer

ROOT = Path(__file__).resolve().parents[2]


def counters(server: LlamaServer) -> tuple[float, float]:
    m = server.metrics()
    return m["llamacpp:prompt_tokens_total"], m["llamacpp:prompt_tokens_cached_total"]


def test_agentic_trace_replay_intended_vs_measured_reuse(llama_server, tmp_path):
    out = tmp_path / "agentic.json"
    evaluated0, cached0 = counters(llama_server)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--base-url", llama_server.url,
         "--model", llama_server.model_name,
         "--scenario", str(ROOT / "scenarios" / "agentic-replay.yaml"),
         "--summary-json", str(out), "--db", f"sqlite:///{tmp_path / 'tb.db'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    evaluated1, cached1 = counters(llama_server)
    summary = json.loads(out.read_text())
    assert summary["completed"] == 40
    intended = summary["prompt_cache"]["intended"]
    usage = summary["prompt_cache"]["usage"]
    print(
        f"\nintended (infinite cache) {intended['share']:.1%} "
        f"({intended['cached_tokens']}/{intended['prompt_tokens']} tokens); "
        f"llama-server usage {usage['share']:.1%} "
        f"({usage['cached_tokens']}/{usage['prompt_tokens']}); "
        f"counters {cached1 - cached0:.0f} cached of {evaluated1 - evaluated0 + cached1 - cached0:.0f}"
    )
    assert usage["requests"] == 40
    assert usage["cached_tokens"] == cached1 - cached0  # the requests and the counters agree
    # The server counts a BOS more per prompt and words the trace counts as one token may
    # be two, so the shares are compared, not token counts.
    assert intended["share"] > 0.7
    assert usage["share"] > 0.5 * intended["share"]  # the replay's reuse reached the server
    assert usage["share"] <= intended["share"] + 0.05  # and no more than the trace allows
    # The two system-prompt blocks (hash ids 0 and 1, 128 tokens) open every request, and
    # the server found them in its cache for every request after the first.
    run_id = re.search(r"Stored as run (\w+)", proc.stdout).group(1)
    records = sorted(load_records(run_id, db=f"sqlite:///{tmp_path / 'tb.db'}"),
                     key=lambda r: r.index)  # fmt: skip
    assert all(r.cached_prompt_tokens >= 128 for r in records[1:])
