"""Transports: send one prepared request and fill a Capture, timestamping every read.

Two implementations behind one interface (`start` a request; `done(cap)` is called once it
has ended, however it ended):
- `RawTransport` (default): HTTP/1.1 on non-blocking sockets; no task, coroutine or future
  per request. On Linux every connection's socket sits in one epoll set and the event loop
  watches only that set (`_Readers`). Each socket asks the kernel to stamp incoming
  segments (SO_TIMESTAMPNS) and is read with recvmsg, so a token's time is when it reached
  this machine, not when the loop got round to reading it: a burst of reads queued behind
  each other no longer shifts their timestamps (issue 10). Each read costs one recvmsg,
  one perf_counter_ns, one bytearray extend and three array operations; chunked framing
  is stripped with a small state machine. TLS runs through an in-memory SSLObject on the
  same socket.
- `HttpxTransport`: httpx.AsyncClient, streaming raw bytes, one task per request. Kept
  selectable (`--transport httpx`); see README for the figures that made the raw one the
  default.

Both stamp `sent_ns` immediately before the request bytes are handed to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import struct
import sys
from collections.abc import Callable
from time import perf_counter_ns
from typing import Protocol
from urllib.parse import urlsplit

from bench.backends.bounds import check_stream, ends_with_done
from bench.backends.capture import Capture, mark_closed
from bench.backends.openai import auth_headers
from bench.records import (
    ERR_BAD_FRAMING,
    ERR_CONNECT,
    ERR_TIMEOUT_BODY,
    ERR_TIMEOUT_CONNECT,
    ERR_TIMEOUT_HEADERS,
    ERR_TIMEOUT_TLS,
)

TRANSPORTS = ("raw", "httpx")

Done = Callable[[Capture], None]


class Transport(Protocol):
    def prepare(self, path: str, body: bytes) -> object: ...

    def start(self, prepared: object, cap: Capture, timeout_s: float, done: Done) -> None: ...

    def cancel_all(self) -> None: ...

    async def warm(self, n: int) -> None: ...

    async def aclose(self) -> None: ...


def make_transport(
    name: str,
    base_url: str,
    *,
    api_key: str | None = None,
    max_connections: int = 0,
    headers: dict[str, str] | None = None,
) -> Transport:
    """`headers`: sent with every request (--header KEY=VALUE, checked by bench.scenario)."""
    if name == "raw":
        return RawTransport(base_url, api_key=api_key, headers=headers)
    if name == "httpx":
        return HttpxTransport(
            base_url, api_key=api_key, max_connections=max_connections, headers=headers
        )
    raise ValueError(f"unknown --transport {name!r}: choose one of {', '.join(TRANSPORTS)}")


def _host_port(base_url: str) -> tuple[str, int, str]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--base-url {base_url!r}: expected http://HOST:PORT")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "127.0.0.1", port, parts.scheme


# ---------------------------------------------------------------- raw HTTP/1.1 on sockets

_HEAD, _BODY_LENGTH, _BODY_CHUNKED, _BODY_CLOSE, _DONE = range(5)

READ_SIZE = 65536
HEAD_MAX = 65536  # a response head longer than this is not HTTP
CHUNK_LINE_MAX = 1024  # nor a chunk-size line longer than this
# Whole chunks are unframed a window of this many bytes at a time with C-level passes
# (split, map(int), map(len)); a window that yields fewer than BULK_MIN chunks is not worth
# it, and the next BULK_PAUSE chunk heads are read one by one (see _whole_chunks).
BULK_WINDOW = 16384
BULK_MIN = 4
BULK_PAUSE = 32
# SO_TIMESTAMPNS hands back a struct timespec (two 64-bit fields) per read on 64-bit Linux;
# elsewhere reads are stamped with perf_counter_ns only.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
KERNEL_STAMPS = sys.platform.startswith("linux") and struct.calcsize("P") == 8
_ANC_SIZE = socket.CMSG_SPACE(16) if KERNEL_STAMPS else 0
_NO_STAMP = bytes(16)


def _ask_for_stamps(sock: socket.socket) -> None:
    """Ask the kernel to stamp this socket's incoming data. Where it cannot, reads come
    without a stamp and keep the time they were read (capture.arrival_times)."""
    if KERNEL_STAMPS:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)


class _FramingError(ValueError):
    """The response's HTTP framing is broken: a head, chunk size or Content-Length."""


