"""Transports: send one prepared request and fill a Capture, timestamping every read.

Two implementations behind one interface:
- `RawTransport` (default): HTTP/1.1 over an asyncio Protocol with keep-alive connections.
  Each read costs a perf_counter_ns call, a bytearray extend and two array appends; chunked
  transfer framing is stripped with a small state machine. No per-token Python objects.
- `HttpxTransport`: httpx.AsyncClient, streaming raw bytes. Kept selectable
  (`--transport httpx`); see README for the figures that made the raw one the default.

Both stamp `sent_ns` immediately before the request bytes are handed to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from time import perf_counter_ns
from typing import Protocol
from urllib.parse import urlsplit

from bench.backends.capture import Capture, mark_closed
from bench.records import (
    ERR_CONNECT,
    ERR_RESET,
    ERR_TIMEOUT,
)

TRANSPORTS = ("raw", "httpx")


class Transport(Protocol):
    def prepare(self, path: str, body: bytes) -> object: ...

    async def send(self, prepared: object, cap: Capture, timeout_s: float) -> None: ...

    async def aclose(self) -> None: ...


def make_transport(
    name: str, base_url: str, *, api_key: str | None = None, max_connections: int = 0
) -> Transport:
    if name == "raw":
        return RawTransport(base_url, api_key=api_key)
    if name == "httpx":
        return HttpxTransport(base_url, api_key=api_key, max_connections=max_connections)
    raise ValueError(f"unknown --transport {name!r}: choose one of {', '.join(TRANSPORTS)}")


def _host_port(base_url: str) -> tuple[str, int, str]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--base-url {base_url!r}: expected http://HOST:PORT")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "127.0.0.1", port, parts.scheme


# ---------------------------------------------------------------- raw asyncio HTTP/1.1

_HEAD, _BODY_LENGTH, _BODY_CHUNKED, _BODY_CLOSE, _DONE = range(5)

READ_LATE_NS = 2_000_000  # issue 10's honesty bar: a token timestamp 2 ms late is wrong


class ReadClock:
    """How late reads are timestamped because they queue behind other reads.

    All reads that become ready together are handed to the protocols one after another in
    one turn of the event loop, so the k-th read of a turn is timestamped after k-1
    callbacks. The first read of a turn starts the clock (and schedules its reset for the
    turn's end); every later read in the same turn that comes more than READ_LATE_NS after
    it is counted late. The share of late reads is a lower bound on how often a token's
    timestamp was off by more than 2 ms: what the loop-lag probe, waking every 5 ms, misses.
    """

    __slots__ = ("start", "pending", "reads", "late", "_reset", "_call_soon")

    def __init__(self) -> None:
        self.start = 0
        self.pending = False
        self.reads = 0
        self.late = 0
        self._reset = None

    def mark(self, t: int) -> None:
        self.reads += 1
        if not self.pending:
            self.pending = True
            self.start = t
            if self._reset is None:
                self._reset = lambda: setattr(self, "pending", False)
                try:
                    self._call_soon = asyncio.get_running_loop().call_soon
                except RuntimeError:  # fed by hand, outside a loop (tests): one read a turn
                    self._call_soon = lambda reset: reset()
            self._call_soon(self._reset)
        elif t - self.start > READ_LATE_NS:
            self.late += 1

    @property
    def late_share(self) -> float | None:
        return self.late / self.reads if self.reads else None


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; serves one request at a time."""

    __slots__ = (
        "transport",
        "cap",
        "waiter",
        "state",
        "pending",
        "remaining",
        "crlf",
        "keep_alive",
        "lost",
        "deadline",
        "timeout_s",
        "clock",
    )

    def __init__(self, clock: ReadClock | None = None) -> None:
        self.clock = clock or ReadClock()
        self.transport: asyncio.Transport | None = None
        self.cap: Capture | None = None
        self.waiter: asyncio.Future | None = None
        self.state = _DONE
        self.pending = b""
        self.remaining = 0
        self.crlf = 0
        self.keep_alive = True
        self.lost = False
        self.deadline = 0  # perf_counter_ns by which the current request must be done
        self.timeout_s = 0.0

    # -- asyncio callbacks: the hot path
    def connection_made(self, transport) -> None:
        # asyncio and uvloop both set TCP_NODELAY on TCP transports already; asking for the
        # socket here would keep a socket object alive per connection for nothing.
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t = perf_counter_ns()
        self.clock.mark(t)
        cap = self.cap
        if cap is None:
            return
        state = self.state
        if state == _HEAD:
            data = self._head(data, cap, t)
            if data is None:
                return
            state = self.state
        if state == _BODY_CHUNKED:
            self._chunked(data, cap)
        elif state == _BODY_LENGTH:
            take = data[: self.remaining]
            cap.body += take
            self.remaining -= len(take)
            if self.remaining <= 0:
                self.state = _DONE
        elif state == _BODY_CLOSE:
            cap.body += data
        cap.read_times.append(t)
        cap.read_ends.append(len(cap.body))
        if self.state == _DONE:
            cap.end_ns = t
            self._release()

    def connection_lost(self, exc) -> None:
        self.lost = True
        cap = self.cap
        if cap is None:
            return
        t = perf_counter_ns()
        if self.state == _BODY_CLOSE:
            cap.end_ns = t
        elif self.state != _DONE:
            cap.end_ns = t
            mark_closed(cap, str(exc or "EOF"))
        self.state = _DONE
        self._release()

    # -- parsing helpers, called from data_received
    def _head(self, data: bytes, cap: Capture, t: int) -> bytes | None:
        data = self.pending + data if self.pending else data
        if cap.first_byte_ns is None:
            data = data.lstrip(b"\r\n")  # a previous response's trailing CRLF
            if not data:
                return None
            cap.first_byte_ns = t
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self.pending = data
            return None
        self.pending = b""
        lines = data[:end].split(b"\r\n")
        try:
            cap.status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            cap.error_kind = ERR_RESET
            cap.error_message = f"not an HTTP response: {lines[0][:80]!r}"
            self.keep_alive = False
            self.state = _DONE
            return b""
        length = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive = False
        if chunked:
            self.state = _BODY_CHUNKED
        elif length is not None:
            self.state, self.remaining = (_BODY_LENGTH, length) if length else (_DONE, 0)
        else:
            self.state, self.keep_alive = _BODY_CLOSE, False
        return data[end + 4 :]

    def _chunked(self, data: bytes, cap: Capture) -> None:
        if not (self.pending or self.remaining or self.crlf):
            # The common case, one whole chunk per read (a server flushing each event):
            # one find, one int and one slice, without the general loop below.
            eol = data.find(b"\r\n")
            if eol > 0:
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1  # a chunk extension (";name=value"): the general loop
                if size > 0 and eol + size + 4 == len(data) and data.endswith(b"\r\n"):
                    cap.body += data[eol + 2 : eol + 2 + size]
                    return
        self._chunked_general(data, cap)

    def _chunked_general(self, data: bytes, cap: Capture) -> None:
        if self.pending:
            data, self.pending = self.pending + data, b""
        pos, n = 0, len(data)
        while pos < n:
            if self.remaining:
                take = min(self.remaining, n - pos)
                cap.body += data[pos : pos + take]
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.crlf = 2
            elif self.crlf:
                skip = min(self.crlf, n - pos)
                pos += skip
                self.crlf -= skip
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.pending = data[pos:]
                    return
                size = int(data[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:
                    self.state = _DONE  # trailers / final CRLF are skipped at the next head
                    return
                self.remaining = size

    def _release(self) -> None:
        waiter = self.waiter
        self.cap = None
        self.waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class RawTransport:
    """HTTP/1.1 client on asyncio Protocols with a pool of idle keep-alive connections."""

    def __init__(self, base_url: str, *, api_key: str | None = None) -> None:
        self.host, self.port, scheme = _host_port(base_url)
        self.ssl = scheme == "https"
        self.prefix = urlsplit(base_url).path.rstrip("/")
        host_header = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._head_fmt = (
            "POST {path} HTTP/1.1\r\n"
            f"Host: {host_header}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
            "Accept-Encoding: identity\r\n"
            f"{auth}"
            "Content-Length: {length}\r\n\r\n"
        )
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self.clock = ReadClock()
        self._sweeper: asyncio.TimerHandle | None = None

    def prepare(self, path: str, body: bytes) -> bytes:
        head = self._head_fmt.format(path=self.prefix + path, length=len(body))
        return head.encode("latin-1") + body

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: _Connection(self.clock), self.host, self.port, ssl=True if self.ssl else None
        )
        self._all.add(conn)
        return conn

    async def warm(self, n: int, timeout_s: float = 10.0) -> None:
        """Open up to n idle connections before a run, so that the first wave's TCP handshakes
        are not timed as send lag and do not all land on the loop at t0. Errors are left
        for the requests themselves to report."""
        missing = n - len(self._idle)
        if missing <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                for start in range(0, missing, 256):
                    batch = [self._connect() for _ in range(min(256, missing - start))]
                    for conn in await asyncio.gather(*batch, return_exceptions=True):
                        if isinstance(conn, _Connection):
                            self._idle.append(conn)
                        elif isinstance(conn, BaseException) and not isinstance(conn, OSError):
                            raise conn

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._all.discard(conn)
        return await self._connect()

    async def send(self, prepared: bytes, cap: Capture, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            conn = await self._acquire()
        except OSError as exc:
            cap.sent_ns = cap.end_ns = perf_counter_ns()
            cap.error_kind = ERR_CONNECT
            cap.error_message = f"cannot connect to {self.host}:{self.port}: {exc}"
            return
        waiter = loop.create_future()
        conn.cap, conn.waiter = cap, waiter
        conn.state, conn.pending, conn.remaining, conn.crlf = _HEAD, b"", 0, 0
        cap.sent_ns = perf_counter_ns()
        conn.deadline, conn.timeout_s = cap.sent_ns + int(timeout_s * 1e9), timeout_s
        conn.transport.write(prepared)
        del prepared  # the bytes are the socket's now; an in-flight request should not hold them
        if self._sweeper is None:
            self._sweep_in(min(0.25, timeout_s / 4))
        try:
            await waiter
        except asyncio.CancelledError:
            cap.cancelled = True
            cap.end_ns = perf_counter_ns()
            conn.cap = None
            conn.transport.abort()
            self._all.discard(conn)
            raise
        if conn.keep_alive and not conn.lost and cap.error_kind is None:
            self._idle.append(conn)
        else:
            conn.transport.close()
            self._all.discard(conn)

    def _sweep_in(self, interval_s: float) -> None:
        self._sweeper = asyncio.get_running_loop().call_later(interval_s, self._sweep, interval_s)

    def _sweep(self, interval_s: float) -> None:
        """Expire requests past their deadline. One timer for all connections instead of
        one per request: a per-request TimerHandle cost ~570 bytes in flight (issue 10)."""
        self._sweeper = None
        now = perf_counter_ns()
        busy = False
        for conn in list(self._all):
            if conn.cap is None:
                continue
            if now >= conn.deadline:
                _expire(conn, conn.timeout_s)
            else:
                busy = True
        if busy:
            self._sweep_in(interval_s)

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()


def _expire(conn: _Connection, timeout_s: float) -> None:
    cap = conn.cap
    if cap is None:
        return
    cap.error_kind = ERR_TIMEOUT
    cap.error_message = f"no complete response within --request-timeout {timeout_s:g} s"
    cap.end_ns = perf_counter_ns()
    conn.state = _DONE
    conn.keep_alive = False
    conn._release()
    conn.transport.abort()


# ---------------------------------------------------------------- httpx


class HttpxTransport:
    """httpx.AsyncClient streaming raw bytes; one client, pool sized to the concurrency."""

    def __init__(self, base_url: str, *, api_key: str | None = None, max_connections: int = 0):
        import httpx

        self._httpx = httpx
        limits = httpx.Limits(
            max_connections=max_connections or None,
            max_keepalive_connections=max_connections or None,
        )
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, limits=limits, timeout=None
        )
        self.clock = ReadClock()

    def prepare(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body

    async def send(self, prepared: tuple[str, bytes], cap: Capture, timeout_s: float) -> None:
        httpx, clock = self._httpx, self.clock
        path, body = prepared
        request = self.client.build_request(
            "POST", path, content=body, headers={"Content-Type": "application/json"}
        )
        try:
            async with asyncio.timeout(timeout_s):
                cap.sent_ns = perf_counter_ns()
                response = await self.client.send(request, stream=True)
                try:
                    cap.first_byte_ns = perf_counter_ns()
                    cap.status = response.status_code
                    async for chunk in response.aiter_raw():
                        t = perf_counter_ns()
                        clock.mark(t)
                        cap.body += chunk
                        cap.read_times.append(t)
                        cap.read_ends.append(len(cap.body))
                finally:
                    await response.aclose()
            cap.end_ns = cap.read_times[-1] if cap.read_times else perf_counter_ns()
        except TimeoutError:
            cap.end_ns = perf_counter_ns()
            cap.error_kind = ERR_TIMEOUT
            cap.error_message = f"no complete response within --request-timeout {timeout_s:g} s"
        except asyncio.CancelledError:
            cap.cancelled = True
            cap.end_ns = perf_counter_ns()
            raise
        except httpx.ConnectError as exc:
            cap.end_ns = perf_counter_ns()
            cap.error_kind = ERR_CONNECT
            cap.error_message = f"cannot connect to {self.client.base_url}: {exc}"
        except (httpx.TransportError, httpx.StreamError) as exc:
            cap.end_ns = perf_counter_ns()
            mark_closed(cap, repr(exc))

    async def aclose(self) -> None:
        await self.client.aclose()
