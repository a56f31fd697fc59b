"""benchmarks/loadgen.py's side-by-side report: a peer that cannot be installed is reported,
never dropped, and a point counts as honest only in most of its repeats.

No venv is created and no peer is run here: installing the peers is the benchmark's own
job (`python benchmarks/loadgen.py peers`), minutes to hours of downloads.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def loadgen():
    spec = importlib.util.spec_from_file_location(
        "loadgen_bench", ROOT / "benchmarks" / "loadgen.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_unknown_and_too_new_peers_say_why(loadgen, monkeypatch, tmp_path):
    monkeypatch.setattr(loadgen, "VENVS", tmp_path)
    assert "unknown peer 'nope'" in loadgen.ensure_peer("nope")
    monkeypatch.setattr(loadgen, "python_for", lambda peer: None)
    why = loadgen.ensure_peer("inference-perf")
    assert "inference-perf==0.7.0 needs Python >= 3.12" in why
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_installed_peer_is_found_without_pip(loadgen, monkeypatch, tmp_path):
    monkeypatch.setattr(loadgen, "VENVS", tmp_path)
    exe = tmp_path / "guidellm" / "bin" / "guidellm"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    ready, missing = loadgen.ensure_peers(["guidellm", "nope"])
    assert ready == {"guidellm": tmp_path / "guidellm"}
    assert list(missing) == ["nope"]


def test_python_for_a_peer_is_new_enough(loadgen):
    peer = loadgen.Peer("x==1", "x", (3, 99))
    assert loadgen.python_for(peer) is None
    assert loadgen.python_for(loadgen.Peer("x==1", "x", (3, 8))) == sys.executable


def _row(client, out_len, c, rps, honest, rep):
    return {
        "client": client,
        "out_len": out_len,
        "concurrency": c,
        "requests_per_s": rps,
        "tokens_per_s": rps * out_len,
        "client_cpu_us_per_request": 100.0,
        "requests_per_s_per_core": 10_000.0,
        "tokens_per_s_per_core": 10_000.0 * out_len,
        "first_token_err_p99_ms": 0.1,
        "itl_err_p99_ms": 0.0,
        "peak_rss_mb": 50.0,
        "processes": 1,
        "honest": honest,
        "repeat": rep,
    }


def test_report_takes_the_highest_point_honest_in_most_repeats(loadgen):
    rows = [
        _row("tokenbench", 1, 64, 600, True, 0),
        _row("tokenbench", 1, 64, 620, True, 1),
        _row("tokenbench", 1, 64, 640, True, 2),
        _row("tokenbench", 1, 256, 2400, True, 0),
        _row("tokenbench", 1, 256, 2500, False, 1),
        _row("tokenbench", 1, 256, 2450, False, 2),  # honest 1 of 3: not honest
        _row("guidellm", 1, 64, 180, False, 0),
    ]
    points = loadgen.short_medians(rows)
    text = loadgen.short_report(points, ["tokenbench", "guidellm"], [1], {"vllm": "no wheel"})
    lines = text.splitlines()
    ours = next(line for line in lines if "| tokenbench |" in line)
    assert "| 620 req/s | 64 |" in ours and "C=256 1/3" in ours
    assert "| 1 | guidellm | none; fastest: 180 req/s | 64 |" in text
    assert "| vllm | NOT MEASURED: no wheel |" in text
