"""The service under hostile and busy clients: the figures of issue 18, measured and printed.

1. memory: four unauthenticated 100 MB POSTs at /api/jobs; the service's peak RSS (VmHWM)
   before and after. With the body read before authentication it took ~1 GB.
2. isolation: a background run against a server whose TTFT is known (tests/fake_openai_server.py,
   50 ms) while 50 API clients read the service as fast as they can; the stored run's TTFT
   p99 against the same run with no readers, and against the server's truth.

    python benchmarks/service_isolation.py [memory|isolation|both] [--code DIR]

--code DIR runs the service from another checkout (e.g. /work/main) for a before/after.
Everything talks to 127.0.0.1 only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(code: Path, db: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code), "TOKENBENCH_API_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "serve", "--db", db, "--port", str(port),
         "--log-level", "warning"],
        env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/api/runs", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"service did not start: {proc.stderr.read().decode()[-2000:]}")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post_unauthenticated(url: str, size: int) -> str:
    """POST `size` bytes of JSON-ish body without a token; the status line, or the error."""
    host, port = url.removeprefix("http://").split(":")
    chunk = b"x" * (1 << 20)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(
            f"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
        )
        try:
            for _ in range(size // len(chunk)):
                s.sendall(chunk)
        except OSError as exc:  # the service answered and closed without reading it all
            pass_exc = exc
        else:
            pass_exc = None
        try:
            line = s.recv(200).split(b"\r\n")[0].decode()
        except OSError as exc:
            line = f"no answer ({exc})"
    return line + (f" (sending stopped: {pass_exc.strerror})" if pass_exc else "")


def memory(code: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_service(code, f"{tmp}/m.db")
        try:
            before = rss_mb(proc.pid)
            lines = [post_unauthenticated(url, 100 << 20) for _ in range(4)]
            time.sleep(0.5)
            print(f"[memory] code={code}")
            print(f"  RSS before {before:.0f} MB; after 4 x 100 MB unauthenticated POSTs: "
                  f"RSS {rss_mb(proc.pid):.0f} MB, peak {rss_mb(proc.pid, 'VmHWM'):.0f} MB")  # fmt: skip
            print(f"  answers: {sorted(set(lines))}")
        finally:
            proc.terminate()
            proc.wait(10)


async def readers(url: str, n: int, stop: asyncio.Event, counts: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:

        async def one() -> None:
            while not stop.is_set():
                for path in ("/api/runs", "/api/jobs", "/api/prices"):
                    try:
                        await c.get(path)
                        counts[0] += 1
                    except httpx.HTTPError:
                        counts[1] += 1

        await asyncio.gather(*(one() for _ in range(n)))


def run_job(url: str, target: str, db: str, n_readers: int) -> dict:
    scenario = "load: {shape: poisson, request_rate: 20, num_prompts: 400}\n"
    scenario += "workload: {input: {mean: 64}, output: {mean: 16}}\n"
    body = {"kind": "run", "scenario": scenario, "target": {"base_url": target},
            "label": f"{n_readers} readers"}  # fmt: skip
    auth = {"Authorization": f"Bearer {TOKEN}"}
    job = httpx.post(f"{url}/api/jobs", json=body, headers=auth, timeout=30).json()

    async def main() -> list[int]:
        stop = asyncio.Event()
        counts = [0, 0]
        task = asyncio.ensure_future(readers(url, n_readers, stop, counts)) if n_readers else None
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            for _ in range(1200):  # at most ~10 min
                state = (await c.get(f"/api/jobs/{job['id']}")).json()
                if state["status"] not in ("queued", "running"):
                    break
                await asyncio.sleep(0.5)
        stop.set()
        if task is not None:
            await task
        return counts

    counts = asyncio.run(main())
    state = httpx.get(f"{url}/api/jobs/{job['id']}", timeout=30).json()
    run = httpx.get(f"{url}/api/runs/{state['run_id']}", timeout=30).json()
    lp = run["load_points"][0]["summary"]
    return {
        "readers": n_readers,
        "reads_done": counts[0],
        "p50_ttft_ms": round(lp["metrics"]["ttft_ms"]["p50"], 1),
        "p99_ttft_ms": round(lp["metrics"]["ttft_ms"]["p99"], 1),
        "p99_itl_ms": round(lp["metrics"]["itl_ms"]["p99"], 2),
        "client_limited": lp.get("client_limited"),
        "completed": lp["completed"],
        "measured_in": (run.get("extra") or {}).get("measured_in"),
    }


def isolation(code: Path, n_readers: int = 50) -> None:
    fake = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fake_openai_server.py"), "--port", "0",
         "--ttft-ms", "50", "--itl-ms", "10"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    target = f"http://127.0.0.1:{int(fake.stdout.readline().split()[1])}"
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_service(code, f"{tmp}/i.db")
        try:
            print(f"[isolation] code={code}; server truth: TTFT 50 ms (+ network, parsing)")
            for n in (0, n_readers):
                out = run_job(url, target, f"{tmp}/i.db", n)
                print("  " + json.dumps(out, default=str))
        finally:
            proc.terminate()
            proc.wait(30)
            fake.terminate()
            fake.wait(10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="?", default="both", choices=("memory", "isolation", "both"))
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose service to run")
    p.add_argument("--readers", type=int, default=50, help="API clients reading during a run")
    args = p.parse_args()
    if args.what in ("memory", "both"):
        memory(args.code.resolve())
    if args.what in ("isolation", "both"):
        isolation(args.code.resolve(), args.readers)


if __name__ == "__main__":
    main()
