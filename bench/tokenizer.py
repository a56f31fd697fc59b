"""A local Hugging Face tokenizer (`--tokenizer PATH`): exact prompt lengths, output counts.

Like `vllm bench serve --tokenizer` and guidellm's processor, but read from disk only: a
folder holding `tokenizer.json` or the file itself, loaded with the `tokenizers` library.
Nothing is ever downloaded. With it, synthetic prompts are rendered to exactly N tokens (as
the tokenizer counts them, special tokens such as BOS left out: the server adds its own), and
a stream that reports no usage has its output tokens counted from its text. Without it,
prompts are common words of about one token each and their lengths are approximate.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
# Rendering to an exact length re-encodes a decoded prefix; a few tries settle any boundary
# effect (a merge across the cut), after which the closest text is kept.
MAX_TRIES = 8


class TokenizerError(ValueError):
    """The tokenizer path cannot be used; the message says why and what to give instead."""


class PromptTokenizer:
    """Counts tokens and renders word text of an exact token length."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        file = _tokenizer_file(Path(path))
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - a dependency of tokenbench
            raise TokenizerError(
                "--tokenizer needs the tokenizers package: pip install tokenizers"
            ) from None
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - the library raises bare Exceptions
            raise TokenizerError(f"--tokenizer {path}: {file} is not a tokenizer ({exc})") from None

    def count(self, text: str) -> int:
        """Tokens in text, without the special tokens a server adds around a prompt."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def check_spells(self, words: list[str]) -> None:
        """Refuse a tokenizer that cannot write prompts from `words`: one whose vocabulary
        lacks them (a word-level tokenizer of other words) maps them to an unknown token that
        decodes to nothing, so every prompt would be rendered empty and refused by the server."""
        ids = self._tok.encode(" ".join(words[:64]), add_special_tokens=False).ids
        kept = self.count(self._tok.decode(ids))
        if kept < len(ids) / 2:
            raise TokenizerError(
                f"--tokenizer {self.path}: of {len(ids)} tokens of plain English words, "
                f"{len(ids) - kept} decode to nothing (its vocabulary lacks them: unknown "
                "tokens), so prompts would be empty; give the served model's own tokenizer"
            )

    def render(self, words: list[str], n: int, head: str = "") -> str:
        """Text of exactly n tokens: `head` (a shared prefix, kept as it is) then `words`
        (repeated as needed), cut at a token.

        The text is encoded, its first n tokens decoded, and the result re-encoded to check:
        a cut inside a word, or the seam after the head, can merge differently, so the cut
        moves until the count is n (in practice at the first or second try).
        """
        if n <= 0:
            return ""
        ids: list[int] = []
        body = list(words) or ["the"]
        start = f"{head} " if head else ""
        while len(ids) < n + 8:
            ids = self._tok.encode(start + " ".join(body), add_special_tokens=False).ids
            if len(ids) < n + 8:
                body = body * 2
        best, best_err = "", n + 1
        k = n
        for _ in range(MAX_TRIES):
            text = self._tok.decode(ids[:k])
            got = self.count(text)
            if got == n and text.startswith(head):
                return text
            if abs(got - n) < best_err and text.startswith(head):
                best, best_err = text, abs(got - n)
            k = max(1, min(len(ids), k + n - got))
        return best or self._tok.decode(ids[:n])

    def __getstate__(self) -> dict:
        # Workers of a distributed run get the plan pickled: send the path, load it there.
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def _tokenizer_file(path: Path) -> Path:
    if path.is_dir():
        file = path / TOKENIZER_FILE
        if not file.is_file():
            found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
            raise TokenizerError(
                f"--tokenizer {path}: no {TOKENIZER_FILE} in this folder (it holds {found}); "
                "give a folder with a Hugging Face tokenizer.json, or the file itself "
                "(tokenbench never downloads one)"
            )
        return file
    if not path.is_file():
        raise TokenizerError(
            f"--tokenizer {path}: not found; give a local folder holding {TOKENIZER_FILE} or "
            "the file itself (tokenbench never downloads one from a hub)"
        )
    return path


def load_tokenizer(path: str | Path | None) -> PromptTokenizer | None:
    """The tokenizer at path (loaded once per process: a sweep plans every point)."""
    return None if path is None else _load(str(Path(path).resolve()))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> PromptTokenizer:
    return PromptTokenizer(path)


def words_for(rng: np.random.Generator, vocabulary: np.ndarray, n: int) -> list[str]:
    """n words drawn from the vocabulary: the raw material render() cuts to length."""
    return vocabulary[rng.integers(0, len(vocabulary), size=max(1, n))].tolist()
