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
    if "://" not in text:
        text = f"http://{text}"  # host:port, as curl and `vllm bench serve --host` take it
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base URL {shown!r}: expected http(s)://HOST:PORT[/PREFIX]")
    if not parts.hostname:
        raise ValueError(f"base URL {shown!r} has no host: expected http://HOST:PORT")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"base URL {shown!r}: the port is not a number") from None
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
