"""Dialects: how a request body is built and a captured stream is read, per server family.

The hot path only writes a prepared body and records the bytes that come back with their
arrival times (bench.backends.capture); everything that depends on the server's format is
a dialect's: `build_body` before the run, `decode` after each stream. The OpenAI format
(vLLM, SGLang, trtllm-serve, OpenAI: bench.backends.openai) is registered by
openai_family.py; a server with another stream format is one new module in this package
that registers an object with the `Dialect` methods, and --backend, scenario files
(target.backend) and the API accept it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from bench.registry import Registry

if TYPE_CHECKING:  # listing the dialects (the CLI's --help) must not import numpy
    import numpy as np

    from bench.backends.openai import StreamResult


class Dialect(Protocol):
    """What the load generator needs from a server family's wire format."""

    name: str

    def build_body(
        self,
        *,
        endpoint: str,
        model: str,
        prompt: str | list[int] | None = None,
        messages: list[dict] | None = None,
        max_tokens: int,
        ignore_eos: bool,
        extra: dict | None = None,
    ) -> bytes:
        """One request's body, encoded before the run so the hot path only writes bytes."""
        ...

    def decode(self, body: bytes | bytearray, ends: np.ndarray) -> StreamResult:
        """What a finished response body said: which reads carried content (indexes into
        `ends`, the body's length after each read), usage, and any error. Never raises for
        a bad body: a malformed stream is a StreamResult with an error kind."""
        ...


DIALECTS: Registry[Dialect] = Registry(
    "dialect", package=__name__, where="--backend / target.backend"
)

# The API's and scenario's `backend` values: a registered dialect's name.
Backend = DIALECTS.name_type()


def get_dialect(name: str) -> Dialect:
    """The dialect called `name` (any case), or an error listing the known ones."""
    return DIALECTS.get(name.lower())
