"""Every command of the README's tour runs exactly as printed, so the README cannot drift
from the CLI and a flag the test added cannot hide what the command really does (an appended
--num-prompts once hid that a scenario file's own prompt count was replaced by the default).

The commands are read from README.md's "A tour" block as written. Only the endpoint changes:
`http://127.0.0.1:8000` and the README's `...` become a fake OpenAI server's URL (TTFT 10 ms,
1 ms between tokens, so the tour's sizes run in a few minutes); `RUN`, `RUN_A` and `RUN_B`
become the ids of runs stored earlier in the tour, and `sim serve` gets a free port and is
stopped with Ctrl-C once it answers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.scenario import load_scenario
from tests.conftest import start_fake_server
from tests.helpers import suggested_commands

ROOT = Path(__file__).resolve().parents[1]


def tour_commands() -> list[list[str]]:
    """The tour's commands as argument lists (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## A tour", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        words: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:  # `a; b` is two commands
            if word.endswith(";"):
                words.append(word[:-1]) if word[:-1] else None
                if words:
                    assert words[0] == "tokenbench", f"not a tokenbench command: {line!r}"
                    commands.append(words[1:])
                words = []
            else:
                words.append(word)
    return commands


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tour_is_read_whole():
    kinds = {" ".join(c[:2]) if c[0] == "sim" else c[0] for c in tour_commands()}
    assert kinds == {"run", "sweep", "compare", "prices", "runs", "show", "rm", "export-raw",
                     "import", "plan", "sim serve", "sim run", "sim gpus", "sim models",
                     "sim calibrate", "sim check", "sim device",
                     "sim tune", "tune"}  # fmt: skip


@pytest.fixture(scope="module")
def tour_server():
    server = start_fake_server("--ttft-ms", "10", "--itl-ms", "1")
    yield server
    server.stop()


@pytest.mark.slow
def test_every_tour_command_runs(tour_server, tmp_path):
    fake_server = tour_server
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    (tmp_path / "experiments").symlink_to(ROOT / "experiments")
    env = {**os.environ, "TOKENBENCH_DB": str(tmp_path / "tour.db"), "COLUMNS": "120",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    ids: dict[str, str] = {}
    tried: set[tuple[str, str]] = set()
    sweeps: list[str] = []
    for words in tour_commands():
        args = [fake_server.url if w in ("http://127.0.0.1:8000", "...") else w for w in words]
        kind = " ".join(args[:2]) if args[0] == "sim" else args[0]
        args = [ids.get(w, w) for w in args]
        if kind == "sim serve":
            check_sim_serve(args, env, tmp_path)
            continue
        if kind == "tune":
            args = tune_on_llama_server(args)
            if args is None:
                continue  # no llama-server here (never under CI): the rest of the tour runs
        started = time.monotonic()
        # 900 s: `sim calibrate` searches from 3 starts (3 x 200 evaluations) and ran just
        # past 300 s on the tour's run beside the rest of the suite on 2 cores
        proc = subprocess.run(
            [sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env, input="y\n",
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        print(f"{time.monotonic() - started:6.1f} s  tokenbench {shlex.join(args)}")
        said = f"tokenbench {shlex.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, said
        assert "Traceback" not in proc.stderr, said
        for suggested in suggested_commands(proc.stdout + proc.stderr):
            if (kind, suggested[0]) not in tried:  # what the CLI told the user to run next
                tried.add((kind, suggested[0]))
                again = subprocess.run(
                    [sys.executable, "-m", "bench", *suggested], cwd=tmp_path, env=env,
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert again.returncode == 0, f"{suggested}\n{again.stdout}\n{again.stderr}"
        if kind == "run":
            ids.setdefault("RUN", re.search(r"Stored as run ([0-9a-f]{32})", proc.stdout)[1])
        if kind == "run" and args[-2:] == ["--scenario", "scenarios/chat-bursty.yaml"]:
            run_id = re.search(r"Stored as run ([0-9a-f]{32})", proc.stdout)[1]
            shown = subprocess.run(
                [sys.executable, "-m", "bench", "show", run_id, "--json"], cwd=tmp_path,
                env=env, capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            summary = json.loads(shown.stdout)["summaries"]["run"]
            sent = summary["completed"] + summary["failed"]
            # the file's own count stands: no flag gave another
            assert sent == load_scenario(ROOT / "scenarios/chat-bursty.yaml").load.num_prompts
        if kind == "sweep":
            sweeps.append(re.search(r"\(run ([0-9a-f]{32})\)", proc.stdout)[1])
            ids.update(RUN_A=sweeps[0], RUN_B=sweeps[-1])
    assert (tmp_path / "out.json").is_file() and (tmp_path / "vllm-result.json").is_file()
    assert len(list((tmp_path / "vllm-results").glob("vllm-20.0qps-concurrency64-*.json"))) == 1
    assert (tmp_path / "run.parquet").is_file() and (tmp_path / "sweep.json").is_file()
    assert ("run", "show") in tried and ("sim run", "show") in tried


def check_sim_serve(args: list[str], env: dict, cwd: Path) -> None:
    """`sim serve` as written, on a free port: it answers /v1/models, then Ctrl-C stops it."""
    port = str(free_port())
    args = [port if prev == "--port" else w for prev, w in zip(["", *args[:-1]], args, strict=True)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", *args], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(port))) == 0:
                    break
            time.sleep(0.1)
        import httpx

        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "llama-3.3-70b"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err


def tune_on_llama_server(args: list[str]) -> list[str] | None:
    """`tune` as written, with the real llama-server and the tiny model in place of
    ./llama-server and model.gguf (tests/real_servers), on one thread; None where there is
    no llama-server (under CI that fails the test instead)."""
    from tests.real_servers.llama_server import find_or_build_binary, tiny_model

    try:
        binary = find_or_build_binary()
        model = tiny_model(binary)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"llama-server unavailable under CI: {exc}")
        return None
    swap = {"./llama-server": str(binary), "model=model.gguf": f"model={model}"}
    return [swap.get(w, w) for w in args] + ["--arg", "threads=1"]
