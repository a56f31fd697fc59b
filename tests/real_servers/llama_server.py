"""A real llama.cpp `llama-server` for the real-server tests: built once, serving a tiny model.

The binary is built from the PyPI sdist of llama-cpp-python by build_llama_server.sh (cached
under $TOKENBENCH_CACHE, default ~/.cache/tokenbench; `.ci/run` builds it before the tests).
Where it cannot be had, the tests that need it skip with the reason, except under CI=true,
where they fail: a real-server test that silently skipped would prove nothing.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build_llama_server.sh"
START_TIMEOUT_S = 120.0


def find_or_build_binary() -> Path:
    """The cached llama-server binary, building it first when missing (minutes).

    The build script's progress goes to this process's stderr as it comes (the
    `llama_binary` fixture turns pytest's capture off around it, so a user sees a compiler
    at work, not silence); its stdout is the binary's path.
    """
    proc = subprocess.run(
        ["bash", str(BUILD)], stdout=subprocess.PIPE, text=True, timeout=3600, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building llama-server failed (exit {proc.returncode}): see above")
    return Path(proc.stdout.strip().splitlines()[-1])


def tiny_model(binary: Path, q8: bool = False) -> Path:
    """The tiny random-weight Llama beside the binary's cache, written once (q8: its
    matrices in Q8_0, else F32; tiny_llama.write_tiny_llama)."""
    cache = binary.parent.parent
    model = cache / ("tiny-llama-q8_0.gguf" if q8 else "tiny-llama.gguf")
    if not model.exists():
        from tests.real_servers.tiny_llama import write_tiny_llama

        vocab = cache / "ggml-vocab-llama-spm.gguf"
        write_tiny_llama(cache / "gguf-py", vocab, model, q8=q8)
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """A running llama-server: its URL, its log, and readers of its own counters."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    model_name: str
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters and gauges, `llamacpp:` names without labels."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name.split("{")[0]] = float(value)
        return values

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def decode_times_ms(self) -> list[tuple[float, int]]:
        """Per finished request, the server's own decode time and decoded token count.

        llama-server logs `eval time = T ms / N tokens` for every request it finishes.
        """
        pattern = re.compile(r"^\s*eval time =\s*([\d.]+) ms /\s*(\d+) tokens", re.M)
        return [(float(ms), int(n)) for ms, n in pattern.findall(self.log())]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def client_cores() -> set[int]:
    """The cores a load generator gets when the server has core 0 to itself: every other one
    this process may use (empty on one core, or where affinity cannot be set: not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return set()
    return set(os.sched_getaffinity(0)) - {0}


def start_llama_server(
    tmp_dir: Path, *extra: str, parallel: int = 8, own_core: bool = False, q8: bool = False
) -> LlamaServer:
    """Start llama-server on a free loopback port and wait until /health answers 200.
    own_core: the server's engine loop on core 0 alone, its HTTP threads and the load
    generator (this process's children) on the others, as a GPU's kernels never wait for the
    API server's threads (needs 2 cores). With the whole process on core 0 its engine thread
    was preempted 26,101 times in 240 requests (98 so placed). llama-server's --cpu-range does
    not place the engine thread
    (with --threads 1 ggml computes on the main thread), so the main thread is placed
    after start, the rest having started on the other cores.
    q8: serve the model's Q8_0 weights (tiny_model)."""
    binary = find_or_build_binary()
    model = tiny_model(binary, q8)
    port = free_port()
    log_path = tmp_dir / f"llama-server-{port}.log"
    others = client_cores() if own_core else set()
    pinned = bool(others)
    args = [
        str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(parallel), "-cb", "--metrics", "-c", str(512 * parallel),
        "--threads", "1", "--alias", "tiny-llama", *extra,
    ]  # fmt: skip
    log = log_path.open("w")
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=(lambda: os.sched_setaffinity(0, others)) if pinned else None,
    )  # fmt: skip
    server = LlamaServer(proc, port, log_path, "tiny-llama", args)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}:\n{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as resp:
                if resp.status == 200:
                    if pinned:  # the main thread alone (its id is the process's)
                        os.sched_setaffinity(proc.pid, {0})
                    return server
        except OSError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(
        f"llama-server not healthy in {START_TIMEOUT_S:.0f} s:\n{server.log()[-3000:]}"
    )


def unavailable(reason: str) -> None:
    """Skip, or under CI fail: CI must run the real-server tests, not skip them."""
    if os.environ.get("CI"):
        pytest.fail(f"real server unavailable under CI: {reason}")
    pytest.skip(f"real server unavailable: {reason}")


def llama_server_fixture(tmp_path_factory, *extra: str) -> Iterator[LlamaServer]:
    try:
        server = start_llama_server(tmp_path_factory.mktemp("llama"), *extra)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable(str(exc))
    yield server
    server.stop()
