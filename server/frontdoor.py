"""Checks every request passes before the app sees it, without reading its body first.

- Host: a browser page can reach this service through a name it rebinds to 127.0.0.1 (DNS
  rebinding) and then read results as if same-origin. Such a request carries the attacker's
  name in Host, so Host must be an IP literal, `localhost`, or a name the service is served
  as (`tokenbench serve --server-name`, the --host name, the machine's hostname).
- Origin: a write that says where it comes from must come from one of those names too.
- Token: writes under /api need the bearer token, checked here before a byte of the body is
  read (FastAPI reads and parses a body before any dependency runs, so four unauthenticated
  100 MB POSTs once took the service from 300 MB to 1.36 GB, and a non-JSON body got 422).
- Size: bodies are capped (Content-Length at once, chunked bodies as they stream): 1 MiB
  for the API, 16 KiB for the login form, the data-file limit for uploads.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException

from server.auth import TOKEN_ENV, token_matches

MAX_BODY_BYTES = 1 << 20
LOGIN_BODY_BYTES = 16 << 10
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# POST paths under /api that only compute an answer (no side effect) and so need no token
# beyond what reads need; everything else under /api that is not a read needs the token.
OPEN_POSTS: frozenset[str] = frozenset()


class BodyTooLarge(HTTPException):
    """Raised from receive() when a streamed body passes its cap (the app answers 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over this endpoint's {limit:,} byte limit")


def host_name(value: str) -> str:
    """The host part of a Host header or an Origin's netloc, lower-case, brackets dropped."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.rsplit(":", 1)[0]
    return value.rstrip(".")


class ServedNames:
    """The names this service answers to: IP literals and localhost always, plus the given."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = {"localhost", *(host_name(n) for n in names if n and n.strip())}

    def allows(self, host: str) -> bool:
        host = host_name(host)
        if host in self.names:
            return True
        try:
            ipaddress.ip_address(host)
            return True  # an address is never a rebound name
        except ValueError:
            return False

    def describe(self) -> str:
        return ", ".join(sorted(self.names)) + ", and any IP address"


class FrontDoor:
    """Pure ASGI middleware: Host, Origin, token and body size, before the body is read."""

    def __init__(
        self,
        app,
        *,
        token: Callable[[], str],
        served: ServedNames,
        upload_limit: Callable[[], int],
    ) -> None:
        self.app = app
        self.token = token
        self.served = served
        self.upload_limit = upload_limit

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        host = headers.get("host")
        if host is not None and not self.served.allows(host):
            await _reply(
                send,
                400,
                f"Host {host!r} is not a name this service is served as "
                f"({self.served.describe()}); the operator can add one with "
                "`tokenbench serve --server-name NAME`",
            )
            return
        if method in READ_METHODS:
            await self.app(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and not self.served.allows(urlsplit(origin).netloc or "null"):
            await _reply(send, 403, f"Origin {origin!r} may not write to this service")
            return
        needs_token = path.startswith("/api/") and not (method == "POST" and path in OPEN_POSTS)
        if needs_token and not token_matches(_bearer(headers), self.token()):
            await _reply(
                send,
                401,
                "this endpoint changes data: send Authorization: Bearer <token> (the token is "
                f"${TOKEN_ENV}, or the one `tokenbench serve` printed at start)",
                {"www-authenticate": "Bearer"},
            )
            return
        limit = self._limit(method, path)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _reply(send, 413, f"request body over this endpoint's {limit:,} byte limit")
            return
        await self._capped(scope, receive, send, limit)

    def _limit(self, method: str, path: str) -> int:
        if method == "PUT" and path.startswith("/api/data/"):
            return self.upload_limit()
        if path == "/login":
            return LOGIN_BODY_BYTES
        return MAX_BODY_BYTES

    async def _capped(self, scope, receive, send, limit: int) -> None:  # noqa: ANN001
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked_send(message) -> None:  # noqa: ANN001
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _reply(send, 413, f"request body over this endpoint's {limit:,} byte limit")


def _bearer(headers: dict[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _reply(send, status: int, detail: str, extra: dict[str, str] | None = None) -> None:  # noqa: ANN001
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
