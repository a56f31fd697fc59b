"""Who may do what: bearer token for writes (and for reads off loopback), run-target allow-list.

The token guards every write because a write can start load against a server or delete
results. Reads are open when the service listens on loopback only (the operator's own
machine) and need the token otherwise, unless the operator opts out with open_reads. The
allow-list keeps the service from being used to send load at arbitrary hosts: a run's
target host must be listed literally, or fall in a listed network (CIDR). Names are compared
as written, never resolved, so DNS cannot widen the list.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

TOKEN_ENV = "TOKENBENCH_API_TOKEN"
COOKIE = "tokenbench_token"
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def resolve_token(token: str | None = None) -> tuple[str, bool]:
    """The API token: explicit, else $TOKENBENCH_API_TOKEN, else a new random one.

    Returns (token, generated) so the caller prints a generated token once.
    """
    token = token or os.environ.get(TOKEN_ENV)
    if token:
        return token, False
    return secrets.token_urlsafe(24), True


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost: addresses only this machine can reach."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def token_matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, detail=message, headers={"WWW-Authenticate": "Bearer"})


class Guard:
    """The app's auth policy; FastAPI dependencies call read() and write()."""

    def __init__(self, token: str, *, open_reads: bool) -> None:
        self.token = token
        self.open_reads = open_reads

    def write(self, request: Request) -> None:
        """Writes need `Authorization: Bearer <token>` (never a cookie: no cross-site writes)."""
        if not token_matches(presented_token(request), self.token):
            raise unauthorized(
                "this endpoint changes data: send Authorization: Bearer <token> "
                f"(the token is ${TOKEN_ENV}, or the one `tokenbench serve` printed at start)"
            )

    def read_allowed(self, request: Request) -> bool:
        if self.open_reads:
            return True
        given = presented_token(request) or request.cookies.get(COOKIE)
        return token_matches(given, self.token)

    def read(self, request: Request) -> None:
        if not self.read_allowed(request):
            raise unauthorized(
                "reads need the API token on this address: send Authorization: Bearer <token>"
            )


class AllowList:
    """Hosts (exact names or IPs) and networks (CIDR) a background run may target."""

    def __init__(self, entries: list[str] | None = None) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in [*LOOPBACK_HOSTS, "127.0.0.0/8", *(entries or [])]:
            entry = entry.strip().lower().strip("[]")
            if not entry:
                continue
            if "/" in entry:
                try:
                    self.networks.append(ipaddress.ip_network(entry, strict=False))
                    continue
                except ValueError:
                    raise ValueError(
                        f"--allow-host {entry!r}: not a host or a CIDR network"
                    ) from None
            self.names.add(entry)

    def describe(self) -> str:
        return ", ".join(sorted(self.names) + [str(n) for n in self.networks])

    def check(self, base_url: str) -> str | None:
        """None if the URL may be targeted, else the reason it may not."""
        try:
            parts = urlsplit(base_url)
            host = (parts.hostname or "").lower()
            _ = parts.port  # raises on a bad port
        except ValueError as exc:
            return f"{base_url!r} is not a valid URL ({exc})"
        if parts.scheme not in ("http", "https") or not host:
            return f"{base_url!r} is not an http(s) URL with a host"
        if host in self.names:
            return None
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None and any(address in net for net in self.networks):
            return None
        return (
            f"host {host!r} is not in the service's allow-list ({self.describe()}); "
            "the operator can add it with `tokenbench serve --allow-host HOST`"
        )


class UpstreamKeys:
    """Where the service's upstream key ($OPENAI_API_KEY) may be sent: only to the hosts the
    operator named for it (`tokenbench serve --upstream-key HOST[:PORT]`, repeatable), never
    to a target a token holder names (anyone holding the token could otherwise point a job
    at a listener of theirs and read the key off the wire). HOST alone matches any port."""

    def __init__(self, entries: list[str] | None = None, env: str = "OPENAI_API_KEY") -> None:
        self.env = env
        self.hosts: set[tuple[str, int | None]] = set()
        for entry in entries or []:
            try:
                parts = urlsplit("//" + entry.strip())
                host, port = (parts.hostname or "").lower(), parts.port
            except ValueError:
                host, port = "", None
            if not host or parts.path or parts.username:
                raise ValueError(f"--upstream-key {entry!r}: give HOST or HOST:PORT")
            self.hosts.add((host, port))

    def describe(self) -> str:
        return ", ".join(sorted(h if p is None else f"{h}:{p}" for h, p in self.hosts)) or "none"

    def key_for(self, base_url: str) -> str | None:
        """The key to send to this target, or None when the operator did not name its host."""
        try:
            parts = urlsplit(base_url)
            host = (parts.hostname or "").lower()
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        if (host, port) in self.hosts or (host, None) in self.hosts:
            return os.environ.get(self.env) or None
        return None
