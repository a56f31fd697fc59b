"""The raw transport: kernel arrival stamps, partial writes, TLS, and their fallbacks."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from time import perf_counter_ns

import numpy as np
import pytest

from bench.backends.capture import Capture, ReadStats, arrival_times, to_record
from bench.backends.dialects import get_dialect
from bench.backends.transport import KERNEL_STAMPS, _Connection
from bench.executor import RunPlan
from bench.metrics import summarize
from bench.records import ERR_CONNECT, RequestRecord
from bench.runner import execute, new_event_loop, run_blocking
from bench.workload import LengthDist, Workload
from tests.helpers import cpu_pressure, plan


def stamp(t_realtime_ns: int) -> bytes:
    return np.array([t_realtime_ns // 10**9, t_realtime_ns % 10**9], dtype=np.int64).tobytes()


def capture_with(reads: list[tuple[int, bytes]], sent_ns: int) -> Capture:
    cap = Capture()
    cap.sent_ns = sent_ns
    for k, (t, kernel) in enumerate(reads):
        cap.reads.append(t)
        cap.reads.append(k)
        cap.reads.frombytes(kernel)
    return cap


def test_kernel_stamps_replace_read_times_and_give_the_waits():
    offset = time.time_ns() - perf_counter_ns()
    now = perf_counter_ns()
    # Arrived 1 ms and 6 ms after the send, read 2 ms and 9 ms after it.
    cap = capture_with(
        [
            (now + 2_000_000, stamp(now + offset + 1_000_000)),
            (now + 9_000_000, stamp(now + offset + 6_000_000)),
        ],
        sent_ns=now,
    )
    arrived, waits = arrival_times(cap)
    assert arrived.tolist() == pytest.approx([now + 1_000_000, now + 6_000_000], abs=50_000)
    assert waits.tolist() == pytest.approx([1_000_000, 3_000_000], abs=50_000)
    stats = ReadStats()
    stats.add(waits)
    assert stats.late_share == 0.5  # one of the two waited more than 2 ms


def test_reads_without_stamps_or_with_impossible_ones_keep_their_read_times():
    now = perf_counter_ns()
    plain = capture_with([(now + 5, bytes(16)), (now + 9, bytes(16))], sent_ns=now)
    arrived, waits = arrival_times(plain)
    assert arrived.tolist() == [now + 5, now + 9] and waits is None
    # A stamp 1 s after the read (a wall-clock step mid-stream): the whole capture falls back.
    offset = time.time_ns() - perf_counter_ns()
    stepped = capture_with(
        [(now + 5, stamp(now + offset)), (now + 9, stamp(now + offset + 10**9))], sent_ns=now
    )
    arrived, waits = arrival_times(stepped)
    assert arrived.tolist() == [now + 5, now + 9] and waits is None


def test_tokens_read_together_are_counted_as_merged():
    # Two SSE events in one read, then one more alone: one of three tokens is merged.
    events = [
        'data: {"choices":[{"text":"a"}]}\n\n',
        'data: {"choices":[{"text":"b"}]}\n\n',
        'data: {"choices":[{"text":"c"}]}\n\ndata: [DONE]\n\n',
    ]
    cap = Capture()
    cap.status, cap.sent_ns = 200, 1
    cap.body += (events[0] + events[1]).encode()
    cap.reads.extend([10, len(cap.body), 0, 0])
    cap.body += events[2].encode()
    cap.reads.extend([20, len(cap.body), 0, 0])
    cap.end_ns = 20
    stats = ReadStats()
    rec = to_record(cap, index=0, intended_ns=1, t0_ns=0, stats=stats)
    assert rec.ok and rec.chunk_times_ns.tolist() == [10, 10, 20]
    assert stats.tokens == 3 and stats.merged == 1
    # ... and it was the first token: TTFT is off for 1 stream in 1, so that share counts.
    assert stats.first_merged == 1 and stats.merged_share == 1.0


def test_merged_tokens_flag_the_client_only_when_reads_also_waited():
    # One completed request is enough for the rule itself (a run with none is not judged).
    done = [RequestRecord(index=0, first_token_ns=1_000_000, end_ns=3_000_000, output_tokens=3)]
    busy = summarize(done, merged_token_share=0.03, late_read_share=0.2)
    assert busy.client_limited and "read together" in busy.client_limited_reasons[0]
    # The server sent tokens together (a stream interval, a batching proxy): not the client.
    server_side = summarize(done, merged_token_share=0.5, late_read_share=0.0)
    assert not server_side.client_limited
    # Without kernel stamps a merge cannot be told apart: it counts against the client.
    unknown = summarize(done, merged_token_share=0.03, late_read_share=None)
    assert unknown.client_limited


@pytest.mark.slow
@pytest.mark.skipif(not KERNEL_STAMPS, reason="kernel receive stamps are Linux-only")
def test_a_busy_loop_delays_reads_but_not_their_times(server_factory, tmp_path):
    """13 ms of work every 17 ms (out of step with the 40 ms between tokens): reads wait up
    to 13 ms, but tokens 40 ms apart never merge, so with the kernel's arrival stamps every
    gap still matches what the server did. Timed when read, gaps are off by up to 13 ms."""
    log = tmp_path / "sends.json"
    server = server_factory("--ttft-ms", "30", "--itl-ms", "40", "--sends-log", str(log))
    workload = Workload(seed=2, input=LengthDist(mean=16), output=LengthDist(mean=6))
    n = 12
    plan = RunPlan(
        base_url=server.url,
        endpoint="/v1/completions",
        dialect=get_dialect("vllm"),
        model="fake-model",
        workload=workload,
        specs=workload.specs(n),
        offsets_s=np.arange(n) / 10.0,
    )

    async def main():
        done = asyncio.Event()

        async def hog() -> None:
            for _ in range(2000):  # bounded; stops with the run
                if done.is_set():
                    return
                end = time.perf_counter() + 0.013
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0.004)

        task = asyncio.ensure_future(hog())
        try:
            return await execute(plan)
        finally:
            done.set()
            await task

    loop = new_event_loop()
    try:
        with cpu_pressure() as pressure:
            result = loop.run_until_complete(main())
    finally:
        loop.close()
    server.stop()
    truth = [[t / 1e6 for t in sends] for sends in json.loads(log.read_text())]
    records = sorted(result.records, key=lambda r: r.sent_ns)
    assert all(r.ok for r in records) and len(records) == n
    itl_err = np.abs(
        np.concatenate(
            [
                np.diff(r.chunk_times_ns) / 1e6 - np.diff(t)
                for r, t in zip(records, truth, strict=True)
            ]
        )
    )
    assert result.late_read_share > 0.1  # the reads really did wait
    assert np.median(itl_err) < 1.0, itl_err
    if pressure.starved:
        # Other work kept this process (and the kernel's packet processing, which takes the
        # stamps) off the CPU for tens of ms: tokens 40 ms apart may then merge or be stamped
        # late. What must hold is that a merge is never hidden from the self-check.
        s = summarize(
            result.records,
            late_read_share=result.late_read_share,
            merged_token_share=result.merged_token_share,
        )
        merged = result.merged_token_share > 0.01
        assert not merged or any("read together" in r for r in s.client_limited_reasons)
        return
    # Reads timed when read would be off by up to 13 ms on most gaps (the hog holds the loop
    # 13 ms of every 17); with kernel stamps nearly all match. Not all: a busy machine that is
    # not starved can still hold the *server* between logging a send and writing it.
    within = float(np.mean(itl_err < 2.0))
    assert within >= 0.9, (within, np.sort(itl_err)[-5:])
    assert result.merged_token_share == 0


def test_a_request_larger_than_the_socket_takes_is_written_in_full():
    async def main() -> bytes:
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn = _Connection(a, None)
        payload = bytes(range(256)) * 16384  # 4 MiB: far more than one send() takes
        conn.write(payload)
        assert conn.out is not None  # the rest waits for the socket to be writable
        got = bytearray()
        for _ in range(20000):  # bounded
            try:
                got += b.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
            if len(got) == len(payload):
                break
        assert conn.out is None
        a.close()
        b.close()
        return bytes(got) == payload

    loop = new_event_loop()
    try:
        assert loop.run_until_complete(main())
    finally:
        loop.close()


def self_signed_cert(tmp_path, *, for_ip: bool) -> tuple[str, str]:
    """(cert, key) PEM paths of a throwaway certificate; valid for 127.0.0.1 only when
    for_ip (a subjectAltName), else one that hostname checking rejects."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a cert")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    san = ["-addext", "subjectAltName=IP:127.0.0.1"] if for_ip else []
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1", *san,
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.mark.slow
def test_https_endpoint_streams_through_tls(tmp_path, monkeypatch, server_factory):
    cert, key = self_signed_cert(tmp_path, for_ip=True)
    server = server_factory(
        "--ttft-ms", "10", "--itl-ms", "2", "--tls-cert", cert, "--tls-key", key
    )
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # trust the test's own certificate
    workload = Workload(seed=4, input=LengthDist(mean=16), output=LengthDist(mean=7))
    plan = RunPlan(
        base_url=server.url.replace("http://", "https://"),
        endpoint="/v1/chat/completions",
        dialect=get_dialect("vllm"),
        model="fake-model",
        workload=workload,
        specs=workload.specs(9),
        concurrency=3,
    )
    result = run_blocking(plan, handle_sigint=False)
    s = summarize(result.records)
    assert s.completed == 9, s.errors
    assert all(r.output_tokens == 7 and len(r.chunk_times_ns) == 7 for r in result.records)
    assert sys.platform != "linux" or result.late_read_share is not None  # stamped under TLS


@pytest.mark.slow
def test_https_with_an_untrusted_certificate_is_a_connect_error(tmp_path, server_factory):
    cert, key = self_signed_cert(tmp_path, for_ip=False)  # not trusted either
    server = server_factory("--tls-cert", cert, "--tls-key", key)
    workload = Workload(seed=4, input=LengthDist(mean=16), output=LengthDist(mean=3))
    plan = RunPlan(
        base_url=server.url.replace("http://", "https://"),
        endpoint="/v1/completions",
        dialect=get_dialect("vllm"),
        model="fake-model",
        workload=workload,
        specs=workload.specs(2),
        offsets_s=np.zeros(2),
    )
    result = run_blocking(plan, handle_sigint=False)
    s = summarize(result.records)
    assert s.errors == {"connect_error": 2}
    assert "certificate" in result.records[0].error_message.lower()


def test_unreachable_port_is_a_connect_error():
    # Nothing listens on port 9 (discard) on loopback in the test environment.
    result = run_blocking(plan("http://127.0.0.1:9", 3, rate=100.0), handle_sigint=False)
    s = summarize(result.records)
    assert s.errors == {ERR_CONNECT: 3}
    assert "cannot connect" in result.records[0].error_message
