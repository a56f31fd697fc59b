"""Fixtures for tests against real serving engines (llama.cpp's llama-server).

Every test here is `slow` and `real_server`: `pytest -m "not slow"` skips them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_servers.llama_server import (
    LlamaServer,
    find_or_build_binary,
    llama_server_fixture,
    unavailable,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "real_servers" in str(item.path):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.real_server)


@pytest.fixture(scope="session")
def llama_binary(pytestconfig: pytest.Config) -> Path:
    """llama-server, built once when missing, with pytest's output capture off meanwhile:
    the build prints what it does and its progress, not minutes of silence."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            return find_or_build_binary()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            unavailable(str(exc))


@pytest.fixture(scope="session")
def llama_server(llama_binary: Path, tmp_path_factory) -> Iterator[LlamaServer]:
    """One llama-server for the session: 8 slots, continuous batching, /metrics, prompt cache on.

    Tests that count must read the server's counters before and after (deltas), since other
    tests use the same server.
    """
    yield from llama_server_fixture(tmp_path_factory)
