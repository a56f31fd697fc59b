"""Load-generator capacity: how many streamed tokens/s tokenbench times honestly (issue 10).

A benchmark, not a test. It starts benchmarks/stream_server.js (Node's http module: cheaper
per token than any Python client, so the client is what is measured), which streams one
token per SSE chunk at exact TTFT and inter-token delays and records when it really wrote
every chunk. Each client is then driven in a closed loop at concurrency C and compared
against that record:

- sustained tok/s: tokens the server streamed per second in the middle 60% of the point
  (ramp-up and tail left out), the same yardstick for every client;
- CPU s/Mtok and peak RSS of the client's whole process tree, sampled from /proc;
- TTFT and ITL error: the client's reported p50/p99 minus the server's truth p50/p99;
- send lag p99 and client_limited (tokenbench's own self-check);
- server lateness p99: how far the server itself fell behind its schedule.

Peers (guidellm, aiperf, inference-perf, `vllm bench serve`: PEERS) are installed from
PyPI on first use, each into its own venv under benchmarks/.venvs (git-ignored), and run at
the same points against the same server in the same run; one that cannot be installed is
reported as NOT MEASURED with the reason, beside the results.

    python benchmarks/loadgen.py --quick          # a few minutes
    python benchmarks/loadgen.py --json out.json  # the full grid
    python benchmarks/loadgen.py compare          # 1-, 4- and 128-token outputs, every peer
    python benchmarks/loadgen.py short            # requests/s for 1-4-token outputs
    python benchmarks/loadgen.py memory --concurrency 64,256,1024   # bytes per in-flight request
    python benchmarks/loadgen.py rss              # peak RSS of the runner and `tokenbench run`
    python benchmarks/loadgen.py peers            # install the peers now
    python benchmarks/loadgen.py agentic          # CPU/request: agentic trace vs random

Only 127.0.0.1 is contacted; every server and client started here is killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER_JS = HERE / "stream_server.js"
VENVS = HERE / ".venvs"
MODEL = "bench-model"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Peer:
    """A peer load generator as PyPI ships it: what to pip-install, the console script it
    brings, and the lowest Python its Requires-Python accepts (inference-perf wants 3.12)."""

    requirement: str
    exe: str
    min_python: tuple[int, int] = (3, 10)


PEERS = {
    "guidellm": Peer("guidellm==0.8.1", "guidellm"),
    "aiperf": Peer("aiperf==0.13.0", "aiperf"),
    "inference-perf": Peer("inference-perf==0.7.0", "inference-perf", (3, 12)),
    # `vllm bench serve`: vLLM's own client, shipped inside the whole engine (torch included)
    "vllm": Peer("vllm==0.34.0", "vllm"),
}


# ---------------------------------------------------------------- the server


class StreamServer:
    """benchmarks/stream_server.js in a subprocess; its stdin closing also stops it."""

    def __init__(self, ttft_ms: float, itl_ms: float) -> None:
        node = shutil.which("node")
        if node is None:
            raise SystemExit(
                "node (v18+) is needed for the benchmark server: apt-get install nodejs"
            )
        self.ttft_ms, self.itl_ms = ttft_ms, itl_ms
        self.proc = subprocess.Popen(
            [
                node,
                str(SERVER_JS),
                "--port",
                "0",
                "--ttft-ms",
                str(ttft_ms),
                "--itl-ms",
                str(itl_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise SystemExit(f"benchmark server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def reset(self) -> None:
        self._get("/_truth/reset")

    def truth(self) -> dict:
        return json.loads(self._get("/_truth"))

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------- process-tree sampling


def _tree(root: int) -> list[int]:
    """root and all its descendants, from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _cpu_rss(pids: list[int]) -> tuple[float, int]:
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
        rss += int(fields[21]) * PAGE
    return cpu, rss


class TreeSampler:
    """Samples (monotonic ns, CPU s, RSS bytes) of a process tree every `interval_s`."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[int, float, int]] = []
        self.processes = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _tree(self.pid)
            self.processes = max(self.processes, len(pids))
            cpu, rss = _cpu_rss(pids)
            self.samples.append((time.monotonic_ns(), cpu, rss))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, start_ns: int, end_ns: int) -> float:
        """Tree CPU seconds spent between two monotonic instants (nearest samples)."""
        if not self.samples:
            return float("nan")
        t = np.array([s[0] for s in self.samples])
        cpu = np.maximum.accumulate(np.array([s[1] for s in self.samples]))
        i = int(np.clip(np.searchsorted(t, start_ns), 0, len(t) - 1))
        j = int(np.clip(np.searchsorted(t, end_ns), 0, len(t) - 1))
        return float(cpu[j] - cpu[i])

    @property
    def peak_rss(self) -> int:
        return max((s[2] for s in self.samples), default=0)


# ---------------------------------------------------------------- one measured point


@dataclass
class Point:
    """One client at one (ITL, C): its reports next to the server's truth."""

    client: str
    itl_ms: float
    concurrency: int
    ok: bool = True
    note: str = ""
    tokens_per_s: float = float("nan")  # server-side, steady window
    reported_tokens_per_s: float | None = None
    cpu_s_per_mtok: float = float("nan")
    peak_rss_mb: float = float("nan")
    processes: int = 0
    ttft_err_ms: tuple[float, float] = (float("nan"), float("nan"))  # p50, p99
    itl_err_ms: tuple[float, float] = (float("nan"), float("nan"))
    reported: dict = field(default_factory=dict)
    truth: dict = field(default_factory=dict)
    send_lag_p99_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    client_limited: bool | None = None
    server_late_p99_ms: float = float("nan")
    machine_busy: float = float("nan")  # share of the point some task waited for a CPU (PSI)
    # tokenbench only, matched request by request on the host's monotonic clock: its first
    # token's time minus when the server wrote it (p50, p99), and how long requests took
    # from the client's send to the server's read of them (p99: the server's own queue)
    stamp_err_ms: tuple[float, float] = (float("nan"), float("nan"))
    input_delay_p99_ms: float = float("nan")
    matched: int = 0


def steady_rate(truth: dict, keep: float = 0.6) -> float:
    """Tokens/s the server streamed in the middle `keep` of its busy span (no ramp, no tail)."""
    hist = truth.get("hist") or []
    if not hist:
        return 0.0
    bucket_s = int(truth["bucket_ns"]) / 1e9
    counts = np.zeros(hist[-1][0] + 1)
    for b, c in hist:
        counts[b] = c
    n = len(counts)
    lo, hi = int(n * (1 - keep) / 2), max(int(n * (1 + keep) / 2), int(n * (1 - keep) / 2) + 1)
    return float(counts[lo:hi].sum() / ((hi - lo) * bucket_s))


def truth_stats(truth: dict) -> dict:
    ttft, itl, late = (np.asarray(truth[k]) for k in ("ttft_ms", "itl_ms", "late_ms"))
    pct = lambda a, p: float(np.percentile(a, p)) if a.size else float("nan")  # noqa: E731
    return {
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "itl_p50": pct(itl, 50),
        "itl_p99": pct(itl, 99),
        "late_p99": pct(late, 99),
        "streams": truth["streams"],
        "tokens": truth["tokens"],
    }


