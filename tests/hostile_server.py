"""Hostile and broken streaming servers for the attack matrix (issue 28), on 127.0.0.1.

Each `HostileServer(mode)` listens on a free local port in a thread of its own (its own
event loop), so a test's client (bench.runner, in the test's loop) meets it over real
sockets. Every connection's work is bounded in time (`LIFETIME_S`) and ends when the
client goes away. Modes:

  silent          accept TCP, read, never answer (an https target never finishing TLS;
                  an http one never sending a head)
  comments        a 200 head, then `: xxxx` comment lines and never a data event
  long_line       a 200 head, then one `data:` line that never ends
  endless         a 200 head, then token events forever (max_tokens ignored)
  done_hold       a good stream and [DONE], then neither the last chunk nor a close
  interim         `100 Continue` and `103 Early Hints` before a good 200 stream
  usage:N         a good stream of 8 tokens whose usage claims N completion tokens
  trickle         any request: a body one byte every 50 ms, forever (a model list or a
                  /metrics page that never ends)
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

LIFETIME_S = 20.0  # no connection is served longer than this
TOKENS = 8  # content events in a good stream


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict | str) -> bytes:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    return _chunk(f"data: {text}\n\n".encode())


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def good_stream(claimed: int = TOKENS) -> bytes:
    """8 token events, a usage event claiming `claimed` tokens and [DONE] (no last chunk)."""
    out = [_event({"choices": [{"index": 0, "text": f" t{i}"}]}) for i in range(TOKENS)]
    out.append(_event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": claimed}}))
    out.append(_event("[DONE]"))
    return b"".join(out)


class HostileServer:
    """A local server behaving as `mode` says; `url`, `connections`, `requests`, `close()`."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connections = 0
        self.requests = 0  # POST requests read (a reachability probe opens and closes only)
        self.heads: list[bytes] = []  # each request's head, as it came
        self.bytes_sent = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("hostile server did not start")
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_later(0.05, self._loop.stop)

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            async with asyncio.timeout(LIFETIME_S):
                await self._requests(reader, writer)
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            if self.mode == "silent":
                head = await reader.readuntil(b"\r\n\r\n")  # (a TLS hello never ends so)
                self.requests += head.startswith(b"POST ")
                await reader.read()  # never answered: until the client gives up and closes
                return
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests += head.startswith(b"POST ")
            self.heads.append(head)
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            await self._answer(writer)
            if self.mode in ("done_hold",):
                await reader.read(1)  # hold the response open until the client closes
                return

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.bytes_sent += len(data)
        await writer.drain()

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        if mode == "comments":
            await self._send(writer, HEAD)
            block = _chunk(b": " + b"x" * 4000 + b"\n\n") * 16
            while True:
                await self._send(writer, block)
        elif mode == "long_line":
            await self._send(writer, HEAD + _chunk(b'data: {"choices":[{"text":"'))
            block = _chunk(b"a" * 65536)
            while True:
                await self._send(writer, block)
        elif mode == "endless":
            await self._send(writer, HEAD)
            block = _event({"choices": [{"index": 0, "text": " tok"}]}) * 64
            while True:
                await self._send(writer, block)
        elif mode == "trickle":  # any request: a JSON body one byte at a time, forever
            await self._send(writer, HEAD + _chunk(b'{"data": ['))
            while True:
                await self._send(writer, _chunk(b" "))
                await asyncio.sleep(0.05)
        elif mode == "done_hold":
            await self._send(writer, HEAD + good_stream())
        elif mode == "interim":
            interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n"
            await self._send(writer, interim)
            await asyncio.sleep(0.01)
            await self._send(writer, HEAD + good_stream() + b"0\r\n\r\n")
        elif mode.startswith("usage:"):
            await self._send(writer, HEAD + good_stream(int(mode[6:])) + b"0\r\n\r\n")
        else:
            raise ValueError(f"unknown hostile mode {mode!r}")


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    """Poll `predicate` until true or timeout; never a fixed sleep as the condition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
