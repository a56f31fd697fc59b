"""tokenbench against a real llama-server, checked against the server's own counters and log.

llama-server closes the connection after each streamed response while promising keep-alive
(issue 15): before the resend on a fresh connection, half of a closed loop's requests were
lost as connection_reset. Every figure here is compared with what the server itself counted:
requests it finished (its per-request timing lines), tokens it predicted (its counter), the
prompt it held (its slot log) and its own per-request decode time.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.store import list_runs, load_records
from tests.real_servers.llama_server import LlamaServer

OUT = 16  # output tokens per request; ignore_eos makes the server decode exactly this many
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+)")


def tokenbench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


class ServerWindow:
    """What the server did between `open` and `close`: counter deltas and its new log lines."""

    def __init__(self, server: LlamaServer) -> None:
        self.server = server
        self.metrics0 = server.metrics()
        self.log0 = len(server.log())

    def close(self) -> None:
        metrics = self.server.metrics()
        self.delta = {k: metrics[k] - self.metrics0.get(k, 0.0) for k in metrics}
        log = self.server.log()[self.log0 :]
        pattern = re.compile(r"^.*?\beval time =\s*([\d.]+) ms /\s*(\d+) tokens", re.M)
        # "prompt eval time" lines match too; keep the decode ("eval time") ones only.
        self.decodes = [
            (float(ms), int(n))
            for line in log.splitlines()
            if "prompt eval time" not in line
            for ms, n in pattern.findall(line)
        ]
        self.slot_tokens = [int(n) for n in _RELEASE.findall(log)]

    @property
    def finished(self) -> int:
        """Requests the server finished decoding (one timing line each)."""
        return len(self.decodes)


def run_args(server: LlamaServer, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--base-url", server.url, "--model", server.model_name,
        "--random-input-len", "32", "--random-output-len", str(OUT),
        "--db", f"sqlite:///{tmp_path / 'tb.db'}", *extra,
    ]  # fmt: skip


def stored_records(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    (run,) = list_runs(db)
    return run, load_records(run.id, db=db)


def check_against_server(records, window: ServerWindow) -> None:
    """Every request the client counted is one the server finished, with its tokens."""
    ok = [r for r in records if r.ok]
    assert len(ok) == len(records), {r.error_kind: r.error_message for r in records if not r.ok}
    assert window.finished == len(ok)  # no failure the server never saw, no request lost
    assert sum(r.output_tokens for r in ok) == window.delta["llamacpp:tokens_predicted_total"]
    assert all(r.output_tokens == OUT for r in ok)
    # The slot holds prompt + output - 1 tokens when it releases (the last sampled token is
    # never decoded): the server's own count of each prompt, cached or not.
    assert sum(r.prompt_tokens for r in ok) == sum(n - OUT + 1 for n in window.slot_tokens)


def test_closed_loop_of_4_users_completes_40_of_40(llama_server: LlamaServer, tmp_path):
    window = ServerWindow(llama_server)
    out = tmp_path / "s.json"
    proc = tokenbench(
        "run", *run_args(llama_server, tmp_path, "--concurrency", "4", "--num-prompts", "40"),
        "--summary-json", str(out),
    )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert (summary["completed"], summary["failed"]) == (40, 0), summary["errors"]
    run, records = stored_records(tmp_path)
    assert len(records) == 40 and run.status == "completed"
    check_against_server(records, window)
    # The stale connections were resent, once each, and the record says so.
    assert all(r.retries in (0, 1) for r in records)
    assert summary["resent"] == sum(r.retries for r in records)
    assert summary["served_models"] == [llama_server.model_name]


@pytest.mark.parametrize(
    "load", [("--request-rate", "40"), ("--request-rate", "inf", "--max-concurrency", "16")]
)
def test_open_loop_counts_every_request_the_server_finished(
    llama_server: LlamaServer, tmp_path, load
):
    """A Poisson open loop, and all at once under a cap of 16 (8 of 32 lost before)."""
    window = ServerWindow(llama_server)
    proc = tokenbench(
        "run", *run_args(llama_server, tmp_path, *load, "--num-prompts", "32"), "--seed", "11",
    )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    _run, records = stored_records(tmp_path)
    assert len(records) == 32
    check_against_server(records, window)


def test_httpx_closed_loop_loses_nothing_either(llama_server: LlamaServer, tmp_path):
    window = ServerWindow(llama_server)
    proc = tokenbench(
        "run", *run_args(llama_server, tmp_path, "--concurrency", "4", "--num-prompts", "40"),
        "--transport", "httpx", "--seed", "12",
    )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    _run, records = stored_records(tmp_path)
    assert len(records) == 40
    check_against_server(records, window)


def test_concurrency_sweep_1_4_8_has_no_failures(llama_server: LlamaServer, tmp_path):
    window = ServerWindow(llama_server)
    proc = tokenbench(
        "sweep", *run_args(llama_server, tmp_path, "--concurrency", "1,4,8", "--num-prompts", "16"),
        "--seed", "13",
    )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    _run, records = stored_records(tmp_path)
    per_point = {lp: sum(r.load_point == lp for r in records) for lp in {0, 1, 2}}
    assert per_point == {0: 16, 1: 16, 2: 16}
    check_against_server(records, window)


def test_tpot_matches_the_servers_own_decode_time(llama_server: LlamaServer, tmp_path):
    """TPOT = (E2E - TTFT) / (n - 1); llama-server's `eval time` spans the same n - 1 gaps
    (it starts at the first sampled token). One user, so each is one request's decode."""
    window = ServerWindow(llama_server)
    proc = tokenbench(
        "run", *run_args(llama_server, tmp_path, "--concurrency", "1", "--num-prompts", "20"),
        "--seed", "14",
    )  # fmt: skip
    window.close()
    assert proc.returncode == 0, proc.stderr
    _run, records = stored_records(tmp_path)
    check_against_server(records, window)
    ours = statistics.median(r.tpot_ns / 1e6 for r in records)
    theirs = statistics.median(ms / (n - 1) for ms, n in window.decodes)
    assert ours == pytest.approx(theirs, abs=1.0), (ours, theirs)


