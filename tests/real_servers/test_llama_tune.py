"""`tokenbench tune` over a real llama-server: --parallel x --ctx-size, one stored run per
combination, each engine started with its own settings and stopped, the best named at the SLO.

Which combination wins depends on the machine's speed, so the test checks what must hold on
any machine: every combination measured and stored with its settings, version and command;
each engine really ran with its settings (its own log says so); the ranking names one of
them; and the engines are gone afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from bench.store import list_runs
from bench.tune import load_experiment, rank, settings_text
from tests.real_servers.llama_server import find_or_build_binary, tiny_model, unavailable


def test_tune_over_parallel_and_ctx_size(tmp_path: Path):
    try:
        binary = find_or_build_binary()
        model = tiny_model(binary)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable(str(exc))
    doc = {
        "name": "llama-slots",
        "launch": {
            "engine": "llama-server",
            "binary": str(binary),
            "args": {"model": str(model), "alias": "tiny-llama", "threads": 1},
        },
        "health": {"timeout_s": 120},
        "params": {"parallel": [1, 2], "ctx_size": [256, 512]},
        "target": {"model": "tiny-llama"},
        "load": {"num_prompts": 4},
        "workload": {"input": {"mean": 24}, "output": {"mean": 8}},
        "slo": "p99_ttft_ms<=2000",
        "sweep": {"concurrency": [1, 2], "slo_iterations": 0},
        "warmup_requests": 1,
    }
    exp_path = tmp_path / "exp.yaml"
    exp_path.write_text(yaml.safe_dump(doc))
    db = str(tmp_path / "tb.db")
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "tune", str(exp_path), "--db", db, "--log-dir", str(logs)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 measured, 0 stored before, 0 failed" in proc.stdout

    runs = [r for r in list_runs(db) if r.extra_json["tune"]["experiment"] == "llama-slots"]
    assert len(runs) == 4 and {r.status for r in runs} == {"completed"}
    settings = sorted(json.dumps(r.extra_json["tune"]["settings"], sort_keys=True) for r in runs)
    assert settings == sorted(
        json.dumps({"parallel": p, "ctx_size": c}, sort_keys=True)
        for p in (1, 2)
        for c in (256, 512)
    )
    for run in runs:
        tune = run.extra_json["tune"]
        assert "version" in tune["engine_version"]
        s = tune["settings"]
        assert f"--parallel {s['parallel']}" in tune["command"]
        assert f"--ctx-size {s['ctx_size']}" in tune["command"]
    for log in logs.glob("llama-slots-*.log"):  # each engine ran with its own slot count
        port = log.stem.rsplit("-", 1)[1]
        run = next(r for r in runs if f"--port {port} " in r.extra_json["tune"]["command"])
        found = re.search(r"n_slots = (\d+)", log.read_text(errors="replace"))
        assert found and int(found.group(1)) == run.extra_json["tune"]["settings"]["parallel"]
    assert len(list(logs.glob("llama-slots-*.log"))) == 4
    for run in runs:  # every engine was stopped: nothing listens on its port any more
        port = re.search(r"--port (\d+)", run.extra_json["tune"]["command"]).group(1)
        assert f"--port {port} " not in _running_commands()

    ranking = rank(load_experiment(exp_path), db)
    assert len(ranking.ranked) == 4
    assert proc.stdout.count("Best: ") == 1
    assert f"Best: {settings_text(ranking.ranked[0].settings)}: " in proc.stdout

    # Resumable: a rerun measures nothing again.
    again = subprocess.run(
        [sys.executable, "-m", "bench", "tune", str(exp_path), "--db", db, "--log-dir", str(logs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0 measured, 4 stored before, 0 failed" in again.stdout


def _running_commands() -> str:
    """Every running process's command line, one per line."""
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return "\n".join(lines)