def measure(
    server: StreamServer,
    client: str,
    concurrency: int,
    cmd: list[str],
    *,
    timeout_s: float,
    parse: Callable[[subprocess.CompletedProcess, Path], dict],
    prepare: Callable[[Path], None] | None = None,
    env: dict | None = None,
) -> Point:
    """Run one client command against a freshly reset server and compare with its truth."""
    point = Point(client=client, itl_ms=server.itl_ms, concurrency=concurrency)
    server.reset()
    workdir = Path(tempfile.mkdtemp(prefix=f"loadgen-{client}-"))
    cmd = [c.replace("{OUT}", str(workdir)) for c in cmd]
    if prepare is not None:
        prepare(workdir)
    pressure0 = _cpu_pressure()
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            point.note = f"timed out after {timeout_s:.0f} s; "
        finally:
            sampler.stop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # stray workers of a peer
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        truth = server.truth()
        if not truth["streams"]:
            point.ok = False
            point.note += f"no stream completed (rc {proc.returncode}): {_tail(err or out)}"
            return point
        try:
            rep = parse(done, workdir)
        except Exception as exc:  # a peer's output format we did not expect
            point.ok = False
            point.note += f"could not read its results ({exc!r}): {_tail(err or out)}"
            return point
        ts = truth_stats(truth)
        point.truth, point.reported = ts, rep
        point.tokens_per_s = steady_rate(truth)
        point.reported_tokens_per_s = rep.get("tokens_per_s")
        first, last = int(truth["first_arrival_ns"]), int(truth["last_send_ns"])
        point.cpu_s_per_mtok = sampler.cpu_between(first, last) / max(1, ts["tokens"]) * 1e6
        point.peak_rss_mb = sampler.peak_rss / 2**20
        point.processes = sampler.processes
        err = lambda key: _num(rep[key]) - ts[key]  # noqa: E731 - None (no ITL: 1 token) -> nan
        point.ttft_err_ms = (err("ttft_p50"), err("ttft_p99"))
        point.itl_err_ms = (err("itl_p50"), err("itl_p99"))
        point.send_lag_p99_ms = rep.get("send_lag_p99")
        point.loop_lag_p99_ms = rep.get("loop_lag_p99")
        point.client_limited = rep.get("client_limited")
        point.server_late_p99_ms = ts["late_p99"]
        point.machine_busy = _cpu_pressure_since(pressure0)
        match_first_tokens(point, rep.pop("first_tokens", None), truth)
        return point
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def match_first_tokens(point: Point, ours: list | None, truth: dict) -> None:
    """Pair the client's first tokens with the server's writes of them (same host, same
    clock): the error of each first-token timestamp, free of the server's own queueing.

    The server's TTFT starts when it reads the request; when a wave of requests lands at
    once it reads them one after another, so its TTFT misses that wait, which every client
    sees. Matched per request, the client's error is its first token's time minus the
    server's write of it, whatever the server did before."""
    if not ours or not truth.get("first_tokens"):
        return
    t0 = int(truth["t0_ns"])
    theirs = {key: (arrival, first) for key, arrival, first in truth["first_tokens"]}
    errors, delays = [], []
    for key, sent, first_token in ours:
        if key in theirs:
            arrival, first = theirs[key]
            errors.append(first_token - (t0 + first))
            delays.append((t0 + arrival) - sent)
    if not errors:
        return
    err = np.asarray(errors, dtype=np.float64) / 1e6
    point.stamp_err_ms = (float(np.percentile(err, 50)), float(np.percentile(err, 99)))
    point.input_delay_p99_ms = float(np.percentile(np.asarray(delays) / 1e6, 99))
    point.matched = len(errors)


def _cpu_pressure() -> tuple[int, int] | None:
    """(monotonic us, PSI 'some' total us): how long runnable tasks waited for a CPU."""
    try:
        with open("/proc/pressure/cpu") as f:
            total = int(f.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None
    return time.monotonic_ns() // 1000, total


def _cpu_pressure_since(start: tuple[int, int] | None) -> float:
    """Share of wall time since `start` in which some task waited for a CPU (0..1): other
    engineers' work on this shared 2-core machine shows up here, beside every point."""
    end = _cpu_pressure()
    if start is None or end is None or end[0] <= start[0]:
        return float("nan")
    return (end[1] - start[1]) / (end[0] - start[0])


def _num(value: float | None) -> float:
    return float("nan") if value is None else value


def _tail(text: str, n: int = 300) -> str:
    return " ".join((text or "").split())[-n:]


# ---------------------------------------------------------------- tokenbench


def tokenbench_cmd(
    url: str,
    concurrency: int,
    duration_s: float,
    out_len: int,
    transport: str,
    ramp_up_s: float = 0.0,
) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "worker",
        "--url",
        url,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration_s),
        "--out-len",
        str(out_len),
        "--transport",
        transport,
        "--ramp-up",
        str(ramp_up_s),
    ]