class _Connection:
    """One keep-alive HTTP/1.1 connection on a non-blocking socket; one request at a time."""

    __slots__ = (
        "sock",
        "fd",
        "pool",
        "cap",
        "done",
        "state",
        "pending",
        "remaining",
        "crlf",
        "keep_alive",
        "lost",
        "timeout_s",
        "out",
        "tls",
        "tls_in",
        "tls_out",
        "pooled",
        "request",
        "deadline_ns",
    )

    def __init__(self, sock: socket.socket | None, pool: RawTransport | None) -> None:
        self.sock = sock
        self.fd = sock.fileno() if sock is not None else -1
        self.pool = pool
        self.cap: Capture | None = None
        self.done: Done | None = None
        self.state = _DONE
        self.pending = b""
        self.remaining = 0
        self.crlf = 0
        self.keep_alive = True
        self.lost = False
        self.timeout_s = 0.0
        self.out: memoryview | None = None  # request bytes the socket has not taken yet
        self.tls: ssl.SSLObject | None = None
        self.tls_in: ssl.MemoryBIO | None = None
        self.tls_out: ssl.MemoryBIO | None = None
        # the request now served was sent on a connection taken from the idle pool (kept
        # alive after a response, or opened ahead by warm()), which the server may have closed
        self.pooled = False
        self.request: bytes | None = None  # the request being served, kept for one resend
        self.deadline_ns = 0  # when the request it serves times out, whatever its phase

    def expect(self, cap: Capture, done: Done | None = None) -> None:
        """Get ready to read the response to a request about to be written."""
        self.cap, self.done = cap, done
        self.state, self.pending, self.remaining, self.crlf = _HEAD, b"", 0, 0

    # -- event-loop callbacks: the hot path
    def on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(READ_SIZE, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close_lost(exc)
            return
        t = perf_counter_ns()
        if self.tls is not None:
            data = self._decrypt(data)
            if data is None:
                return
        elif not data:
            self.close_lost(None)
            return
        self.feed(data, t, anc[0][2] if anc else _NO_STAMP)

    def feed(self, data: bytes, t: int, stamp: bytes = _NO_STAMP) -> None:
        """Parse one read of response bytes, read at `t`; `stamp` is the kernel's record of
        when they arrived (zeros where there is none)."""
        cap = self.cap
        if cap is None:
            return  # bytes after the response (a trailing CRLF) or that nobody asked for
        try:
            self._feed(data, cap, t, stamp)
        except Exception as exc:  # noqa: BLE001 - one bad response fails one request
            # Raised in an event-loop callback, this would reach no one and the request
            # would sit until its timeout: end it now, named, and drop the connection.
            if self.cap is not cap:
                raise  # it came from after the request ended (the done callback)
            self._broken(cap, exc, t, stamp)

    def _feed(self, data: bytes, cap: Capture, t: int, stamp: bytes) -> None:
        if self.state == _BODY_CHUNKED and not (self.pending or self.remaining or self.crlf):
            # The common case, one whole chunk per read (a server flushing each event): one
            # find, one int and one slice, without the general path below.
            eol = data.find(b"\r\n")
            if 0 < eol < 9:
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1  # a chunk extension (";name=value"): the general path
                if size > 0 and eol + size + 4 == len(data) and data.endswith(b"\r\n"):
                    body = cap.body
                    body += data[eol + 2 : -2]
                    reads = cap.reads
                    reads.append(t)
                    reads.append(len(body))
                    reads.frombytes(stamp)
                    if len(body) > cap.check_at:
                        self._check_bounds(cap, t)
                    return
        self._feed_framed(data, cap, t, stamp)

    def _feed_framed(self, data: bytes, cap: Capture, t: int, stamp: bytes) -> None:
        """feed's general path: the head, bodies framed by length or close, any chunking."""
        state = self.state
        if state == _HEAD:
            data = self._head(data, cap, t)
            if data is None:
                return
            state = self.state
        if state == _BODY_CHUNKED:
            self._chunked_general(data, cap)
        elif state == _BODY_LENGTH:
            take = data[: self.remaining]
            cap.body += take
            self.remaining -= len(take)
            if self.remaining <= 0:
                self.state = _DONE
        elif state == _BODY_CLOSE:
            cap.body += data
        reads = cap.reads
        reads.append(t)
        reads.append(len(cap.body))
        reads.frombytes(stamp)
        if self.state == _DONE:
            cap.end_ns = t
            self.release()
        elif len(cap.body) > cap.check_at:
            self._check_bounds(cap, t)

    def _check_bounds(self, cap: Capture, t: int) -> None:
        """The body grew past its check point: check its bounds (bench.backends.bounds);
        beyond one the request ends now, named, and the connection is dropped."""
        cap.check_at, kind, message = check_stream(cap.body, cap.max_tokens)
        if kind is not None:
            cap.error_kind, cap.error_message = kind, message
            cap.end_ns = t
            self.keep_alive = False
            self.state = _DONE
            self.release()

    def _broken(self, cap: Capture, exc: Exception, t: int, stamp: bytes) -> None:
        reads = cap.reads  # the bytes taken before the break belong to this read
        reads.append(t)
        reads.append(len(cap.body))
        reads.frombytes(stamp)
        cap.error_kind = ERR_BAD_FRAMING
        if isinstance(exc, _FramingError):
            cap.error_message = f"bad HTTP framing: {exc}"
        else:
            cap.error_message = f"tokenbench could not parse the response: {exc!r}"[:500]
        cap.end_ns = t
        self.keep_alive = False
        self.state = _DONE
        self.release()

    def alive(self) -> bool:
        """Whether an idle connection can carry a request: False once the peer has closed
        it (EOF) or it broke, even if the loop has not yet read the EOF. Bytes waiting
        (a TLS ticket, a stray CRLF) do not make it unusable."""
        try:
            data = self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return bool(data)

    def write(self, data: bytes) -> None:
        """Hand request bytes to the socket; what it cannot take now waits for writable."""
        if self.tls is not None:
            self.tls.write(data)
            data = self.tls_out.read()
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            # Reported on the next turn, so the caller's bookkeeping is done before done().
            asyncio.get_running_loop().call_soon(self.close_lost, exc)
            return
        if sent < len(data):
            self.out = memoryview(data)[sent:]
            asyncio.get_running_loop().add_writer(self.fd, self.on_writable)

    def on_writable(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.out = None
            loop.remove_writer(self.fd)
            self.close_lost(exc)
            return
        self.out = self.out[sent:]
        if not self.out:
            self.out = None
            loop.remove_writer(self.fd)

    def _decrypt(self, data: bytes) -> bytes | None:
        """Plaintext from TLS records just read; None when there is nothing to hand on."""
        if not data:
            self.close_lost(None)
            return None
        self.tls_in.write(data)
        parts = []
        while True:
            try:
                part = self.tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as exc:
                self.close_lost(exc)
                return None
            if not part:  # close_notify
                break
            parts.append(part)
        return b"".join(parts) if parts else None

    def close_lost(self, exc: BaseException | None) -> None:
        """The connection went away: end the request it was serving as its framing says."""
        self.lost = True
        cap = self.cap
        if cap is not None and self._resendable(cap):
            # The request went out on a reused connection that the server had already
            # closed (llama-server closes after each stream while promising keep-alive):
            # no byte came back, so it never reached the server. Send it again, once, on a
            # new connection; it is counted once and timed from the resend.
            done, request = self.done, self.request
            self.cap = self.done = None
            self.pool.put_back(self, False)
            self.pool.resend(request, cap, self.timeout_s, done, self.deadline_ns)
            return
        if cap is not None:
            t = perf_counter_ns()
            if self.state == _BODY_CLOSE:
                cap.end_ns = t
            elif self.state != _DONE:
                cap.end_ns = t
                mark_closed(cap, str(exc or "EOF"))
            self.state = _DONE
        self.release()

    def _resendable(self, cap: Capture) -> bool:
        return (
            self.pooled
            and cap.retries == 0
            and cap.first_byte_ns is None
            and self.state == _HEAD
            and self.pool is not None
            and self.request is not None
        )

    # -- parsing helpers, called from feed
    def _head(self, data: bytes, cap: Capture, t: int) -> bytes | None:
        data = self.pending + data if self.pending else data
        if cap.first_byte_ns is None:
            data = data.lstrip(b"\r\n")  # a previous response's trailing CRLF
            if not data:
                return None
            cap.first_byte_ns = t
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > HEAD_MAX:
                raise _FramingError(f"no end of the response head in {HEAD_MAX} bytes")
            self.pending = data
            return None
        self.pending = b""
        lines = data[:end].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        try:
            if not version.startswith(b"HTTP/"):
                raise ValueError
            cap.status = int(rest[:3])
        except ValueError:
            raise _FramingError(f"not an HTTP response: {lines[0][:80]!r}") from None
        if 100 <= cap.status < 200 and cap.status != 101:
            # An interim response (100 Continue, 103 Early Hints): HTTP/1.1 says a client
            # reads past it to the final response on the same connection (RFC 9110 15.2).
            cap.status = None
            rest_data = data[end + 4 :]
            return self._head(rest_data, cap, t) if rest_data else None
        length = None
        chunked = False
        connection = b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = _content_length(value, length)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection":
                connection = value.strip().lower()
        # HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes unless told
        # to keep it.
        if b"close" in connection or (version == b"HTTP/1.0" and b"keep-alive" not in connection):
            self.keep_alive = False
        if chunked:
            self.state = _BODY_CHUNKED
        elif length is not None:
            self.state, self.remaining = (_BODY_LENGTH, length) if length else (_DONE, 0)
        else:
            self.state, self.keep_alive = _BODY_CLOSE, False
        return data[end + 4 :]

    def _chunked_general(self, data: bytes, cap: Capture) -> None:
        """Unframe chunks; many small chunks in one read are unframed together, so that a
        server sending 1-byte chunks costs C-level passes per read, not Python per chunk."""
        if self.pending:
            data, self.pending = self.pending + data, b""
        pos, n = 0, len(data)
        pause = 0  # chunk heads to read one by one before trying a bulk window again
        while pos < n:
            if self.remaining:
                take = min(self.remaining, n - pos)
                cap.body += data[pos : pos + take]
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.crlf = 2
            elif self.crlf:
                expected = b"\r\n"[2 - self.crlf :]
                got = data[pos : pos + len(expected)]
                if not expected.startswith(got):
                    raise _FramingError(f"chunk data not followed by CRLF: {got!r}")
                pos += len(got)
                self.crlf -= len(got)
            else:
                if pause == 0 and n - pos > BULK_MIN * 6:
                    payloads, pos_after = _whole_chunks(data, pos)
                    if len(payloads) >= BULK_MIN:
                        cap.body += b"".join(payloads)
                        pos = pos_after
                        continue
                    pause = BULK_PAUSE
                pause = max(0, pause - 1)
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > CHUNK_LINE_MAX:
                        raise _FramingError(f"no chunk size in {n - pos} bytes")
                    self.pending = data[pos:]
                    return
                size = _chunk_size(data[pos:eol])
                pos = eol + 2
                if size == 0:
                    self.state = _DONE  # trailers / final CRLF are skipped at the next head
                    return
                self.remaining = size

    def release(self) -> None:
        """The request is over: give the connection back (or close it), then say done."""
        cap, done = self.cap, self.done
        self.cap = self.done = None
        self.request = None
        if self.pool is not None:
            self.pool.put_back(self, cap is None or cap.error_kind is None)
        if cap is not None and done is not None:
            done(cap)

    def close(self) -> None:
        if self.sock is None:
            return
        if self.pool is not None:
            self.pool.readers.remove(self)
        if self.out is not None:
            asyncio.get_running_loop().remove_writer(self.fd)
            self.out = None
        self.lost = True
        self.sock.close()
        self.sock = None


def _content_length(value: bytes, previous: int | None) -> int:
    try:
        length = int(value.strip())
    except ValueError:
        raise _FramingError(f"Content-Length {value.strip()[:40]!r} is not a number") from None
    if length < 0 or (previous is not None and previous != length):
        raise _FramingError(f"Content-Length {length} (after {previous}) is not a length")
    return length


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    try:
        size = int(text, 16)
    except ValueError:
        raise _FramingError(f"chunk size {text[:40]!r} is not hexadecimal") from None
    if size < 0 or text[:1] in (b"+", b"-"):
        raise _FramingError(f"chunk size {text[:40]!r} is not a size")
    return size


def _whole_chunks(data: bytes, pos: int) -> tuple[list[bytes], int]:
    """The payloads of the whole chunks starting at data[pos] (a chunk head), and where
    they end, found in one window with C-level passes instead of a Python step per chunk.

    Splitting at CRLF gives head, payload, head, payload, ... as long as no payload holds a
    CRLF; such a payload's first piece is shorter than its head says, so comparing sizes
    with lengths stops exactly before it. Also stops before the last chunk (size 0) and a
    head that is not plain hex (an extension, or garbage for the general path to name).
    """
    window = data[pos : pos + BULK_WINDOW]
    parts = window.split(b"\r\n")
    pairs = (len(parts) - 1) // 2  # the last part is not followed by a CRLF in the window
    heads = parts[0 : 2 * pairs : 2]
    bodies = parts[1 : 2 * pairs : 2]
    try:  # a server repeats a few sizes: parse each distinct head once
        size_of = {head: int(head, 16) for head in set(heads)}
    except ValueError:
        return [], pos
    sizes = list(map(size_of.__getitem__, heads))
    lengths = list(map(len, bodies))
    k = sizes.index(0) if 0 in size_of.values() else pairs
    if sizes[:k] != lengths[:k]:
        k = next(i for i in range(k) if sizes[i] != lengths[i])
    if k == 0:
        return [], pos
    rest = b"\r\n".join(parts[2 * k :])  # short, unless a mismatch stopped early
    return bodies[:k], pos + len(window) - len(rest)


class _Readers:
    """Calls a connection's on_readable when its socket has bytes to read.

    On Linux one epoll set holds every connection's socket and the event loop watches only
    that set's descriptor; when it is ready, one callback polls the set and reads every
    ready socket. A reader registered with the loop per socket (uvloop: a poll handle, a
    callback handle and a bound method, ~600 bytes) was the largest cost of a request in
    flight (issue 10). Elsewhere each socket is registered with the loop itself.
    """

    def __init__(self) -> None:
        self.by_fd: dict[int, _Connection] = {}
        self.epoll = select.epoll() if hasattr(select, "epoll") else None
        self.watched = False

    def add(self, conn: _Connection) -> None:
        if self.epoll is None:
            asyncio.get_running_loop().add_reader(conn.fd, conn.on_readable)
            return
        if not self.watched:
            asyncio.get_running_loop().add_reader(self.epoll.fileno(), self._ready)
            self.watched = True
        self.epoll.register(conn.fd, select.EPOLLIN)
        self.by_fd[conn.fd] = conn

    def remove(self, conn: _Connection) -> None:
        if self.epoll is None:
            asyncio.get_running_loop().remove_reader(conn.fd)
            return
        if self.by_fd.pop(conn.fd, None) is not None:
            with contextlib.suppress(OSError):
                self.epoll.unregister(conn.fd)

    def _ready(self) -> None:
        by_fd = self.by_fd
        for fd, _events in self.epoll.poll(0):
            conn = by_fd.get(fd)
            if conn is not None:
                conn.on_readable()

    def close(self) -> None:
        if self.epoll is None or self.epoll.closed:
            return
        if self.watched:
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                asyncio.get_running_loop().remove_reader(self.epoll.fileno())
            self.watched = False
        self.epoll.close()
        self.by_fd.clear()


class RawTransport:
    """HTTP/1.1 client on non-blocking sockets with a pool of idle keep-alive connections."""

    def __init__(
        self, base_url: str, *, api_key: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.host, self.port, scheme = _host_port(base_url)
        self.ssl_context = ssl.create_default_context() if scheme == "https" else None
        self.prefix = urlsplit(base_url).path.rstrip("/")
        host_header = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        lines = auth_headers(api_key) | (headers or {})
        auth = "".join(f"{k}: {v}\r\n" for k, v in lines.items())
        auth = auth.replace("{", "{{").replace("}", "}}")  # literal in the format string
        self._head_fmt = (
            "POST {path} HTTP/1.1\r\n"
            f"Host: {host_header}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
            "Accept-Encoding: identity\r\n"
            f"{auth}"
            "Content-Length: {length}\r\n\r\n"
        )
        self._addr: tuple | None = None
        self._resolving: asyncio.Future | None = None
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._connecting: set[asyncio.Task] = set()
        self.readers = _Readers()
        self._sweeper: asyncio.TimerHandle | None = None

    def prepare(self, path: str, body: bytes) -> bytes:
        head = self._head_fmt.format(path=self.prefix + path, length=len(body))
        return head.encode("latin-1") + body

    async def _connect(self, phase: list[str] | None = None) -> _Connection:
        """Open a connection; phase[0] says which step it is in (for a timeout's kind)."""
        loop = asyncio.get_running_loop()
        family, kind, proto, _, address = await self._address()
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _ask_for_stamps(sock)
            await loop.sock_connect(sock, address)
            conn = _Connection(sock, self)
            if self.ssl_context is not None:
                if phase is not None:
                    phase[0] = ERR_TIMEOUT_TLS
                await _handshake(conn, self.ssl_context, self.host)
        except BaseException:
            sock.close()
            raise
        self.readers.add(conn)
        self._all.add(conn)
        return conn

    async def _address(self) -> tuple:
        """The endpoint's address, resolved once however many connections open at once."""
        if self._addr is None:
            resolving = self._resolving
            if resolving is None:
                resolving = self._resolving = asyncio.ensure_future(
                    asyncio.get_running_loop().getaddrinfo(
                        self.host, self.port, type=socket.SOCK_STREAM
                    )
                )
            try:
                infos = await asyncio.shield(resolving)
            except OSError:
                if self._resolving is resolving:
                    self._resolving = None  # let a later connection try again
                raise
            self._addr = infos[0]
        return self._addr

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
                        elif isinstance(conn, BaseException) and not isinstance(
                            conn, (OSError, ssl.SSLError)
                        ):
                            raise conn

    def start(self, prepared: bytes, cap: Capture, timeout_s: float, done: Done) -> None:
        """Send on an idle connection now, or open one first (off the caller's path).
        The request's one deadline starts now and holds through every phase."""
        deadline_ns = perf_counter_ns() + int(timeout_s * 1e9)
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and conn.alive():
                conn.pooled = True
                self._begin(conn, prepared, cap, timeout_s, done, deadline_ns)
                return
            self.put_back(conn, False)  # closed by the peer while idle: drop it
        self._open_then_begin(prepared, cap, timeout_s, done, deadline_ns)

    def resend(
        self, prepared: bytes, cap: Capture, timeout_s: float, done: Done, deadline_ns: int
    ) -> None:
        """Send a request again on a new connection (the reused one was dead: see
        _Connection.close_lost); the record keeps the count in `retries`."""
        cap.retries += 1
        cap.sent_ns = 0
        self._open_then_begin(prepared, cap, timeout_s, done, deadline_ns)

    def _open_then_begin(
        self, prepared: bytes, cap: Capture, timeout_s: float, done: Done, deadline_ns: int
    ) -> None:
        task = asyncio.ensure_future(
            self._connect_then_begin(prepared, cap, timeout_s, done, deadline_ns)
        )
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_then_begin(
        self, prepared: bytes, cap: Capture, timeout_s: float, done: Done, deadline_ns: int
    ) -> None:
        phase = [ERR_TIMEOUT_CONNECT]
        began = perf_counter_ns()
        try:
            async with asyncio.timeout(max(0.0, (deadline_ns - began) / 1e9)):
                conn = await self._connect(phase)
        except asyncio.CancelledError:
            cap.cancelled = True  # never left the client: sent_ns stays 0
            done(cap)
            raise
        except TimeoutError:
            # Timed from the first attempt: the record's E2EL is the time it waited.
            cap.sent_ns, cap.end_ns = began, perf_counter_ns()
            cap.error_kind = phase[0]
            step = "TLS handshake" if phase[0] == ERR_TIMEOUT_TLS else "connection"
            cap.error_message = (
                f"{step} to {self.host}:{self.port} not done within --request-timeout "
                f"{timeout_s:g} s"
            )
            done(cap)
            return
        except (OSError, ssl.SSLError) as exc:
            cap.sent_ns = cap.end_ns = perf_counter_ns()
            cap.error_kind = ERR_CONNECT
            cap.error_message = f"cannot connect to {self.host}:{self.port}: {exc}"
            done(cap)
            return
        conn.pooled = False
        self._begin(conn, prepared, cap, timeout_s, done, deadline_ns)

    def _begin(
        self,
        conn: _Connection,
        prepared: bytes,
        cap: Capture,
        timeout_s: float,
        done: Done,
        deadline_ns: int,
    ) -> None:
        conn.expect(cap, done)
        conn.request = prepared
        cap.sent_ns = perf_counter_ns()
        conn.timeout_s = timeout_s
        conn.deadline_ns = deadline_ns
        conn.write(prepared)
        if self._sweeper is None:
            self._sweep_in(min(0.25, timeout_s / 4))

    def put_back(self, conn: _Connection, clean: bool) -> None:
        """A request on conn has ended: keep the connection for the next one if it can serve."""
        if clean and conn.keep_alive and not conn.lost and conn.sock is not None:
            self._idle.append(conn)
            return
        conn.close()
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def _sweep_in(self, interval_s: float) -> None:
        self._sweeper = asyncio.get_running_loop().call_later(interval_s, self._sweep, interval_s)

    def _sweep(self, interval_s: float) -> None:
        """Expire requests past their deadline, and complete streams that ended with
        [DONE] while the server kept the response open. One timer for all connections
        instead of one per request: a per-request TimerHandle cost ~570 bytes in flight
        (issue 10)."""
        self._sweeper = None
        now = perf_counter_ns()
        quiet_ns = now - int(interval_s * 1e9)
        busy = False
        for conn in list(self._all):
            cap = conn.cap
            if cap is None:
                continue
            if now >= conn.deadline_ns:
                _expire(conn)
            elif conn.state != _HEAD and cap.reads and cap.reads[-4] < quiet_ns:
                _end_if_done(conn)
                busy = busy or conn.cap is not None
            else:
                busy = True
        if busy:
            self._sweep_in(interval_s)

    def cancel_all(self) -> None:
        """The run is stopping: end every request in flight as cancelled."""
        for task in list(self._connecting):
            task.cancel()
        for conn in list(self._all):
            cap = conn.cap
            if cap is None:
                continue
            cap.cancelled = True
            cap.end_ns = perf_counter_ns()
            conn.keep_alive = False
            conn.release()

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in list(self._connecting):
            task.cancel()
        await asyncio.gather(*self._connecting, return_exceptions=True)
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        self.readers.close()


async def _handshake(conn: _Connection, context: ssl.SSLContext, host: str) -> None:
    """TLS handshake through memory BIOs, so that reads stay plain recvmsg calls."""
    loop = asyncio.get_running_loop()
    conn.tls_in, conn.tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn.tls = context.wrap_bio(conn.tls_in, conn.tls_out, server_hostname=host)
    while True:
        try:
            conn.tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = conn.tls_out.read()
            if pending:
                await loop.sock_sendall(conn.sock, pending)
            data = await loop.sock_recv(conn.sock, READ_SIZE)
            if not data:
                raise ConnectionResetError("connection closed during the TLS handshake") from None
            conn.tls_in.write(data)
    pending = conn.tls_out.read()
    if pending:
        await loop.sock_sendall(conn.sock, pending)


def _expire(conn: _Connection) -> None:
    """The request's deadline has passed: end it, named by the phase it was in."""
    cap = conn.cap
    if cap is None:
        return
    if conn.state == _HEAD:
        cap.error_kind = ERR_TIMEOUT_HEADERS
        what = "no complete response head"
    else:
        cap.error_kind = ERR_TIMEOUT_BODY
        what = "the stream did not end"
    cap.error_message = f"{what} within --request-timeout {conn.timeout_s:g} s"
    cap.end_ns = perf_counter_ns()
    conn.state = _DONE
    conn.keep_alive = False
    conn.release()


def _end_if_done(conn: _Connection) -> None:
    """A quiet stream whose last event is [DONE] is complete even if the server neither
    ends the response nor closes: end it at its last read and drop the connection."""
    cap = conn.cap
    if cap is not None and ends_with_done(cap.body):
        cap.end_ns = cap.reads[-4]
        conn.state = _DONE
        conn.keep_alive = False
        conn.release()


# ---------------------------------------------------------------- httpx


class HttpxTransport:
    """httpx.AsyncClient streaming raw bytes; one client, pool sized to the concurrency.

    One task per request (httpx is coroutine-based); reads are stamped with perf_counter_ns
    when httpx hands them over, so they carry the loop's delays that the raw transport's
    kernel stamps do not."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_connections: int = 0,
        headers: dict[str, str] | None = None,
    ):
        import httpx

        extra_headers = headers

        self._httpx = httpx
        limits = httpx.Limits(
            max_connections=max_connections or None,
            max_keepalive_connections=max_connections or None,
        )
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        headers.update(auth_headers(api_key))
        headers.update(extra_headers or {})
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, limits=limits, timeout=None
        )
        self._tasks: set[asyncio.Task] = set()
        # Resends go through a client that keeps no connection alive, so that each is sent
        # on a new connection rather than on another idle one that may be stale too.
        self._fresh = httpx.AsyncClient(
            limits=httpx.Limits(max_keepalive_connections=0), timeout=None
        )

    def prepare(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body

    async def warm(self, n: int) -> None:
        """Nothing to open ahead: httpx opens its pool's connections on demand."""

    def start(self, prepared: tuple[str, bytes], cap: Capture, timeout_s: float, done: Done):
        task = asyncio.ensure_future(self._send(prepared, cap, timeout_s, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _send(
        self, prepared: tuple[str, bytes], cap: Capture, timeout_s: float, done: Done
    ) -> None:
        httpx = self._httpx
        path, body = prepared
        phase = [ERR_TIMEOUT_CONNECT]

        async def trace(event: str, _info: dict) -> None:
            """httpcore's steps, so that a timeout names the phase it stopped in."""
            if event.startswith("connection.start_tls"):
                phase[0] = ERR_TIMEOUT_TLS
            elif event.startswith("http11.send_request_headers"):
                phase[0] = ERR_TIMEOUT_HEADERS

        request = self.client.build_request(
            "POST",
            path,
            content=body,
            headers={"Content-Type": "application/json"},
            extensions={"trace": trace},
        )
        client = self.client
        # One deadline for the request, through a resend and every phase of each attempt.
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self._attempt(client, request, cap, deadline, phase)
            except TimeoutError:
                cap.end_ns = perf_counter_ns()
                cap.error_kind = phase[0]
                cap.error_message = f"{_PHASES[phase[0]]} within --request-timeout {timeout_s:g} s"
            except asyncio.CancelledError:
                cap.cancelled = True
                cap.end_ns = perf_counter_ns()
            except httpx.ConnectError as exc:
                cap.end_ns = perf_counter_ns()
                cap.error_kind = ERR_CONNECT
                cap.error_message = f"cannot connect to {self.client.base_url}: {exc}"
            except (httpx.TransportError, httpx.StreamError) as exc:
                if cap.first_byte_ns is None and cap.retries == 0:
                    # No response byte: a kept-alive connection the server had closed
                    # ("Server disconnected without sending a response"). Once, again.
                    cap.retries += 1
                    client = self._fresh
                    phase[0] = ERR_TIMEOUT_CONNECT
                    continue
                cap.end_ns = perf_counter_ns()
                if isinstance(exc, httpx.RemoteProtocolError) and not _closed(exc):
                    cap.error_kind = ERR_BAD_FRAMING
                    cap.error_message = f"bad HTTP framing: {exc}"
                else:
                    mark_closed(cap, repr(exc))
            break
        done(cap)

    async def _attempt(
        self, client, request, cap: Capture, deadline: float, phase: list[str]
    ) -> None:
        async with asyncio.timeout_at(deadline):
            cap.sent_ns = perf_counter_ns()
            response = await client.send(request, stream=True)
            try:
                cap.first_byte_ns = perf_counter_ns()
                cap.status = response.status_code
                phase[0] = ERR_TIMEOUT_BODY
                chunks = response.aiter_raw()
                done = False
                while True:
                    try:
                        if done:  # [DONE] came: the response's end is not waited for long
                            chunk = await asyncio.wait_for(anext(chunks), DONE_GRACE_S)
                        else:
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        if done:
                            break  # complete at [DONE] though the server kept it open
                        raise
                    body = cap.body
                    body += chunk
                    reads = cap.reads
                    reads.append(perf_counter_ns())
                    reads.append(len(body))
                    reads.frombytes(_NO_STAMP)
                    if len(body) > cap.check_at:
                        cap.check_at, kind, message = check_stream(body, cap.max_tokens)
                        if kind is not None:  # beyond a bound: end it, drop the connection
                            cap.error_kind, cap.error_message = kind, message
                            break
                    done = done or (chunk.endswith(b"\n") and ends_with_done(body))
            finally:
                await response.aclose()
        cap.end_ns = cap.reads[-4] if cap.reads else perf_counter_ns()

    async def aclose(self) -> None:
        self.cancel_all()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
        await self._fresh.aclose()


# How long the end of a response is waited for after its [DONE] event (the raw transport's
# sweep interval is the same at most).
DONE_GRACE_S = 0.25

_PHASES = {
    ERR_TIMEOUT_CONNECT: "no connection",
    ERR_TIMEOUT_TLS: "no TLS handshake",
    ERR_TIMEOUT_HEADERS: "no complete response head",
    ERR_TIMEOUT_BODY: "the stream did not end",
}


def _closed(exc: BaseException) -> bool:
    """Whether an httpx protocol error says the peer closed (vs. sent something broken)."""
    text = str(exc).lower()
    return "closed" in text or "disconnected" in text
