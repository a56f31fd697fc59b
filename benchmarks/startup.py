"""How fast tokenbench starts: CPU of `tokenbench --help`, and how long after `tokenbench run`
starts its first request reaches the server.

    python benchmarks/startup.py [--repeats 7]

Targets (issue 14): `--help` under 0.3 s of CPU (user + system of the whole process), and a
`run`'s first request within 0.5 s of the process starting, on an idle machine. The first
figure is the CPU the child used (os.wait4); the second is the server's clock at the first
POST minus the parent's clock just before it started the process (CLOCK_MONOTONIC, the same
clock in both processes on Linux), and, read from /proc at that same moment, the CPU the
process had used by then: on a busy machine the wall time grows with the load, the CPU time
does not, and on an idle machine the two are close. The server is a stub in this process
that answers every completion with one token at once, so what is measured is tokenbench's
own start: imports, scenario, plan, database, connection. Server telemetry is off
(--no-scrape-metrics): with it on, one baseline scrape of /metrics (and importing httpx)
precedes the first request by design. Prints medians and the spread; the load average says
how idle the machine was.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SSE = (
    b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi",'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":8,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


class StubServer:
    """Answers GET /v1/models and POST completions (one token); notes the first POST's time."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.first_post_ns: int | None = None
        self.first_post_cpu_s: float | None = None
        self.pid: int | None = None  # the client process, whose CPU is read at the first POST
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.first_post_ns = None
            self.first_post_cpu_s = None
            self.pid = None

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method = lines[0].split(b" ")[0]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                if method == b"POST":
                    now = time.monotonic_ns()
                    with self.lock:
                        if self.first_post_ns is None:
                            self.first_post_ns = now
                            self.first_post_cpu_s = cpu_seconds(self.pid)
                    chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SSE), SSE)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + chunk
                    )
                else:
                    body = b'{"object":"list","data":[{"id":"stub","object":"model"}]}'
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU a live process has used so far (/proc/PID/stat, 10 ms ticks)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}


def help_cpu_s() -> float:
    """CPU seconds (user + system) of one `python -m bench --help`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "--help"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
        cwd=ROOT,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tokenbench --help exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def first_request_s(server: StubServer, db: str) -> tuple[float, float]:
    """Seconds from starting `tokenbench run` to its first request at the server, and the
    CPU seconds the process had used by then."""
    server.reset()
    args = [sys.executable, "-m", "bench", "run", "--base-url", f"http://127.0.0.1:{server.port}",
            "--model", "stub", "--num-prompts", "1", "--random-input-len", "8",
            "--random-output-len", "1", "--no-scrape-metrics", "--disable-tqdm", "--db", db]  # fmt: skip
    start = time.monotonic_ns()
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT
    )
    server.pid = proc.pid
    _, stderr = proc.communicate(timeout=60)
    if proc.returncode != 0 or server.first_post_ns is None:
        raise SystemExit(f"tokenbench run failed ({proc.returncode}): {stderr[-2000:]}")
    return (server.first_post_ns - start) / 1e9, server.first_post_cpu_s or math.nan


def describe(name: str, values: list[float], target: float) -> str:
    med = statistics.median(values)
    verdict = "met" if med < target else "NOT met"
    return (
        f"{name}: median {med:.3f} s (min {min(values):.3f}, max {max(values):.3f}, "
        f"n={len(values)}); target < {target} s: {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    helps = [help_cpu_s() for _ in range(args.repeats)]
    print(describe("tokenbench --help CPU", helps, 0.3))
    server = StubServer()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/startup.db"
        first_request_s(server, db)  # the first run creates the database's schema
        firsts = [first_request_s(server, db) for _ in range(args.repeats)]
    print(describe("tokenbench run: start -> first request (wall)", [w for w, _ in firsts], 0.5))
    print(describe("  CPU used by the first request", [c for _, c in firsts], 0.5))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
