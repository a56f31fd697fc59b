"""One engine process: started in its own process group, polled until healthy, stopped whole.

An engine (vLLM, SGLang) forks workers; stopping only the process we started would leave
them holding the GPU and the port. So the engine starts in a new session (its own process
group) and `stop` signals the group: SIGTERM, then SIGKILL after a grace period. The log goes
to a file; `tail()` reads its end for a launch that failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

TAIL_LINES = 40
POLL_S = 0.25


class LaunchError(RuntimeError):
    """The engine exited or never answered its health check; `tail` is its log's end."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


def free_port() -> int:
    """A loopback port free now (the engine binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail_of(path: Path, lines: int = TAIL_LINES, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a log file (reading at most its last `max_bytes`)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def engine_version(argv: list[str] | None, timeout_s: float = 60.0) -> str | None:
    """The first line of the version command's output that names a version (else its first
    line); None when there is no command or it cannot run."""
    if not argv:
        return None
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (out.stdout + "\n" + out.stderr).splitlines() if ln.strip()]
    named = [ln for ln in lines if "version" in ln.lower()]
    return (named or lines or [None])[0]


class EngineProcess:
    """A started engine. Use as a context manager: leaving it stops the process group,
    whatever happened inside (an error, Ctrl-C)."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=env,
                )  # fmt: skip
            except OSError as exc:
                raise LaunchError(f"cannot start {argv[0]!r}: {exc}", "") from None
        self.pgid = self.proc.pid  # a new session's leader leads its own process group

    def tail(self, lines: int = TAIL_LINES) -> str:
        return tail_of(self.log_path, lines)

    def wait_healthy(
        self, url: str, timeout_s: float, stop_event: threading.Event | None = None
    ) -> float:
        """Poll `url` until it answers 2xx; the seconds it took. Raises LaunchError when the
        engine exits, the timeout passes or `stop_event` is set."""
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(
                    f"the engine exited with status {code} before it was healthy", self.tail()
                )
            if stop_event is not None and stop_event.is_set():
                raise LaunchError("stopped before the engine was healthy", self.tail())
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if 200 <= resp.status < 300:
                        return time.monotonic() - start
            except (urllib.error.URLError, OSError, ValueError):
                pass  # not listening yet, or 503 while loading the model
            if time.monotonic() - start > timeout_s:
                raise LaunchError(f"{url} did not answer 2xx within {timeout_s:g} s", self.tail())
            time.sleep(POLL_S)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`; the
        leader's exit status. Safe to call twice."""
        if not _signal_group(self.pgid, signal.SIGTERM):
            return self.proc.poll() if self.proc.poll() is not None else self.proc.wait()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(self.pgid):
            if self.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=POLL_S)
            else:
                time.sleep(POLL_S)  # the leader is gone; its children may still be exiting
        _signal_group(self.pgid, signal.SIGKILL)
        return self.proc.wait()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)
