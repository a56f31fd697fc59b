"""Keep API keys out of the database: scrub by structure, never by a regex over stored data.

A key can reach stored text in several ways: the endpoint URL (userinfo, ?api_key=), the
scenario (an `api_key:` field, an Authorization header, a URL with a password), and free
text such as a 401 error message echoing the header. Structured data (the scenario) is
scrubbed field by field and serialised again, so a stored scenario always parses back: a
regex over serialised text once ate the closing quote of `"label": "h100 token=fast"` and
left runs that no reader could load. Only free text (error messages) goes through patterns.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import yaml

MASK = "***"
# Query parameters and structured keys whose values are credentials.
SECRET_NAME = re.compile(
    r"(api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|passwd|"
    r"authorization|bearer|x-api-key|key|sig|signature|credential)s?$",
    re.IGNORECASE,
)
# `name: value` / `name = value` pairs in free text (error messages only). The value never
# takes a quote, so text that happens to be quoted keeps its quotes.
SECRET_PAIR = re.compile(
    r"""(?P<key>["']?[\w-]*(?:api[_-]?key|apikey|token|secret|password|passwd|authorization)["']?"""
    r"""\s*[:=]\s*)(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s,}#\n"']+)""",
    re.IGNORECASE,
)
BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
# Environment variables whose values are scrubbed wherever they appear.
SECRET_ENV = re.compile(r"(API_KEY|APIKEY|_TOKEN|SECRET)$", re.IGNORECASE)
MIN_SECRET_LEN = 6
_TRIVIAL = ("", "null", "none", "~", "true", "false")


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


def mask_url(url: str) -> str:
    """The URL with its userinfo and credential query values replaced by ***, else as given.

    Positional, so a short password cannot mask an unrelated part of the URL.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    pairs = []
    for pair in parts.query.split("&") if parts.query else []:
        name, eq, value = pair.partition("=")
        pairs.append(f"{name}={MASK}" if eq and value and SECRET_NAME.search(name) else pair)
    query = "&".join(pairs)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def env_secrets() -> list[str]:
    """Values of API-key-like environment variables (OPENAI_API_KEY, HF_TOKEN, ...)."""
    return [v for k, v in os.environ.items() if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_LEN]


def _mask_pair(m: re.Match) -> str:
    value = m.group("value").strip("\"'")
    if value.isdigit() or value.lower() in _TRIVIAL:
        return m.group(0)  # max_tokens: 128 is not a secret
    return m.group("key") + MASK


def _is_secret_value(key: object, value: object) -> bool:
    """A string under a credential-named key (api_key, password, Authorization...)."""
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and bool(SECRET_NAME.search(key))
        and value.strip().lower() not in _TRIVIAL
    )


class Redactor:
    """Scrubs the given secrets (plus env keys, key fields, bearer tokens) from stored data."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        found = {s for s in (*secrets, *env_secrets()) if s and len(s) >= MIN_SECRET_LEN}
        self.secrets = sorted(found, key=len, reverse=True)  # longest first: no partial leaks

    def known(self, text: str) -> str:
        """Only the exact secrets and bearer tokens: safe for short text like a run's label."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return BEARER.sub(rf"\g<1>{MASK}", text)

    def __call__(self, text: str) -> str:
        """Free text (an error message): exact secrets, bearer tokens and `key=value` pairs."""
        return SECRET_PAIR.sub(_mask_pair, self.known(text))

    def maybe(self, text: str | None) -> str | None:
        return None if text is None else self(text)

    def maybe_known(self, text: str | None) -> str | None:
        return None if text is None else self.known(text)

    def structure(self, value: Any) -> Any:
        """A scrubbed copy of parsed data: credential fields masked, URLs masked, secrets out."""
        if isinstance(value, dict):
            return {
                k: MASK if _is_secret_value(k, v) else self.structure(v) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.structure(v) for v in value]
        if isinstance(value, str):
            return self.known(mask_url(value) if "://" in value else value)
        return value

    def scenario(self, scenario: str | dict | None) -> str | None:
        """The scenario as stored: always parses back to the scrubbed structure.

        A dict is stored as JSON. Text (YAML or JSON) keeps its layout and comments when
        masking the secret values found by structure leaves text that parses back to the
        scrubbed structure; otherwise the scrubbed structure is stored as JSON. Text that
        does not parse at all is free text.
        """
        if scenario is None:
            return None
        if not isinstance(scenario, str):
            return json.dumps(self.structure(scenario), indent=2, default=str)
        try:
            data = yaml.safe_load(scenario)
        except yaml.YAMLError:
            return self(scenario)
        if not isinstance(data, dict | list):
            return self.known(scenario)
        clean = self.structure(data)
        text = scenario
        for secret in sorted(set(self._values(data)) | set(self.secrets), key=len, reverse=True):
            text = text.replace(secret, MASK)
        for candidate in (text, repair_scenario_text(text)):
            try:
                if yaml.safe_load(candidate) == clean:
                    return candidate
            except yaml.YAMLError:
                continue
        return json.dumps(clean, indent=2, default=str)

    def _values(self, value: Any, key: object = None) -> Iterable[str]:
        """Long-enough secret strings found by structure (text masking uses them)."""
        if _is_secret_value(key, value) and len(value) >= MIN_SECRET_LEN:
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from self._values(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from self._values(v)
        elif isinstance(value, str) and "://" in value and mask_url(value) != value:
            yield value  # the whole URL: masking its parts in text is left to the fallback


def scenario_mapping(text: str | None) -> dict:
    """A stored scenario as a dict, never raising: {} when absent or unreadable.

    Runs stored before scrubbing went by structure can have a closing quote eaten after a
    mask (`"label": "h100 token=***,`); repair_scenario_text puts it back first.
    """
    if not text:
        return {}
    for candidate in (text, repair_scenario_text(text)):
        try:
            data = yaml.safe_load(candidate)
        except yaml.YAMLError:
            continue
        return data if isinstance(data, dict) else {}
    return {}


# `"key": "h100 token=***,`: a JSON string whose closing quote the old pattern ate.
_EATEN_QUOTE = re.compile(r'^(?P<head>\s*"[^"\n]*"\s*:\s*"[^"\n]*\*\*\*)(?P<tail>,?)\s*$')
# `api_key: ***` / `"api_key": ***,`: a bare mask where a value starts (YAML reads an alias).
_BARE_MASK = re.compile(
    r'^(?P<head>\s*(?:-\s+)?["\']?[\w-]+["\']?\s*:\s*)\*\*\*(?P<tail>\s*,?\s*)$'
)


def repair_scenario_text(text: str) -> str:
    """Undo the old pattern redaction's damage to scenario text, line by line.

    The old pattern masked `token=fast"` to `token=***`, dropping a JSON value's closing
    quote, and `api_key: sk-...` to `api_key: ***`, which YAML reads as a broken alias.
    Both get their quotes back; lines the old pattern did not damage come back unchanged.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _EATEN_QUOTE.match(line)
        if m is not None:
            lines[i] = f'{m.group("head")}"{m.group("tail")}'
            continue
        m = _BARE_MASK.match(line)
        if m is not None:
            lines[i] = f'{m.group("head")}"{MASK}"{m.group("tail")}'
    return "\n".join(lines)