def parse_tokenbench(done: subprocess.CompletedProcess, _workdir: Path) -> dict:
    if done.returncode != 0:
        raise RuntimeError(f"worker exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(args: argparse.Namespace) -> None:
    """Run tokenbench in this process (as `tokenbench run` would) and print its figures."""
    sys.path.insert(0, str(ROOT))
    from bench.backends.dialects import get_dialect
    from bench.executor import RunPlan
    from bench.metrics import summarize
    from bench.runner import run_blocking
    from bench.workload import LengthDist, Workload

    c, out_len = args.concurrency, args.out_len
    per_request_s = 0.1 + out_len * 0.005
    n = int(c * (args.duration / per_request_s + 2))
    workload = Workload(seed=1, input=LengthDist(mean=32), output=LengthDist(mean=out_len))
    plan = RunPlan(
        base_url=args.url,
        endpoint="/v1/completions",
        dialect=get_dialect("vllm"),
        model=MODEL,
        workload=workload,
        specs=workload.specs(n),
        concurrency=c,
        duration_s=args.duration,
        request_timeout_s=120,
        transport=args.transport,
        ramp_up_s=args.ramp_up,
    )
    result = run_blocking(plan, handle_sigint=False)
    # Each request's send and first-token times on this host's CLOCK_MONOTONIC, keyed as
    # the server keys its own record (md5 of the prompt), so the two can be matched.
    by_index = {spec.index: spec for spec in plan.specs}
    first_tokens = [
        [
            hashlib.md5(workload.render(by_index[r.index])[0].encode()).hexdigest(),
            result.t0_ns + r.sent_ns,
            result.t0_ns + r.first_token_ns,
        ]
        for r in result.records
        if r.ok and r.first_token_ns is not None
    ]
    s = summarize(
        result.records,
        duration_s=result.duration_s,
        loop_lag_p99_ms=result.loop_lag_p99_ms,
        loop_cpu_share=result.loop_cpu_share,
        late_read_share=result.late_read_share,
        merged_token_share=result.merged_token_share,
    )
    m = s.metrics
    print(
        json.dumps(
            {
                "tokens_per_s": s.output_tokens_per_s,
                "ttft_p50": m["ttft"].percentiles["p50"],
                "ttft_p99": m["ttft"].percentiles["p99"],
                "itl_p50": m["itl"].percentiles["p50"],
                "itl_p99": m["itl"].percentiles["p99"],
                "send_lag_p99": s.send_lag_ms["p99"],
                "loop_lag_p99": result.loop_lag_p99_ms,
                "loop_cpu_share": result.loop_cpu_share,
                "late_read_share": result.late_read_share,
                "merged_token_share": result.merged_token_share,
                "client_limited": s.client_limited,
                "reasons": s.client_limited_reasons,
                "completed": s.completed,
                "failed": s.failed,
                "errors": s.errors,
                "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "first_tokens": first_tokens,
            }
        )
    )


# ---------------------------------------------------------------- peers


def python_for(peer: Peer) -> str | None:
    """An interpreter new enough for `peer`: this one, else python3.N on PATH or under pyenv,
    each tried (a pyenv shim on PATH may name a version it will not run)."""
    if sys.version_info[:2] >= peer.min_python:
        return sys.executable
    major, lowest = peer.min_python
    pyenv = Path.home() / ".pyenv" / "versions"
    for minor in range(lowest, lowest + 4):  # bounded: 4 versions
        name = f"python{major}.{minor}"
        found = [shutil.which(name), *sorted(map(str, pyenv.glob(f"{major}.{minor}.*/bin/{name}")))]
        for candidate in filter(None, found):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                if (
                    subprocess.run(
                        [candidate, "-c", ""], capture_output=True, timeout=60
                    ).returncode
                    == 0
                ):
                    return candidate
    return None


def ensure_peer(name: str) -> Path | str:
    """The peer's venv under benchmarks/.venvs, created and filled from PyPI on first use.

    A string instead says why it is not available (no such peer, no Python new enough, pip
    failed: see its log); the caller reports it beside the results, never drops it silently.
    """
    peer = PEERS.get(name)
    if peer is None:
        return f"unknown peer {name!r} (known: {', '.join(PEERS)})"
    venv = VENVS / name
    exe = venv / "bin" / peer.exe
    if exe.exists():
        return venv
    python = python_for(peer)
    if python is None:
        need = ".".join(map(str, peer.min_python))
        return f"{peer.requirement} needs Python >= {need}; no python{need}+ on PATH or under pyenv"
    VENVS.mkdir(parents=True, exist_ok=True)
    log = VENVS / f"{name}-install.log"
    print(
        f"{name} is not installed: installing {peer.requirement} from PyPI into {venv} "
        f"with {python} (log: {log}){'; it brings torch: several GB' if name == 'vllm' else ''} ...",
        flush=True,
    )
    with open(log, "w") as out:
        try:
            ok = (
                subprocess.run(
                    [python, "-m", "venv", str(venv)], stdout=out, stderr=out, timeout=300
                ).returncode
                == 0
                and subprocess.run(
                    [str(venv / "bin" / "pip"), "install", "-q", peer.requirement],
                    stdout=out,
                    stderr=out,
                    timeout=3600,
                ).returncode
                == 0
            )
        except subprocess.TimeoutExpired as exc:
            print(f"timed out after {exc.timeout:.0f} s: {exc.cmd}", file=out)
            ok = False
    if not ok or not exe.exists():
        shutil.rmtree(venv, ignore_errors=True)  # a half-made venv is retried next time
        return f"could not install {peer.requirement}: {_tail(log.read_text(), 200)} (log: {log})"
    return venv


def ensure_peers(names: list[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """(installed peers' venvs, peers not available with the reason), each one printed."""
    ready, missing = {}, {}
    for name in names:
        got = ensure_peer(name)
        if isinstance(got, Path):
            ready[name] = got
        else:
            missing[name] = got
            print(f"NOT MEASURED {name}: {got}", flush=True)
    return ready, missing


_TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["[UNK]", "[PAD]"] + [f"w{i}" for i in range(2000)]
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(
    sys.argv[1]
)
"""


def local_tokenizer(name: str, venv: Path) -> Path:
    """A tiny local word-level tokenizer, built with the peer's own transformers: aiperf,
    inference-perf and vllm bench need one, and nothing here may download one."""
    path = VENVS / "tokenizer"
    if not (path / "tokenizer.json").exists():
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", _TOKENIZER_SCRIPT, str(path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name}: cannot build a local tokenizer: {_tail(done.stderr)}")
    return path


def peer_request_count(c: int, duration_s: float, out_len: int) -> int:
    """Requests for a peer that takes a count, not a duration (inference-perf's concurrent
    load, vllm bench): a quarter of what the ideal rate (TTFT 100 ms, ITL 10 ms) would send
    in duration_s, and at least two per user. The full count at 1 token is ~46 per user in
    5 s, which a peer running far below the ideal rate took longer than its timeout to send."""
    per_request_s = 0.1 + out_len * 0.01
    return int(c * max(2.0, duration_s / per_request_s / 4))


def peer_run(
    name: str, venv: Path, url: str, c: int, duration_s: float, out_len: int
) -> tuple[list[str], Callable[[Path], None] | None, Callable]:
    """(command, prepare, parse) for one peer at one point, as close to ours as it allows:
    closed loop at concurrency c for duration_s, /v1/completions, 32 tokens in, out_len out."""
    if name == "guidellm":
        rows = int(c * (duration_s / 0.6 + 4))

        def prepare(workdir: Path) -> None:
            with open(workdir / "data.jsonl", "w") as f:
                for i in range(rows):
                    prompt = " ".join(f"w{(i * 7 + k) % 2000}" for k in range(32))
                    f.write(json.dumps({"prompt": prompt, "output_tokens_count": out_len}) + "\n")

        cmd = [
            str(venv / "bin" / "guidellm"),
            "run",
            "--backend",
            f"kind=openai_http,target={url},request_format=/v1/completions,model={MODEL}",
            "--profile",
            f"kind=concurrent,streams={c}",
            "--constraint",
            f"kind=max_duration,seconds={duration_s:g}",
            "--data",
            "kind=json_file,path={OUT}/data.jsonl",
            "--output",
            "kind=json,path={OUT}/out.json",
            "--disable-console-interactive",
        ]
        return cmd, prepare, parse_guidellm
    if name == "aiperf":
        tok = local_tokenizer(name, venv)
        cmd = [
            str(venv / "bin" / "aiperf"),
            "profile",
            "--model",
            MODEL,
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--concurrency",
            str(c),
            "--benchmark-duration",
            f"{duration_s:g}",
            "--isl",
            "32",
            "--osl",
            str(out_len),
            "--tokenizer",
            str(tok),
            "--artifact-dir",
            "{OUT}/aout",
            "--ui-type",
            "none",
        ]
        return cmd, None, parse_aiperf
    if name == "inference-perf":
        tok = local_tokenizer(name, venv)
        n = peer_request_count(c, duration_s, out_len)
        fixed = lambda length: {  # noqa: E731 - one length, as the others get
            "min": length, "max": length, "mean": length, "std_dev": 0, "total_count": n
        }  # fmt: skip
        config = {
            "load": {
                "type": "concurrent",
                "stages": [{"num_requests": n, "concurrency_level": c}],
                # its default: one worker process per CPU, each holding at most 100 requests
                "worker_max_concurrency": max(100, c),
            },
            "api": {"type": "completion", "streaming": True},
            "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(tok)},
            "data": {
                "type": "random",
                "input_distribution": fixed(32),
                "output_distribution": fixed(out_len),
            },
            "report": {"request_lifecycle": {"summary": True, "per_stage": False}},
            "storage": {"local_storage": {"path": "{OUT}/reports"}},
        }

        def prepare(workdir: Path) -> None:
            text = json.dumps(config).replace("{OUT}", str(workdir))
            (workdir / "config.yml").write_text(text)  # JSON is YAML

        cmd = [str(venv / "bin" / "inference-perf"), "--config_file", "{OUT}/config.yml"]
        return cmd, prepare, parse_inference_perf
    if name == "vllm":
        tok = local_tokenizer(name, venv)
        cmd = [
            str(venv / "bin" / "vllm"),
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            MODEL,
            "--tokenizer",
            str(tok),
            "--dataset-name",
            "random",
            "--random-input-len",
            "32",
            "--random-output-len",
            str(out_len),
            "--ignore-eos",
            # no duration flag: as many requests as the others send in duration_s
            "--num-prompts",
            str(peer_request_count(c, duration_s, out_len)),
            "--max-concurrency",
            str(c),
            "--percentile-metrics",
            "ttft,itl",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--result-dir",
            "{OUT}",
            "--result-filename",
            "out.json",
            "--disable-tqdm",
        ]
        return cmd, None, parse_vllm
    raise ValueError(name)


def parse_inference_perf(_done: subprocess.CompletedProcess, workdir: Path) -> dict:
    """Its summary report (times in seconds); its ITL is per chunk, as tokenbench's."""
    found = sorted(workdir.glob("reports/**/summary_lifecycle_metrics.json"))
    d = json.loads(found[0].read_text())["successes"]
    lat = d["latency"]
    ms = lambda m, p: None if lat.get(m) is None else 1e3 * lat[m][p]  # noqa: E731 - 1 token: no ITL
    return {
        "tokens_per_s": d["throughput"]["output_tokens_per_sec"],
        "ttft_p50": ms("time_to_first_token", "median"),
        "ttft_p99": ms("time_to_first_token", "p99"),
        "itl_p50": ms("inter_token_latency", "median"),
        "itl_p99": ms("inter_token_latency", "p99"),
    }


def parse_vllm(_done: subprocess.CompletedProcess, workdir: Path) -> dict:
    d = json.loads((workdir / "out.json").read_text())
    return {
        "tokens_per_s": d["output_throughput"],
        "ttft_p50": d["p50_ttft_ms"],
        "ttft_p99": d["p99_ttft_ms"],
        # vLLM's ITL is per chunk, as tokenbench's
        "itl_p50": d["p50_itl_ms"],
        "itl_p99": d["p99_itl_ms"],
    }


def parse_guidellm(_done: subprocess.CompletedProcess, workdir: Path) -> dict:
    m = json.loads((workdir / "out.json").read_text())["benchmarks"][0]["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
    itl = m["inter_token_latency_ms"]["successful"]["percentiles"]
    return {
        "tokens_per_s": m["output_tokens_per_second"]["total"]["mean"],
        "ttft_p50": ttft["p50"],
        "ttft_p99": ttft["p99"],
        # guidellm's ITL is each request's mean gap; it reports no per-chunk figure.
        "itl_p50": itl["p50"],
        "itl_p99": itl["p99"],
    }


def parse_aiperf(_done: subprocess.CompletedProcess, workdir: Path) -> dict:
    d = json.loads((workdir / "aout" / "profile_export_aiperf.json").read_text())
    chunk = d.get("inter_chunk_latency") or {}
    return {
        "tokens_per_s": d["output_token_throughput"]["avg"],
        "ttft_p50": d["time_to_first_token"]["p50"],
        "ttft_p99": d["time_to_first_token"]["p99"],
        # aiperf's ITL is each request's mean gap; its per-chunk gaps are kept alongside.
        "itl_p50": d["inter_token_latency"]["p50"],
        "itl_p99": d["inter_token_latency"]["p99"],
        "chunk_p50": chunk.get("p50"),
        "chunk_p99": chunk.get("p99"),
    }


# ---------------------------------------------------------------- the grid


def run_grid(args: argparse.Namespace) -> list[Point]:
    """Every client at every (ITL, C), side by side against one server per ITL."""
    peers, args.missing_peers = ensure_peers(args.peers)
    points: list[Point] = []
    for itl in args.itl:
        server = StreamServer(args.ttft, itl)
        try:
            for c in args.concurrency:
                for _rep in range(args.repeats):
                    for transport in args.transports:
                        cmd = tokenbench_cmd(
                            server.url, c, args.duration, args.out_len, transport, args.ramp_up
                        )
                        p = measure(
                            server,
                            f"tokenbench-{transport}",
                            c,
                            cmd,
                            timeout_s=args.duration * 4 + 60,
                            parse=parse_tokenbench,
                        )
                        points.append(p)
                        print(_line(p), flush=True)
                    for name, venv in peers.items():
                        try:
                            cmd, prepare, parse = peer_run(
                                name, venv, server.url, c, args.duration, args.out_len
                            )
                        except RuntimeError:
                            continue
                        p = measure(
                            server,
                            name,
                            c,
                            cmd,
                            timeout_s=args.duration * 4 + 120,
                            parse=parse,
                            prepare=prepare,
                        )
                        points.append(p)
                        print(_line(p), flush=True)
        finally:
            server.stop()
    return points


def _line(p: Point) -> str:
    if not p.ok:
        return f"{p.client:18} itl={p.itl_ms:g} C={p.concurrency:<5} FAILED {p.note}"
    return (
        f"{p.client:18} itl={p.itl_ms:g} C={p.concurrency:<5} {p.tokens_per_s:9.0f} tok/s "
        f"cpu {p.cpu_s_per_mtok:6.1f} s/Mtok rss {p.peak_rss_mb:6.0f} MB "
        f"ttft err {p.ttft_err_ms[0]:+7.2f}/{p.ttft_err_ms[1]:+7.2f} "
        f"(1st-token matched {p.stamp_err_ms[0]:+.2f}/{p.stamp_err_ms[1]:+.2f}, "
        f"server input delay p99 {p.input_delay_p99_ms:.2f}) "
        f"itl err {p.itl_err_ms[0]:+6.2f}/{p.itl_err_ms[1]:+6.2f} ms "
        f"send lag p99 {p.send_lag_p99_ms if p.send_lag_p99_ms is not None else float('nan'):6.2f} "
        f"limited={p.client_limited} server late p99 {p.server_late_p99_ms:.1f} ms"
    )


# ---------------------------------------------------------------- the report

# What "timed honestly" means here (issue 10): reported ITL p50 within 0.5 ms and p99 within
# 2 ms of the server's truth, and TTFT p99 within 2 ms.
HONEST_ITL_P50_MS, HONEST_ITL_P99_MS, HONEST_TTFT_P99_MS = 0.5, 2.0, 2.0
PEER_ITL_P50_MS = 1.0  # the peers' bar in the issue: reported ITL p50 within 1 ms


def honest(p: Point) -> bool:
    """TTFT is judged request by request where the client's records could be matched to
    the server's (tokenbench), else by the difference of the p99s (the peers)."""
    ttft_p99_err = p.stamp_err_ms[1] if np.isfinite(p.stamp_err_ms[1]) else p.ttft_err_ms[1]
    return (
        p.ok
        and abs(p.itl_err_ms[0]) <= HONEST_ITL_P50_MS
        and abs(p.itl_err_ms[1]) <= HONEST_ITL_P99_MS
        and abs(ttft_p99_err) <= HONEST_TTFT_P99_MS
    )


def median_points(points: list[Point]) -> list[Point]:
    """One point per (client, ITL, C): the median of each figure over the repeats."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault((p.client, p.itl_ms, p.concurrency), []).append(p)
    out = []
    for (client, itl, c), ps in groups.items():
        good = [p for p in ps if p.ok] or ps

        def med(f: Callable[[Point], float], good: list[Point] = good) -> float:
            return float(np.median([f(p) for p in good]))

        m = Point(client=client, itl_ms=itl, concurrency=c, ok=good[0].ok, note=good[0].note)
        if good[0].ok:
            m.tokens_per_s = med(lambda p: p.tokens_per_s)
            m.cpu_s_per_mtok = med(lambda p: p.cpu_s_per_mtok)
            m.peak_rss_mb = med(lambda p: p.peak_rss_mb)
            m.processes = max(p.processes for p in good)
            m.ttft_err_ms = (med(lambda p: p.ttft_err_ms[0]), med(lambda p: p.ttft_err_ms[1]))
            m.itl_err_ms = (med(lambda p: p.itl_err_ms[0]), med(lambda p: p.itl_err_ms[1]))
            if good[0].send_lag_p99_ms is not None:
                m.send_lag_p99_ms = med(lambda p: p.send_lag_p99_ms)
            if good[0].client_limited is not None:
                flags = [p.client_limited for p in good]
                m.client_limited = sum(flags) * 2 > len(flags)
                m.note = f"limited {sum(flags)}/{len(flags)}" if 0 < sum(flags) < len(flags) else ""
            m.server_late_p99_ms = med(lambda p: p.server_late_p99_ms)
            m.machine_busy = med(lambda p: p.machine_busy)
            m.stamp_err_ms = (med(lambda p: p.stamp_err_ms[0]), med(lambda p: p.stamp_err_ms[1]))
            m.input_delay_p99_ms = med(lambda p: p.input_delay_p99_ms)
            m.matched = min(p.matched for p in good)
        m.reported = {"runs": len(ps), "honest_runs": sum(honest(p) for p in ps)}
        out.append(m)
    return out


def table(points: list[Point]) -> str:
    """A Markdown table, one row per (ITL, C, client), medians over the repeats."""
    head = (
        "| ITL ms | C | client | tok/s | CPU s/Mtok | peak RSS MB (procs) | TTFT err p50/p99 ms "
        "| 1st-token err p50/p99 ms (matched) | server input delay p99 ms "
        "| ITL err p50/p99 ms | send lag p99 ms | client_limited | server late p99 ms | CPU wait |"
    )
    rows = [head, "|" + "---|" * 14]
    for p in sorted(points, key=lambda p: (-p.itl_ms, p.concurrency, p.client)):
        if not p.ok:
            rows.append(
                f"| {p.itl_ms:g} | {p.concurrency} | {p.client} | failed: {p.note[:80]} |"
                + " |" * 10
            )
            continue
        lag = "–" if p.send_lag_p99_ms is None else f"{p.send_lag_p99_ms:.2f}"
        matched = (
            f"{p.stamp_err_ms[0]:+.2f} / {p.stamp_err_ms[1]:+.2f} | {p.input_delay_p99_ms:.2f}"
            if np.isfinite(p.stamp_err_ms[1])
            else "– | –"
        )
        lim = "–" if p.client_limited is None else ("**yes**" if p.client_limited else "no")
        rows.append(
            f"| {p.itl_ms:g} | {p.concurrency} | {p.client} | {p.tokens_per_s:,.0f} "
            f"| {p.cpu_s_per_mtok:.1f} | {p.peak_rss_mb:.0f} ({p.processes}) "
            f"| {p.ttft_err_ms[0]:+.2f} / {p.ttft_err_ms[1]:+.2f} | {matched} "
            f"| {p.itl_err_ms[0]:+.2f} / {p.itl_err_ms[1]:+.2f} | {lag} | {lim} "
            f"| {p.server_late_p99_ms:.1f} | {p.machine_busy:.0%} |"
        )
    return "\n".join(rows)


def ratios(points: list[Point]) -> str:
    """tokenbench beside each peer at the same point: tok/s and CPU per token."""
    by = {(p.client, p.itl_ms, p.concurrency): p for p in points if p.ok}
    lines = [
        "| ITL ms | C | peer | tok/s tokenbench ÷ peer | CPU/token peer ÷ tokenbench |",
        "|---|---|---|---|---|",
    ]
    for (client, itl, c), p in sorted(by.items(), key=lambda kv: (-kv[0][1], kv[0][2], kv[0][0])):
        ours = by.get(("tokenbench-raw", itl, c))
        if client.startswith("tokenbench") or ours is None:
            continue
        lines.append(
            f"| {itl:g} | {c} | {client} | {ours.tokens_per_s / p.tokens_per_s:.2f}× "
            f"| {p.cpu_s_per_mtok / ours.cpu_s_per_mtok:.1f}× |"
        )
    return "\n".join(lines)


def verdict(points: list[Point], runs: list[Point] | None = None) -> str:
    """The issue's targets, checked against the medians; the self-check run by run (a
    median of repeats can be honest in one figure and flagged in another)."""
    ours = [p for p in points if p.client == "tokenbench-raw" and p.ok]
    peers = [p for p in points if not p.client.startswith("tokenbench") and p.ok]
    lines = []
    best_ours = max((p.tokens_per_s for p in ours if honest(p)), default=0.0)
    lines.append(
        f"- tokenbench, highest sustained tok/s timed honestly (ITL p50 ±{HONEST_ITL_P50_MS} ms, "
        f"p99 ±{HONEST_ITL_P99_MS} ms, TTFT p99 ±{HONEST_TTFT_P99_MS} ms): {best_ours:,.0f} "
        f"(target ≥ 50,000: {'met' if best_ours >= 50_000 else 'NOT met'})"
    )
    for name in sorted({p.client for p in peers}):
        cap = max(
            (
                p.tokens_per_s
                for p in peers
                if p.client == name and abs(p.itl_err_ms[0]) <= PEER_ITL_P50_MS
            ),
            default=0.0,
        )
        ratio = best_ours / cap if cap else float("inf")
        lines.append(
            f"- {name}, highest sustained tok/s with its reported ITL p50 within {PEER_ITL_P50_MS:g} ms: "
            f"{cap:,.0f}; tokenbench ÷ {name} = {ratio:.1f}× (target ≥ 3×: {'met' if ratio >= 3 else 'NOT met'})"
        )
    checked = [
        p
        for p in (runs if runs is not None else ours)
        if p.client == "tokenbench-raw" and p.ok and p.client_limited is not None
    ]
    right = [p for p in checked if p.client_limited != (not honest(p))]
    lines.append(
        f"- self-check: client_limited agreed with the truth in {len(checked) - len(right)}/"
        f"{len(checked)} {'runs' if runs is not None else 'points'}"
        + (
            ""
            if not right
            else " (wrong at: "
            + ", ".join(
                f"ITL {p.itl_ms:g} C {p.concurrency} flagged={p.client_limited}" for p in right
            )
            + ")"
        )
    )
    return "\n".join(lines)


def describe_machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return (
        f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python "
        f"{platform.python_version()}, node {node}"
    )


# ---------------------------------------------------------------- memory per in-flight request

# Two moments of a request's life: waiting for its first token (3 s TTFT), and mid-stream
# (first token in, the second 3 s away). The tokens' own storage (32 bytes per read) is
# what the budget leaves out; everything else a request holds is counted.
MEMORY_PHASES = {
    "waiting": {"ttft_ms": 3000, "itl_ms": 1, "out_len": 1, "settle_s": 0.5},
    "streaming": {"ttft_ms": 50, "itl_ms": 3000, "out_len": 2, "settle_s": 1.0},
}


def memory(args: argparse.Namespace) -> dict:
    """Bytes per in-flight request at each C, each phase in fresh processes: one traced
    (Python objects, with the lines that allocated them), one untraced (RSS, which tracing
    would inflate with its own bookkeeping)."""
    out: dict = {}
    cases = [(loop, phase) for loop in ("closed", "open") for phase in MEMORY_PHASES]
    for c in args.concurrency or [1024]:
        got: dict = {"concurrency": c}
        for loop, phase in cases:
            for mode in ("trace", "rss"):
                cmd = [sys.executable, str(Path(__file__).resolve()), "memory-one", phase, mode]
                done = subprocess.run(
                    [*cmd, "--loop", loop, "--concurrency", str(c)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if done.returncode != 0:
                    raise SystemExit(
                        f"memory C={c} {loop} {phase} {mode} failed: {_tail(done.stderr)}"
                    )
                got[f"{loop}_{phase}_{mode}"] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"bytes per in-flight request at C={c} (Python objects traced; RSS untraced):")
        for loop, phase in cases:
            traced = got[f"{loop}_{phase}_trace"]
            print(
                f"  {loop:6s} loop, {phase:9s}: Python objects "
                f"{traced['python_bytes_per_request']:6.0f}  "
                f"RSS {got[f'{loop}_{phase}_rss']['rss_bytes_per_request']:6.0f}"
            )
            for line in traced["top"][:8]:
                print(f"      {line['bytes_per_request']:5.0f}  {line['where']}")
        out[str(c)] = got
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


# ---------------------------------------------------------------- whole-process RSS

# The processes whose peak RSS users see: the runner alone (what the grid's RSS column
# measures), `tokenbench run` without a store, and `tokenbench run` writing SQLite.
RSS_PROCESSES = ("runner", "run --no-store", "run, SQLite")


def rss_cmd(kind: str, url: str, c: int, duration_s: float, out_len: int) -> list[str]:
    if kind == "runner":
        return tokenbench_cmd(url, c, duration_s, out_len, "raw")
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "run",
        "--base-url",
        url,
        "--model",
        MODEL,
        "--endpoint",
        "/v1/completions",
        "--concurrency",
        str(c),
        "--duration",
        f"{duration_s:g}",
        "--num-prompts",
        str(c * 100),
        "--random-input-len",
        "32",
        "--random-output-len",
        str(out_len),
        "--random-range-ratio",
        "0",
    ]
    return [*cmd, "--no-store"] if kind == "run --no-store" else [*cmd, "--db", "{OUT}/r.db"]


def rss(args: argparse.Namespace) -> list[dict]:
    """Peak RSS of each process kind at each C (closed loop: C streams in flight), and the
    growth per stream: (peak at C - peak at the smallest C) / (C - smallest C).

    The peak covers the whole run: imports, the C streams in flight, the records of the
    requests finished so far (kept until the point is summarised) and, for `tokenbench
    run`, the summary and telemetry reading after the point; medians over the repeats."""
    server = StreamServer(args.ttft, args.itl)
    rows: list[dict] = []
    try:
        for _rep in range(args.repeats):
            for c in args.concurrency:
                for kind in RSS_PROCESSES:
                    cmd = rss_cmd(kind, server.url, c, args.duration, args.out_len)
                    workdir = Path(tempfile.mkdtemp(prefix="loadgen-rss-"))
                    cmd = [x.replace("{OUT}", str(workdir)) for x in cmd]
                    server.reset()
                    proc = subprocess.Popen(
                        cmd,
                        cwd=workdir,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                        start_new_session=True,
                    )
                    sampler = TreeSampler(proc.pid, interval_s=0.05)
                    try:
                        _, err = proc.communicate(timeout=args.duration * 6 + 120)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        _, err = proc.communicate()
                    finally:
                        sampler.stop()
                        shutil.rmtree(workdir, ignore_errors=True)
                    truth = server.truth()
                    row = {
                        "process": kind,
                        "concurrency": c,
                        "peak_rss_mb": sampler.peak_rss / 2**20,
                        "streams_done": truth["streams"],
                        "rc": proc.returncode,
                    }
                    if proc.returncode != 0:
                        row["error"] = _tail(err)
                    rows.append(row)
                    print(
                        f"{kind:15} C={c:<5} peak RSS {row['peak_rss_mb']:6.1f} MB, "
                        f"{truth['streams']} streams done, rc {proc.returncode} "
                        f"{row.get('error', '')}",
                        flush=True,
                    )
    finally:
        server.stop()
    lo = min(args.concurrency)
    print(
        f"\nmedians of {args.repeats} run(s); growth per stream = (peak at C - peak at C={lo}) / (C - {lo}):"
    )
    print("| process | " + " | ".join(f"C = {c}" for c in args.concurrency) + " | KB per stream |")
    print("|---|" + "---|" * (len(args.concurrency) + 1))
    for kind in RSS_PROCESSES:
        med = {
            c: float(
                np.median(
                    [
                        r["peak_rss_mb"]
                        for r in rows
                        if (r["process"], r["concurrency"]) == (kind, c) and r["rc"] == 0
                    ]
                    or [float("nan")]
                )
            )
            for c in args.concurrency
        }
        growth = [(med[c] - med[lo]) * 2**20 / (c - lo) / 1024 for c in args.concurrency if c != lo]
        print(
            f"| {kind} | "
            + " | ".join(f"{med[c]:.0f} MB" for c in args.concurrency)
            + " | "
            + ", ".join(f"{g:.1f}" for g in growth)
            + " |"
        )
    return rows


def memory_one(phase: str, mode: str, c: int, loop_kind: str = "closed") -> None:
    """(internal) One phase, one process: C requests held at `phase`, measured once.

    A closed loop of C users (connections opened before t0, as in every load point above)
    or an open loop of C requests due at t=0 (each opens its connection on demand). One
    request is run first so that one-time costs (imports, first-use caches) are not
    divided among the C requests."""
    sys.path.insert(0, str(ROOT))
    import asyncio
    import tracemalloc

    from bench.backends.dialects import get_dialect
    from bench.executor import Progress, RunPlan
    from bench.runner import execute, new_event_loop
    from bench.workload import LengthDist, Workload

    cfg = MEMORY_PHASES[phase]
    server = StreamServer(ttft_ms=cfg["ttft_ms"], itl_ms=cfg["itl_ms"])
    try:
        workload = Workload(
            seed=1, input=LengthDist(mean=32), output=LengthDist(mean=cfg["out_len"])
        )
        closed = loop_kind == "closed"

        def plan_of(n: int) -> RunPlan:
            return RunPlan(
                base_url=server.url,
                endpoint="/v1/completions",
                dialect=get_dialect("vllm"),
                model=MODEL,
                workload=workload,
                specs=workload.specs(n),
                offsets_s=None if closed else np.zeros(n),
                concurrency=n if closed else None,
                request_timeout_s=60,
            )

        plan = plan_of(c)
        progress = Progress()
        seen: dict = {}
        trace = mode == "trace"

        def take(key: str) -> None:
            seen[key] = tracemalloc.get_traced_memory()[0] if trace else 0
            seen[key + "_snap"] = tracemalloc.take_snapshot() if trace else None
            seen[key + "_rss"] = _rss_now()

        async def main() -> None:
            async def watch() -> None:
                for _ in range(6000):  # bounded: at most ~60 s
                    await asyncio.sleep(0.01)
                    if progress.in_flight == c and "peak" not in seen:
                        await asyncio.sleep(cfg["settle_s"])  # every request at its phase
                        take("peak")
                        return

            await execute(plan_of(1))
            w = asyncio.ensure_future(watch())
            take("base")
            await execute(plan, progress=progress)
            await w

        if trace:
            tracemalloc.start(1)
        loop = new_event_loop()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
    finally:
        server.stop()
    if "peak" not in seen:
        raise SystemExit(
            f"the {c} requests were never all in flight at once within 60 s ({phase}): "
            "the first finished before the last started (a busy machine?); try a smaller C"
        )
    result = {"rss_bytes_per_request": (seen["peak_rss"] - seen["base_rss"]) / c}
    if trace:
        result["python_bytes_per_request"] = (seen["peak"] - seen["base"]) / c
        stats = seen["peak_snap"].compare_to(seen["base_snap"], "lineno")
        result["top"] = [
            {
                "bytes_per_request": st.size_diff / c,
                "where": f"{Path(st.traceback[0].filename).name}:{st.traceback[0].lineno}",
            }
            for st in stats[:12]
        ]
        tracemalloc.stop()
    print(json.dumps(result))


# ---------------------------------------------------------------- short requests (issue 31)


def short_honest(p: Point, out_len: int) -> bool:
    """Timing still matches the server's send log: tokenbench's first tokens matched request
    by request within HONEST_TTFT_P99_MS at p99 (a peer's, whose sends are not known: its
    TTFT p99 minus the server's), and (2+ tokens) ITL as honest() asks."""
    ttft_p99_err = p.stamp_err_ms[1] if p.matched else p.ttft_err_ms[1]
    if not p.ok or not abs(ttft_p99_err) <= HONEST_TTFT_P99_MS:
        return False
    if out_len < 2:
        return True
    return abs(p.itl_err_ms[0]) <= HONEST_ITL_P50_MS and abs(p.itl_err_ms[1]) <= HONEST_ITL_P99_MS


def short(args: argparse.Namespace) -> dict:
    """Requests/s for 1- to 4-token outputs (where per-request cost dominates: connection
    reuse, request bytes, response headers, the record) and tokens/s for long streams, every
    client side by side on one server, each point run by every client in turn.

    Closed loop at each C; requests/s is what the server streamed in the middle 60% of the
    point divided by the tokens per request; "per client core" is 1 / the client's CPU
    seconds per request (or per token) over its whole process tree, from /proc: the rate one
    fully used core would sustain at that cost. Honest = short_honest, in most repeats.
    """
    rows = []
    peers, missing = ensure_peers(args.peers)
    server = StreamServer(args.ttft, args.itl)

    def clients(c: int, out_len: int):
        yield (
            "tokenbench",
            tokenbench_cmd(server.url, c, args.duration, out_len, "raw"),
            {"parse": parse_tokenbench},
        )
        for name, venv in peers.items():
            try:
                cmd, prepare, parse = peer_run(name, venv, server.url, c, args.duration, out_len)
            except RuntimeError as exc:
                missing.setdefault(name, str(exc))
                continue
            yield name, cmd, {"parse": parse, "prepare": prepare}

    load = [os.getloadavg()[0]]
    try:
        for rep in range(args.repeats):
            for out_len in args.out_lens:
                for c in args.concurrency:
                    for client, cmd, how in list(clients(c, out_len)):
                        p = measure(server, client, c, cmd, timeout_s=args.duration * 4 + 60, **how)
                        rows.append(short_row(p, out_len) | {"repeat": rep})
                    load.append(os.getloadavg()[0])
    finally:
        server.stop()
    points = short_medians(rows)
    text = short_report(points, ["tokenbench", *peers], args.out_lens, missing)
    text += (
        f"\nMedians of {args.repeats} run(s) per point; TTFT {args.ttft:g} ms, ITL {args.itl:g} "
        f"ms, {args.duration:g} s per point; load average {min(load):.1f}-{max(load):.1f} "
        f"during the run, on {describe_machine()}.\n"
    )
    print("\n" + text)
    return {"rows": rows, "medians": points, "missing": missing, "report": text}


def short_medians(rows: list[dict]) -> list[dict]:
    """One row per (client, tokens, C): the median of each figure over the repeats, and how
    many repeats were honest (honest = in more than half)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["client"], r["out_len"], r["concurrency"]), []).append(r)
    out = []
    for (client, out_len, c), rs in groups.items():
        med = {
            k: float(np.median([r[k] for r in rs]))
            for k in (
                "requests_per_s",
                "tokens_per_s",
                "client_cpu_us_per_request",
                "requests_per_s_per_core",
                "tokens_per_s_per_core",
                "first_token_err_p99_ms",
                "itl_err_p99_ms",
                "peak_rss_mb",
            )
        }
        honest_runs = sum(r["honest"] for r in rs)
        out.append(
            {"client": client, "out_len": out_len, "concurrency": c, **med}
            | {"runs": len(rs), "honest_runs": honest_runs, "honest": honest_runs * 2 > len(rs)}
            | {"processes": max(r["processes"] for r in rs)}
        )
    return out


def short_report(
    points: list[dict], clients: list[str], out_lens: list[int], missing: dict[str, str]
) -> str:
    """Each client's highest honest point per output length, side by side, as Markdown."""
    lines = [
        "| tokens | client | highest honest rate | at C | per client core "
        "| 1st-token err p99 ms | RSS MB (procs) | honest points |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for out_len in out_lens:
        short_req = out_len <= 4
        for client in clients:
            mine = [p for p in points if (p["client"], p["out_len"]) == (client, out_len)]
            key = "requests_per_s" if short_req else "tokens_per_s"
            unit = "req/s" if short_req else "tok/s"
            best = max((p for p in mine if p["honest"]), key=lambda p: p[key], default=None)
            tally = ", ".join(
                f"C={p['concurrency']} {p['honest_runs']}/{p['runs']}"
                for p in sorted(mine, key=lambda p: p["concurrency"])
            )
            label = ""
            if best is None:  # none honest: its fastest point, so the costs still compare
                best, label = max(mine, key=lambda p: p[key], default=None), "none; fastest: "
            if best is None:
                continue
            core = best["requests_per_s_per_core" if short_req else "tokens_per_s_per_core"]
            lines.append(
                f"| {out_len} | {client} | {label}{best[key]:,.0f} {unit} | {best['concurrency']} "
                f"| {core:,.0f} {unit} | {best['first_token_err_p99_ms']:+.2f} "
                f"| {best['peak_rss_mb']:.0f} ({best['processes']}) | {tally} |"
            )
    for name, why in missing.items():
        lines.append(f"| all | {name} | NOT MEASURED: {why} | | | | | |")
    return "\n".join(lines) + "\n"


def short_row(p: Point, out_len: int) -> dict:
    """One point of `short`, printed as it comes."""
    cpu_per_request_s = p.cpu_s_per_mtok * out_len / 1e6
    ttft_p99_err = p.stamp_err_ms[1] if p.matched else p.ttft_err_ms[1]
    row = {
        "client": p.client,
        "out_len": out_len,
        "concurrency": p.concurrency,
        "requests_per_s": p.tokens_per_s / out_len,
        "client_cpu_us_per_request": cpu_per_request_s * 1e6,
        "requests_per_s_per_core": 1 / cpu_per_request_s if cpu_per_request_s > 0 else 0.0,
        "tokens_per_s": p.tokens_per_s,
        "tokens_per_s_per_core": 1e6 / p.cpu_s_per_mtok if p.cpu_s_per_mtok > 0 else 0.0,
        "first_token_err_p99_ms": ttft_p99_err,
        "first_token_err_matched": bool(p.matched),
        "itl_err_p99_ms": p.itl_err_ms[1],
        "server_input_delay_p99_ms": p.input_delay_p99_ms,
        "peak_rss_mb": p.peak_rss_mb,
        "processes": p.processes,
        "client_limited": p.client_limited,
        "honest": short_honest(p, out_len),
        "machine_busy": p.machine_busy,
        # inference-perf, for one: no TTFT for 1-token outputs (it wants 2+ token times)
        "note": p.note or ("" if np.isfinite(ttft_p99_err) else "no TTFT reported"),
    }
    print(
        f"{p.client:10} out_len={out_len} C={p.concurrency:<5} {row['requests_per_s']:8.0f} req/s "
        f"cpu {row['client_cpu_us_per_request']:6.0f} us/req "
        f"({row['requests_per_s_per_core']:6.0f} req/s per core) 1st-token err p99 "
        f"{ttft_p99_err:+.2f} ms ({'matched' if p.matched else 'p99 - p99'}) itl err p99 "
        f"{p.itl_err_ms[1]:+.2f} rss {p.peak_rss_mb:.0f} MB limited={p.client_limited} "
        f"honest={row['honest']} {p.note}",
        flush=True,
    )
    return row


# ---------------------------------------------------------------- agentic replay (issue 29)
# Measured 2026-12-03 (`agentic --rate 100`, 2 vCPUs, load average 1.3-3.7): client CPU per
# request, medians of 3 alternating runs, trace 1.78 ms against random 2.23 ms (x0.80): the
# trace's blocks are joined from pooled chunks (bench.blocks.ChunkPool). Before: 3.70 against
# 3.03 ms (x1.22), each block's words drawn one by one. README "Agentic replay" has the rest.


AGENTIC_SCENARIO = """name: loadgen-{kind}
target: {{base_url: "{url}", model: {model}, endpoint: /v1/completions}}
{body}"""


def agentic_files(workdir: Path, url: str, requests: int, out_len: int, seed: int) -> dict:
    """A synthetic agentic trace of `requests` requests (bench.agentic: Mooncake's
    conversation statistics) and two scenarios over it: the block-exact replay, and random
    prompts of the trace's mean input length, as many requests. Outputs are `out_len`
    tokens in both, so what differs is how prompts are built, not how much is streamed."""
    sys.path.insert(0, str(ROOT))
    from bench.agentic import SessionStats, generate, write_trace

    stats, sessions, rows = SessionStats(), max(1, requests // 2), []
    while len(rows) < requests:
        rows = generate(stats, sessions, seed)
        sessions *= 2
    rows = [{**r, "output_length": out_len} for r in rows[:requests]]
    write_trace(rows, workdir / "agentic.jsonl")
    mean_in = round(float(np.mean([r["input_length"] for r in rows])))
    bodies = {
        "trace": "workload: {dataset: mooncake, dataset_path: agentic.jsonl}\n",
        "random": f"load: {{shape: poisson, request_rate: 1, num_prompts: {requests}}}\n"
        f"workload: {{input: {{mean: {mean_in}}}, output: {{mean: {out_len}}}}}\n",
    }
    for kind, body in bodies.items():
        text = AGENTIC_SCENARIO.format(kind=kind, url=url, model=MODEL, body=body)
        (workdir / f"{kind}.yaml").write_text(text)
    return {"requests": requests, "mean_input": mean_in, "out_len": out_len}


def agentic_worker(args: argparse.Namespace) -> None:
    """One run of a scenario at a mean rate, in this process; prints the client's CPU per
    request (plan, prompt rendering and the run: everything after the imports)."""
    sys.path.insert(0, str(ROOT))
    from bench.executor import plan_from_scenario
    from bench.runner import run_blocking
    from bench.scenario import load_scenario
    from bench.sweep import PointSpec, scenario_at

    cpu0, wall0 = time.process_time(), time.perf_counter()
    sc = scenario_at(load_scenario(args.scenario), PointSpec("rate", args.rate))
    plan = plan_from_scenario(sc, base_dir=args.scenario.parent)
    result = run_blocking(plan, handle_sigint=False)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = sum(r.ok for r in result.records)
    print(json.dumps({
        "requests": len(result.records), "completed": done, "cpu_s": cpu, "wall_s": wall,
        "cpu_ms_per_request": cpu / max(1, len(result.records)) * 1e3,
        "prompt_tokens": int(sum(r.prompt_tokens or 0 for r in result.records)),
        "errors": dict(Counter(r.error_kind for r in result.records if not r.ok)),
        "error_sample": next((r.error_message for r in result.records if not r.ok), None),
    }))  # fmt: skip


def agentic(args: argparse.Namespace) -> dict:
    """Client CPU per request: the agentic trace replayed block-exact beside random prompts of
    the same size, alternating, `repeats` times each, against the local fast mock."""
    server = StreamServer(args.ttft, args.itl)
    workdir = Path(tempfile.mkdtemp(prefix="loadgen-agentic-"))
    runs: dict[str, list[dict]] = {"trace": [], "random": []}
    try:
        info = agentic_files(workdir, server.url, args.requests, args.out_len, args.seed)
        print(f"{info['requests']:,} requests, mean input {info['mean_input']:,} tokens, "
              f"{info['out_len']} out, {args.rate:g} req/s", flush=True)  # fmt: skip
        for rep in range(args.repeats):
            for kind in ("trace", "random"):
                server.reset()
                cmd = [sys.executable, str(Path(__file__).resolve()), "agentic-worker",
                       str(workdir / f"{kind}.yaml"), "--rate", str(args.rate)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.requests / args.rate * 4 + 300)  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(f"{kind} run failed: {_tail(proc.stderr, 2000)}")
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[kind].append(row)
                print(f"run {rep + 1} {kind:6}: {row['completed']:,}/{row['requests']:,} ok, "
                      f"{row['cpu_ms_per_request']:.3f} ms CPU/request, {row['wall_s']:.1f} s",
                      flush=True)  # fmt: skip
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    med = {k: float(np.median([r["cpu_ms_per_request"] for r in v])) for k, v in runs.items()}
    print(f"median client CPU per request: agentic trace {med['trace']:.3f} ms, random "
          f"{med['random']:.3f} ms (ratio {med['trace'] / med['random']:.2f}), "
          f"{args.repeats} runs each")  # fmt: skip
    return {"machine": describe_machine(), **info, "rate": args.rate, "runs": runs,
            "median_cpu_ms_per_request": med}  # fmt: skip


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="(internal) one tokenbench run, figures as JSON")
    w.add_argument("--url", required=True)
    w.add_argument("--concurrency", type=int, required=True)
    w.add_argument("--duration", type=float, required=True)
    w.add_argument("--out-len", type=int, default=128)
    w.add_argument("--transport", default="raw")
    w.add_argument("--ramp-up", type=float, default=0.0)
    rs = sub.add_parser("rss", help="peak RSS of the runner and `tokenbench run` at each C")
    rs.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 64, 256, 1024],
    )
    rs.add_argument("--ttft", type=float, default=100.0, help="ms")
    rs.add_argument("--itl", type=float, default=50.0, help="ms (slow: memory, not CPU)")
    rs.add_argument("--out-len", type=int, default=64)
    rs.add_argument("--duration", type=float, default=6.0, help="seconds per point")
    rs.add_argument("--repeats", type=int, default=3)
    rs.add_argument("--json", type=Path, help="write the figures here")
    mem = sub.add_parser("memory", help="bytes per in-flight request (default C=1024)")
    mem.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")])
    mem.add_argument("--json", type=Path, help="write the figures here")
    one = sub.add_parser("memory-one", help="(internal) one phase of `memory`")
    one.add_argument("phase", choices=sorted(MEMORY_PHASES))
    one.add_argument("mode", choices=("trace", "rss"))
    one.add_argument("--concurrency", type=int, default=1024)
    one.add_argument("--loop", choices=("closed", "open"), default="closed")
    inst = sub.add_parser("peers", help="install the peers' venvs now (else on first use)")
    inst.add_argument("names", nargs="*", default=list(PEERS))
    for name, lens, help_ in (
        ("short", "1,4", "requests/s for 1-4-token outputs, per client core"),
        ("compare", "1,4,128", "short and long outputs, every peer side by side"),
    ):
        sh = sub.add_parser(name, help=help_)
        sh.add_argument(
            "--out-lens", type=lambda s: [int(x) for x in s.split(",")], default=lens.split(",")
        )
        sh.add_argument(
            "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256, 512]
        )
        sh.add_argument("--ttft", type=float, default=100.0, help="ms")
        sh.add_argument("--itl", type=float, default=10.0, help="ms")
        sh.add_argument("--duration", type=float, default=6.0, help="seconds per point")
        sh.add_argument("--repeats", type=int, default=1 if name == "short" else 3)
        sh.add_argument("--json", type=Path, help="write the figures here")
        sh.add_argument(
            "--peers",
            type=lambda s: [x for x in s.split(",") if x],
            default=[] if name == "short" else list(PEERS),
        )
    ag = sub.add_parser("agentic", help="client CPU per request: agentic trace vs random")
    ag.add_argument("--requests", type=int, default=10_000)
    ag.add_argument("--rate", type=float, default=200.0, help="mean req/s of both runs")
    ag.add_argument("--out-len", type=int, default=16, help="output tokens per request")
    ag.add_argument("--repeats", type=int, default=3)
    ag.add_argument("--seed", type=int, default=0)
    ag.add_argument("--ttft", type=float, default=20.0, help="ms")
    ag.add_argument("--itl", type=float, default=2.0, help="ms")
    ag.add_argument("--json", type=Path, help="write the figures here")
    agw = sub.add_parser("agentic-worker", help="(internal) one run of `agentic`")
    agw.add_argument("scenario", type=Path)
    agw.add_argument("--rate", type=float, required=True)
    parser.add_argument("--quick", action="store_true", help="a few minutes: fewer points, shorter")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--itl", type=lambda s: [float(x) for x in s.split(",")], help="ms")
    parser.add_argument("--ttft", type=float, default=100.0, help="ms")
    parser.add_argument("--out-len", type=int, default=128)
    parser.add_argument("--duration", type=float, help="seconds per point")
    parser.add_argument("--repeats", type=int, help="runs per point (medians are reported)")
    parser.add_argument("--transports", type=lambda s: s.split(","), default=None)
    parser.add_argument("--peers", type=lambda s: [x for x in s.split(",") if x], default=None)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument(
        "--ramp-up",
        type=float,
        default=0.0,
        help="tokenbench only: spread the closed loop's user starts over this many s "
        "(0 = all at once, as the peers start)",
    )
    args = parser.parse_args(argv)
    if args.cmd == "peers":
        ready, missing = ensure_peers(args.names)
        for name, venv in ready.items():
            print(f"{name}: {venv}")
        raise SystemExit(1 if missing else 0)
    if args.cmd == "worker":
        worker(args)
        return
    if args.cmd == "rss":
        rows = rss(args)
        if args.json:
            args.json.write_text(json.dumps({"machine": describe_machine(), "rows": rows}))
        return
    if args.cmd == "memory":
        memory(args)
        return
    if args.cmd in ("short", "compare"):
        args.out_lens = [int(x) for x in args.out_lens]
        got = short(args)
        if args.json:
            args.json.write_text(json.dumps({"machine": describe_machine(), **got}, indent=1))
        return
    if args.cmd == "agentic-worker":
        agentic_worker(args)
        return
    if args.cmd == "agentic":
        figures = agentic(args)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
        return
    if args.cmd == "memory-one":
        memory_one(args.phase, args.mode, args.concurrency, args.loop)
        return
    args.concurrency = args.concurrency or ([16, 256, 1024] if args.quick else [16, 64, 256, 1024])
    args.itl = args.itl or ([10.0] if args.quick else [10.0, 5.0])
    args.duration = args.duration or (6.0 if args.quick else 15.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.transports = args.transports or (["raw"] if args.quick else ["raw", "httpx"])
    args.peers = list(PEERS) if args.peers is None else args.peers
    started = time.strftime("%Y-%m-%d %H:%M")
    points = run_grid(args)
    medians = median_points(points)
    report = (
        f"Measured {started} on {describe_machine()}; TTFT {args.ttft:g} ms, {args.out_len} "
        f"tokens, closed loop, {args.duration:g} s per point, median of {args.repeats} run(s).\n\n"
        f"{table(medians)}\n\n{ratios(medians)}\n\n{verdict(medians, points)}\n"
        + "".join(f"- {name}: NOT MEASURED, {why}\n" for name, why in args.missing_peers.items())
    )
    print("\n" + report)
    if args.json:
        args.json.write_text(
            json.dumps({"runs": [asdict(p) for p in points], "report": report}, indent=1)
        )


if __name__ == "__main__":
    main()