def test_base_url_with_v1_reaches_the_server(llama_server: LlamaServer, tmp_path):
    """`--base-url http://host:port/v1` (what servers print) and `host:port` both work."""
    for i, url in enumerate((f"{llama_server.url}/v1", llama_server.url.removeprefix("http://"))):
        window = ServerWindow(llama_server)
        proc = tokenbench(
            "run", "--base-url", url, "--model", llama_server.model_name, "--num-prompts", "2",
            "--random-input-len", "16", "--random-output-len", str(OUT), "--no-store",
            "--seed", str(20 + i),
        )  # fmt: skip
        window.close()
        assert proc.returncode == 0, proc.stderr
        assert window.finished == 2


def test_a_request_the_server_refuses_is_reported_with_its_message(
    llama_server: LlamaServer, tmp_path
):
    """A prompt longer than a slot's context: llama.cpp's own words reach the console, the
    run exits 1 (nothing succeeded) and is stored as failed."""
    proc = tokenbench(
        "run", *run_args(llama_server, tmp_path, "--num-prompts", "2", "--random-input-len",
                         "2000"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "First failure" in text and "context" in text, text[-2000:]
    run, records = stored_records(tmp_path)
    assert run.status == "failed" and all(r.error_kind == "http_4xx" for r in records)


def test_a_model_name_the_server_does_not_list_is_warned_about(llama_server: LlamaServer, tmp_path):
    proc = tokenbench(
        "run", "--base-url", llama_server.url, "--model", "not-this-one", "--num-prompts", "1",
        "--random-input-len", "16", "--random-output-len", "4", "--no-store", "--summary-json", str(tmp_path / "s.json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "'not-this-one' is not among the models" in text, text
    said = json.loads((tmp_path / "s.json").read_text())
    # llama-server answers as its --alias whatever was asked: that name is kept and said.
    assert said["served_models"] == [llama_server.model_name]
    assert "the server answered as 'tiny-llama'" in text
