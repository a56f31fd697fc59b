"""The small things that lose people: help for every flag, nothing cut at 80 columns or
when piped, where the data is, a busy port and Ctrl-C on the simulated endpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import typer.main

from bench.cli import app
from tests.test_cli import tokenbench


def commands(cmd=None, path=()):
    """(path, click command) for every leaf command of `tokenbench`."""
    cmd = cmd or typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from commands(sub, (*path, name))


def test_every_flag_and_argument_has_help():
    missing = [
        (" ".join(path), p.opts)
        for path, cmd in commands()
        for p in cmd.params
        if not (getattr(p, "help", None) or "").strip()
    ]
    assert missing == []


@pytest.mark.slow
def test_help_at_80_columns_shows_every_flag_name_whole():
    for path, cmd in commands():
        proc = tokenbench(*path, "--help", env={"COLUMNS": "80"})
        assert proc.returncode == 0, (path, proc.stderr)
        assert "…" not in proc.stdout, path
        for p in cmd.params:
            for name in (*p.opts, *p.secondary_opts):
                if name.startswith("-"):
                    assert name in proc.stdout, (path, name)


@pytest.mark.slow
def test_command_lists_at_80_columns_are_not_cut():
    for group in ([], ["sim"], ["db"]):
        text = tokenbench(*group, "--help", env={"COLUMNS": "80"}).stdout
        cut = [line for line in text.splitlines() if line.rstrip().endswith("...")]
        assert [line for line in cut if not line.startswith("Usage:")] == [], text


@pytest.mark.slow
def test_root_help_says_where_runs_are_stored():
    proc = tokenbench("--help", env={"COLUMNS": "80"})
    assert "$TOKENBENCH_DB" in proc.stdout and "results/tokenbench.db" in proc.stdout


@pytest.mark.slow
def test_runs_elsewhere_names_the_database_and_creates_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TOKENBENCH_DB"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "runs"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "results" / "tokenbench.db") in proc.stdout
    assert "$TOKENBENCH_DB" in proc.stdout
    for args in (["show", "abc"], ["export", "--runs", "abc", "--format", "html"]):
        other = subprocess.run(
            [sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode == 2 and "no database at" in other.stderr, other.stderr
    assert list(tmp_path.iterdir()) == []  # no results/ folder, no database file
    missing = tmp_path / "elsewhere" / "tb.db"
    proc = tokenbench("runs", env={"TOKENBENCH_DB": str(missing)})
    assert f"no database at {missing} (from $TOKENBENCH_DB)" in proc.stdout
    assert not missing.parent.exists()


@pytest.mark.slow
def test_piped_tables_keep_every_number_and_id(fake_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    label = "a-label-long-enough-to-push-the-runs-table-past-eighty-columns"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--num-prompts", "3", "--request-rate", "inf",
        "--random-output-len", "3", "--label", label, "--db", db, env={"COLUMNS": "80"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    run_id = proc.stdout.split("Stored as run ")[1].split()[0]
    assert f"tokenbench show {run_id}" in proc.stdout  # one line, never split
    runs = tokenbench("runs", "--db", db, env={"COLUMNS": "80"})
    assert "…" not in runs.stdout and label in runs.stdout and run_id[:8] in runs.stdout
    assert max(len(line) for line in runs.stdout.splitlines()) > 80


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sim_serve_busy_port_and_ctrl_c_are_clean():
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench", "sim", "serve", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("sim serve did not listen within 60 s")
        busy = tokenbench("sim", "serve", "--port", str(port))
        assert busy.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr and "--port" in busy.stderr
        assert "Traceback" not in busy.stderr and "SIMULATED" not in busy.stdout
        # a stream in flight when Ctrl-C comes
        client = socket.create_connection(("127.0.0.1", port))
        body = b'{"prompt": "hi", "max_tokens": 5000, "stream": true}'
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert client.recv(100).startswith(b"HTTP/1.1 200")
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
        client.close()
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    for noise in ("Traceback", "Event loop is closed", "Task was destroyed", "KeyboardInterrupt"):
        assert noise not in err, err
    assert "SIMULATED" in out and "stopped" in out


def test_tables_wrap_on_a_narrow_terminal_and_widen_when_piped():
    import io

    from rich.table import Table

    from bench.console import PipeSafeConsole

    def table() -> Table:
        t = Table("throughput", "run", "note")
        t.add_row("1,086,123.45", "abcdef0123456789", "x" * 30)
        return t

    terminal = io.StringIO()
    PipeSafeConsole(file=terminal, force_terminal=True, width=40, color_system=None).print(table())
    assert "…" not in terminal.getvalue()
    assert max(len(line) for line in terminal.getvalue().splitlines()) <= 40
    assert "1,086,123." in terminal.getvalue() and "abcdef0123" in terminal.getvalue()
    piped = io.StringIO()
    PipeSafeConsole(file=piped, width=40).print(table())
    assert "1,086,123.45" in piped.getvalue() and "abcdef0123456789" in piped.getvalue()
    assert "x" * 30 in piped.getvalue() and "…" not in piped.getvalue()


@pytest.mark.slow
def test_serve_on_a_busy_port_is_one_line_before_any_banner(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = tokenbench("serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_serve_defaults_to_a_port_other_than_vllms():
    from bench.cli.serve import DEFAULT_PORT

    assert DEFAULT_PORT != 8000
    text = " ".join(tokenbench("serve", "--help").stdout.split())
    assert f"[default: {DEFAULT_PORT};" in text


def test_sim_gpus_piped_wraps_the_parameter_sources_whole():
    """`sim gpus | less` once printed 1,233-column lines (each fitted parameter's source, a
    paragraph, on one line); the sources now wrap in their cell, every word kept."""
    from typer.testing import CliRunner

    from bench.sim.profiles import fitted_parameters

    res = CliRunner().invoke(app, ["sim", "gpus"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "…" not in res.output and max(len(line) for line in lines) <= 200
    start = next(i for i, line in enumerate(lines) if "where the range comes from" in line)
    sources: dict[str, list[str]] = {}
    name = ""
    for line in lines[start + 2 :]:
        cells = line.split("│")
        if len(cells) != 6:  # the table's bottom border
            continue
        name = cells[1].strip() or name
        sources.setdefault(name, []).append(cells[4].strip())
    want = {n: " ".join(src.split()) for n, _, _, src in fitted_parameters()}
    assert {n: " ".join(" ".join(parts).split()) for n, parts in sources.items()} == want
