"""Shared fixtures: a fake OpenAI server in a subprocess, started per configuration."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_SERVER = ROOT / "tests" / "fake_openai_server.py"


class FakeServer:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def stats(self) -> dict[str, int]:
        """The server's own counts: requests received, streams finished."""
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_fake_server(*args: str) -> FakeServer:
    """Start tests/fake_openai_server.py on a free loopback port and wait until it listens."""
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r} {proc.stderr.read()}")
    return FakeServer(proc, int(line.split()[1]))


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeServer]:
    """TTFT 50 ms, 10 ms between tokens, no faults."""
    server = start_fake_server("--ttft-ms", "50", "--itl-ms", "10")
    yield server
    server.stop()


@pytest.fixture
def server_factory() -> Iterator:
    started: list[FakeServer] = []

    def make(*args: str) -> FakeServer:
        server = start_fake_server(*args)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


SERVER_FIXTURES = frozenset({"fake_server", "server_factory"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a server subprocess is slow, marked or not (README: the fast subset
    runs no server), so a new test cannot quietly lengthen `-m "not slow"`."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
