"""The self-check against a real llama-server: a closed loop is judged by what the client
controls, and a starved client is still caught; a server killed mid-run is said in one
line and fails the command (issue 23).

A closed loop on a batching server: the users' requests end together, so their next ones
are due within a millisecond of each other. Read as an open-loop schedule, 10-35 ms of
send lag was "over 25% of the gap between scheduled sends" and every closed-loop run was
flagged CLIENT-LIMITED although TTFT was seconds. The truth here is the server's own
counters and log: every request the client counted is one the server finished, with the
tokens it predicted.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from bench.metrics import HOST_CPU_WAIT
from bench.scenario import parse_scenario
from bench.session import window_summary
from tests.helpers import cpu_pressure, plan
from tests.real_servers.llama_server import LlamaServer, start_llama_server
from tests.real_servers.test_llama_wire import (
    OUT,
    ServerWindow,
    check_against_server,
    run_args,
    stored_records,
    tokenbench,
)

GAP_RULE = "between scheduled sends"  # the open-loop rule, which a closed loop has no use for


def test_a_closed_loop_on_a_batching_server_is_not_client_limited(
    llama_server: LlamaServer, tmp_path
):
    """24 users on 8 slots: most requests wait for a slot, so TTFT is about a request's time,
    and users end and restart together."""
    window = ServerWindow(llama_server)
    out = tmp_path / "s.json"
    with cpu_pressure() as pressure:
        proc = tokenbench(
            "run", *run_args(llama_server, tmp_path, "--concurrency", "24", "--num-prompts", "72"),
            "--random-output-len", "128", "--ignore-eos", "--summary-json", str(out),
        )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    _run, records = stored_records(tmp_path)
    # the server finished exactly what we counted, with the tokens we counted
    assert all(r.ok for r in records) and len(records) == window.finished == 72
    assert sum(r.output_tokens for r in records) == window.delta["llamacpp:tokens_predicted_total"]
    summary = json.loads(out.read_text())
    reasons = summary["client_limited_reasons"]
    assert not [r for r in reasons if GAP_RULE in r], reasons
    # a CPU-starved machine may starve the client for real: the machine-wide pressure says so,
    # or the client's own wait for a CPU does (a CI run, 2026-12-07, flagged 11.1% of tokens
    # read merged with the machine-wide figures calm: the client's loop is one thread of many)
    kept_off = any(r.startswith(HOST_CPU_WAIT) for r in reasons)
    if not pressure.starved and not kept_off:
        assert summary["self_check"] == "ok", (reasons, str(pressure))
        assert "CLIENT-LIMITED" not in proc.stdout + proc.stderr


def test_a_starved_client_in_a_closed_loop_is_still_caught(llama_server: LlamaServer, tmp_path):
    """The client's own loop is blocked 300 ms in every 550 ms (a progress callback that
    sleeps on the loop), so requests due while it sleeps leave late: the self-check must say
    so, beside the server's TTFT."""
    from bench.runner import run_blocking

    window = ServerWindow(llama_server)
    users, n = 4, 40
    p = plan(llama_server.url, n, out_len=16, rate=None, concurrency=users,
             model=llama_server.model_name)  # fmt: skip
    blocked: list[float] = []

    def starve(progress) -> None:
        if progress.completed >= users and progress.sent < n:
            time.sleep(0.3)  # on the event loop: nothing is sent or read meanwhile
            blocked.append(0.3)

    result = run_blocking(p, on_tick=starve, tick_s=0.25, handle_sigint=False)
    window.close()
    assert blocked, "the starvation never began"
    check_against_server(result.records, window)
    sc = parse_scenario(f"load: {{shape: closed, concurrency: {users}, num_prompts: {n}}}")
    summary = window_summary(result, sc)
    assert summary.completed == n
    assert summary.send_lag_ms["p99"] >= 100, summary.send_lag_ms  # what the sleeps did
    assert summary.client_limited, summary.send_lag_ms
    assert any("median TTFT" in r for r in summary.client_limited_reasons), (
        summary.client_limited_reasons
    )


# ---------------------------------------------------------------- the server goes away


def _kill_when(server: LlamaServer, tokens: float, deadline_s: float = 120) -> float:
    """Kill the server once it has predicted `tokens` more tokens; returns what it had."""
    start = server.metrics().get("llamacpp:tokens_predicted_total", 0.0)
    deadline = time.monotonic() + deadline_s
    done = 0.0
    while time.monotonic() < deadline and done < tokens:
        done = server.metrics().get("llamacpp:tokens_predicted_total", 0.0) - start
        time.sleep(0.05)
    server.proc.kill()
    server.proc.wait(timeout=30)
    return done


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_server_killed_mid_run_is_said_in_one_line_and_exits_1(llama_binary, tmp_path, command):
    import subprocess
    import sys

    server = start_llama_server(tmp_path)
    try:
        load = (
            ["--request-rate", "20", "--num-prompts", "200"]
            if command == "run"
            else ["--request-rates", "20,40", "--point-duration", "10"]
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench", command, *run_args(server, tmp_path, *load),
             "--request-timeout", "30"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert _kill_when(server, tokens=20 * OUT) >= 20 * OUT, "the server never got going"
        out, err = proc.communicate(timeout=300)
    finally:
        server.stop()
    assert proc.returncode == 1, out + err
    _run, records = stored_records(tmp_path)
    ok = sum(r.ok for r in records)
    assert ok >= 20 and ok < len(records), (ok, len(records))
    text = " ".join(err.split())
    said = re.search(r"The server stopped answering after ([\d,]+) requests succeeded", text)
    assert said is not None, text
    assert int(said[1].replace(",", "")) == ok  # every success came before the first failure
    assert "Traceback" not in err and "FAIL" in text and "requests failed" in text
