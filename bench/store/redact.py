"""Keep API keys out of the database: strip URLs, scrub known secret strings and key fields.

Three layers, because a key can reach stored text in several ways: the endpoint URL
(userinfo, ?api_key=), the scenario file (an `api_key:` line), and free text such as a 401
error message echoing the header. Every string the store writes passes through a Redactor.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Query parameters and scenario keys whose values are credentials.
SECRET_NAME = re.compile(
    r"(api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|passwd|"
    r"authorization|bearer|x-api-key|key|sig|signature|credential)s?$",
    re.IGNORECASE,
)
# `name: value` / `name = value` / `"name": "value"` pairs in YAML, JSON or TOML text.
SECRET_PAIR = re.compile(
    r"""(?P<key>["']?[\w-]*(?:api[_-]?key|apikey|token|secret|password|passwd|authorization)["']?"""
    r"""\s*[:=]\s*)(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s,}#\n]+)""",
    re.IGNORECASE,
)
BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
# Environment variables whose values are scrubbed wherever they appear.
SECRET_ENV = re.compile(r"(API_KEY|APIKEY|_TOKEN|SECRET)$", re.IGNORECASE)
MIN_SECRET_LEN = 6


def strip_url(url: str | None) -> str | None:
    """The endpoint URL without userinfo and without credential query parameters."""
    if url is None:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    query = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not SECRET_NAME.search(k)
    ]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))


def env_secrets() -> list[str]:
    """Values of API-key-like environment variables (OPENAI_API_KEY, HF_TOKEN, ...)."""
    return [v for k, v in os.environ.items() if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_LEN]


def _mask_pair(m: re.Match) -> str:
    value = m.group("value").strip("\"'")
    if value.isdigit() or value.lower() in ("null", "none", "~", "true", "false", ""):
        return m.group(0)  # max_tokens: 128 is not a secret
    return m.group("key") + MASK


class Redactor:
    """Scrubs the given secrets (plus env keys, key fields, bearer tokens) from text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        found = {s for s in (*secrets, *env_secrets()) if s and len(s) >= MIN_SECRET_LEN}
        self.secrets = sorted(found, key=len, reverse=True)  # longest first: no partial leaks

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        text = BEARER.sub(rf"\g<1>{MASK}", text)
        return SECRET_PAIR.sub(_mask_pair, text)

    def maybe(self, text: str | None) -> str | None:
        return None if text is None else self(text)
