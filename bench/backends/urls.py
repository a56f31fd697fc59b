"""What a user may type as --base-url, and the one form the rest of tokenbench uses.

The endpoint paths (bench.backends.openai) already start with /v1, so a base URL is the
server's root plus any path prefix in front of /v1 (a gateway's /openai). Users copy URLs
from server banners and OpenAI SDK settings, which end in /v1: `http://host:8000/v1` sent
every request to /v1/v1/completions (issue 15). Accepted here, all meaning the same:
`host:8000`, `http://host:8000`, `http://host:8000/`, `http://host:8000/v1`.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from bench.backends.openai import ENDPOINTS


def normalize_base_url(url: str) -> str:
    """`scheme://host:port[/prefix]` without a trailing `/` or `/v1`; raises ValueError
    naming the URL when it cannot be an http(s) endpoint."""
    shown = shown_url(url)
    text = url.strip()
    if set(text) <= {".", "…"}:  # the README's `--base-url ...`, pasted as it is
        raise ValueError(
            f"base URL {shown!r} is not a URL: give your server's, "
            "e.g. --base-url http://127.0.0.1:8000"
        )
    if text.lower().startswith(("http:", "https:")) and "://" not in text:
        raise ValueError(f"base URL {shown!r}: expected http(s)://HOST:PORT (two slashes)")
    if "://" not in text:
        text = f"http://{text}"  # host:port, as curl and `vllm bench serve --host` take it
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for http://[::1
        raise ValueError(f"base URL {shown!r}: {exc}; expected http(s)://HOST:PORT") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base URL {shown!r}: expected http(s)://HOST:PORT[/PREFIX]")
    if not parts.hostname:
        raise ValueError(f"base URL {shown!r} has no host: expected http://HOST:PORT")
    if not _valid_host(parts.hostname):
        raise ValueError(
            f"base URL {shown!r}: {parts.hostname!r} is not a host name or address "
            "(expected e.g. http://127.0.0.1:8000 or http://my-server:8000)"
        )
    try:
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"base URL {shown!r}: the port must be a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise ValueError(
            f"base URL {shown!r}: a base URL has no ?query or #fragment "
            "(give an API key with --api-key or OPENAI_API_KEY)"
        )
    path = parts.path.rstrip("/")
    for suffix in (*ENDPOINTS, "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _valid_host(host: str) -> bool:
    """A DNS name (labels of letters, digits, '-' and '_', 1-63 characters each) or an IP
    address; getaddrinfo would otherwise fail on '...' or 'a b' with a Unicode traceback."""
    if ":" in host:  # an IPv6 literal, already bracket-checked by urlsplit
        return all(c in "0123456789abcdefABCDEF:." for c in host.split("%")[0])
    labels = host.rstrip(".").split(".")
    return all(
        0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c in "-_") for c in label)
        for label in labels
    )


def shown_url(url: str) -> str:
    """The URL as an error message may quote it: no password, no query or fragment values.

    A rejected URL is echoed back to whoever sent it, to logs and to API clients; the
    secrets people put in URLs (user:password@, ?api_key=) must not travel with it.
    """
    text = url.strip()
    cuts = [i for i in (text.find("?"), text.find("#")) if i >= 0]
    tail = "…" if cuts else ""
    if cuts:
        text = text[: min(cuts) + 1]
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return f"{scheme}{sep}{netloc}{slash}{path}{tail}"
