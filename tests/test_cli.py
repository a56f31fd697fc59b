"""`tokenbench run` as a user runs it: flags, summary JSON contract, --fail-on, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

# Every test runs `tokenbench` in a subprocess against the fake server: end-to-end.
pytestmark = pytest.mark.slow


SUMMARY_KEYS = {
    "interrupted",
    "completed",
    "failed",
    "errors",
    "duration_s",
    "throughput",
    "metrics",
    "goodput_requests_per_s",
    "send_lag_ms",
    "client_limited",
    # issue 15, added (never renamed): the self-check's verdict and reasons, waits for a
    # --max-concurrency slot, prompt-cache figures, notes on how to read the figures
    "client_limited_reasons",
    "self_check",
    "slot_wait_ms",
    "prompt_cache",
    "notes",
    # what a CI job needs to know what was measured (issue 14)
    "run_id",
    "model",
    "base_url",
    "endpoint",
    "backend",
    "load",
    "total_input_tokens",
    "total_output_tokens",
    "failure_examples",
    "confidence",
}
STAT_KEYS = {"mean", "std", "p50", "p90", "p95", "p99", "p99.9"}


def tokenbench(
    *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'tb.db'}"


def test_summary_json_contract_and_goodput(server_factory, tmp_path, db):
    sends_log = tmp_path / "sends.json"
    server = server_factory("--ttft-ms", "50", "--itl-ms", "10", "--sends-log", str(sends_log))
    out = tmp_path / "summary.json"
    proc = tokenbench(
        "run", "--base-url", server.url, "--num-prompts", "30", "--request-rate", "60",
        "--random-input-len", "20", "--random-output-len", "11", "--goodput", "ttft:500",
        "tpot:5", "--summary-json", str(out), "--db", db,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    assert set(s) >= SUMMARY_KEYS  # the contract's keys stay; issue 15 added what went wrong
    assert s["first_failure"] is None and s["served_models"] == ["fake-model"]
    assert s["resent"] == 0
    assert set(s["throughput"]) == {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}
    assert set(s["metrics"]) == {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}
    assert all(set(v) == STAT_KEYS for v in s["metrics"].values())
    assert set(s["send_lag_ms"]) == {"p50", "p99", "max"}
    # Every percentile carries its sample count and 95% interval; 30 requests cannot bound
    # a P99 from above (the interval is open there), and their median's interval is closed.
    ttft_ci = s["confidence"]["ttft_ms"]
    assert ttft_ci["count"] == 30 and ttft_ci["level"] == 0.95
    assert ttft_ci["p99"][1] is None and ttft_ci["p99"][0] <= s["metrics"]["ttft_ms"]["p99"]
    assert ttft_ci["p50"][0] <= s["metrics"]["ttft_ms"]["p50"] <= ttft_ci["p50"][1]
    assert s["completed"] == 30 and s["failed"] == 0 and s["errors"] == {}
    assert s["interrupted"] is False
    assert isinstance(s["client_limited"], bool)  # its truth is tested in test_client_limited
    assert s["self_check"] in ("ok", "client-limited") and isinstance(
        s["client_limited_reasons"], list
    )
    assert s["prompt_cache"]["largely_cached"] is False  # the fake server reports no cache
    assert any("approximate" in note for note in s["notes"])  # no --tokenizer given
    # TPOT against the server's own send times (10 ms apart when idle; a loaded machine
    # makes the server itself late, so the truth is what it did, not what it was asked to).
    server.stop()
    truth = [(s[-1] - s[0]) / 1e6 / (len(s) - 1) for s in json.loads(sends_log.read_text())]
    assert s["metrics"]["tpot_ms"]["p50"] == pytest.approx(float(np.median(truth)), abs=0.5)
    assert s["base_url"] == server.url and s["model"] == "fake-model"
    assert s["run_id"] and s["run_id"] in proc.stdout
    assert s["load"]["shape"] == "poisson" and s["load"]["request_rate"] == 60
    assert s["load"]["num_prompts"] == 30 and s["load"]["max_concurrency"] is None
    assert s["total_output_tokens"] == 30 * 11
    assert bool(s["client_limited_reasons"]) == s["client_limited"]
    assert s["failure_examples"] == {}
    # TPOT 10 ms breaks the 5 ms goodput SLO for every request.
    assert s["goodput_requests_per_s"] == 0.0
    assert "Output token throughput" in proc.stdout and "TTFT" in proc.stdout


def test_fail_on_exit_code(fake_server, db):
    args = ["run", "--base-url", fake_server.url, "--num-prompts", "8", "--request-rate", "inf",
            "--random-output-len", "4", "--db", db]  # fmt: skip
    ok = tokenbench(*args, "--fail-on", "p99_ttft_ms<2000,error_rate<0.01")
    assert ok.returncode == 0, ok.stderr
    broken = tokenbench(*args, "--fail-on", "p99_ttft_ms<1,error_rate<0.01")
    assert broken.returncode == 1
    assert "p99_ttft_ms<1 broken" in broken.stderr
    bad = tokenbench(*args, "--fail-on", "p99_ttft<5")
    assert bad.returncode == 2 and "unknown metric 'p99_ttft'" in bad.stderr


def test_unreachable_base_url_fails_fast_in_one_line(db):
    t = time.monotonic()
    proc = tokenbench("run", "--base-url", "http://127.0.0.1:9", "--db", db)
    assert proc.returncode == 2
    assert time.monotonic() - t < 20
    assert "cannot reach http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_flag_values_are_one_line_errors(fake_server, tmp_path, db):
    proc = tokenbench("run", "--base-url", fake_server.url, "--request-rate", "fast", "--db", db)
    assert proc.returncode == 2 and "--request-rate 'fast'" in proc.stderr
    bad = tmp_path / "s.yaml"
    bad.write_text("load:\n  shape: ramp\n")
    proc = tokenbench("run", "--base-url", fake_server.url, "--scenario", str(bad), "--db", db)
    assert proc.returncode == 2 and "needs ramp" in proc.stderr and "Traceback" not in proc.stderr


def test_ctrl_c_keeps_a_partial_summary_marked_interrupted(server_factory, tmp_path, db):
    # Each request streams for ~1 s, so at 20 req/s about 20 are in flight at any moment.
    server = server_factory("--ttft-ms", "20", "--itl-ms", "100")
    out = tmp_path / "s.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--base-url", server.url, "--num-prompts", "400",
         "--request-rate", "20", "--random-output-len", "10", "--summary-json", str(out),
         "--db", db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    # Interrupt once the run is well under way and streams are open, by the server's own
    # counts (a fixed sleep fires before start-up ends on a busy machine, and a client
    # starved by other work may have nothing in flight at a given instant).
    def under_way() -> bool:
        stats = server.stats()
        return stats["finished"] >= 15 and stats["requests"] - stats["finished"] >= 3

    deadline = time.monotonic() + 120
    while not under_way() and proc.poll() is None:
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    s = json.loads(out.read_text())
    assert s["interrupted"] is True
    assert 10 < s["completed"] < 400
    assert "Interrupted" in stdout
    # Requests in flight at Ctrl-C are counted as cancelled, not lost and not failed.
    assert s["errors"].get("cancelled", 0) >= 1
    assert s["failed"] == 0


def test_closed_loop_flags_and_chat_endpoint(fake_server, tmp_path, db):
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--endpoint", "/v1/chat/completions",
        "--concurrency", "4", "--num-prompts", "12", "--random-output-len", "6",
        "--backend", "sglang", "--summary-json", str(out), "--db", db,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    assert s["completed"] == 12


def test_api_key_is_sent_but_never_stored_or_printed(fake_server, tmp_path):
    db_file = tmp_path / "k.db"
    secret = "sk-test-SECRET-4242"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--num-prompts", "3", "--random-output-len", "3",
        "--db", f"sqlite:///{db_file}", "--percentile-metrics", "ttft,e2el",
        env={"OPENAI_API_KEY": secret},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout + proc.stderr
    for path in tmp_path.iterdir():  # the database and its WAL/SHM files
        assert secret.encode() not in path.read_bytes()
    assert "TTFT" in proc.stdout and "E2E latency" in proc.stdout and "TPOT " not in proc.stdout


def test_workers_flag_splits_the_run_across_processes(fake_server, tmp_path, db):
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--num-prompts", "40", "--request-rate", "80",
        "--random-output-len", "5", "--workers", "2", "--summary-json", str(out), "--db", db,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    assert s["completed"] == 40 and s["failed"] == 0
