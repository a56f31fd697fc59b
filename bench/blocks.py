"""Prompts built from hash-identified blocks, so a trace's KV-cache reuse is reproduced.

A block-hashed trace (Mooncake's: bench/traces/mooncake.py) gives each request one hash
id per `block_size` prompt tokens, equal ids meaning identical blocks. Here each id gets
its own words, drawn from a generator seeded by (run seed, id), so equal ids give
byte-identical text wherever they appear, and a request's prompt is its blocks one after
another. Each block is whole words, each word with its leading space: a pre-tokenizer
splits text at those spaces, so a prompt's tokens are its blocks' tokens end to end.

With a tokenizer, every word's cost in tokens is counted once, and a block takes words
while they fit and then a filler of exactly the tokens left, so a block is exactly
`block_size` tokens (the last block: what the input length leaves) and the prompt exactly
the trace's input length. Without one, words are about one token each (the project's usual
approximation; the server's usage reports the true count).

The reuse the trace implies is counted here too (`intended_reuse`): with a cache large
enough to keep everything, a block is a hit when its id was seen before.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path

import numpy as np

from bench.tokenizer import PromptTokenizer

DEFAULT_BLOCK_SIZE = 512  # Mooncake's traces; AIPerf's and inference-perf's default too


class BlockPrompts:
    """Renders request i's prompt from its hash ids; checks ids against lengths."""

    def __init__(
        self,
        rows: Sequence[dict],
        *,
        block_size: int,
        seed: int,
        vocabulary: Sequence[str],
        tokenizer: PromptTokenizer | None = None,
        path: Path | None = None,
    ) -> None:
        self.block_size = block_size
        self.seed = seed
        self.hash_ids: list[list[int]] = []
        self.input_lens: list[int] = []
        for i, row in enumerate(rows):
            ids, n = row["hash_ids"], int(row["input_len"])
            want = math.ceil(n / block_size)
            if len(ids) != want:
                where = f"trace file {path} line {row.get('line', i + 1)}"
                raise ValueError(
                    f"{where}: {len(ids)} hash_ids for input_length {n}, but blocks of "
                    f"{block_size} tokens need {want}; give the trace's block size "
                    "(workload.block_size / --block-size)"
                )
            self.hash_ids.append(list(ids))
            self.input_lens.append(n)
        self.words = np.array(list(vocabulary))
        if tokenizer is None:
            self.costs = np.ones(len(self.words), dtype=np.int64)
        else:
            self.costs = np.array([tokenizer.count(" " + w) for w in self.words], dtype=np.int64)
        self.fill = _fillers(self.words.tolist(), self.costs.tolist())
        self.unit_costs = bool((self.costs == 1).all())
        self._block = functools.lru_cache(maxsize=4096)(self._render_block)
        # A block's words come from a generator put in a state derived from (seed, id):
        # seeding a fresh generator per block cost more than drawing its words.
        self._bits = np.random.PCG64(0)
        self._gen = np.random.Generator(self._bits)
        self._inc = self._bits.state["state"]["inc"]
        self._lock = threading.Lock()

    def prompt(self, index: int, input_len: int | None = None) -> str:
        """Request `index`'s prompt: its blocks in order, the last cut to what input_len
        leaves (input_len defaults to the trace's)."""
        n = self.input_lens[index] if input_len is None else input_len
        parts = []
        for k, h in enumerate(self.hash_ids[index]):
            size = min(self.block_size, n - k * self.block_size)
            if size <= 0:
                break
            parts.append(self._block(h, size))
        return "".join(parts)

    def _render_block(self, hash_id: int, size: int) -> str:
        """`size` tokens of words for this id: the same words (a prefix of them for a short
        last block) wherever the id appears."""
        with self._lock:  # one generator, put in this id's own state: no seeding cost
            self._bits.state = {"bit_generator": "PCG64", "state": {
                "state": _state(self.seed, hash_id), "inc": self._inc},
                "has_uint32": 0, "uinteger": 0}  # fmt: skip
            idx = self._gen.integers(0, len(self.words), size=size)
        if self.unit_costs:  # no tokenizer: a word is a token, the block is `size` words
            return " " + " ".join(self.words[idx].tolist())
        cum = np.cumsum(self.costs[idx])
        k = int(np.searchsorted(cum, size, side="right"))
        used = int(cum[k - 1]) if k else 0
        words = [*self.words[idx[:k]].tolist(), *self.fill[size - used]]
        return " " + " ".join(words) if words else ""  # each word after its own space

    def intended_reuse(self, count: int | None = None) -> dict:
        """The hit rate the first `count` requests imply (bench.blocks.intended_reuse)."""
        return intended_reuse(self.hash_ids[:count], self.input_lens[:count], self.block_size)


def intended_reuse(
    hash_ids: Sequence[Sequence[Hashable]], input_lens: Sequence[int], block_size: int
) -> dict:
    """The hit rate requests in this order imply, with a cache that keeps every block:
    prompt tokens (and blocks) whose hash id an earlier block had."""
    seen: set = set()
    hit_tokens = total_tokens = hit_blocks = blocks = 0
    for ids, n in zip(hash_ids, input_lens, strict=True):
        for k, h in enumerate(ids):
            size = min(block_size, n - k * block_size)
            blocks += 1
            total_tokens += size
            if h in seen:
                hit_blocks += 1
                hit_tokens += size
            seen.add(h)
    return {
        "cache": "infinite",
        "block_size": block_size,
        "blocks": blocks,
        "blocks_seen_before": hit_blocks,
        "cached_tokens": hit_tokens,
        "prompt_tokens": total_tokens,
        "share": hit_tokens / total_tokens if total_tokens else None,
    }


# Words per block when the reuse a workload implies is judged from its prompts' text
# (`content_reuse`): vLLM's 16-token blocks, a word being the simulator's token.
CONTENT_BLOCK = 16


def block_keys(tokens: Sequence, block_tokens: int) -> list[int]:
    """Chained keys of the full blocks of `tokens` (words or token ids): equal key i means
    the first i+1 blocks are equal. A last partial block has no key (engines cache full
    blocks only)."""
    keys, parent = [], 0
    for k in range(len(tokens) // block_tokens):
        parent = hash((parent, *tokens[k * block_tokens : (k + 1) * block_tokens]))
        keys.append(parent)
    return keys


def content_reuse(prompts: Iterable[Sequence], block_tokens: int = CONTENT_BLOCK) -> dict:
    """`intended_reuse` of prompts given as words (or token ids), in send order: a full block
    is a hit when an earlier prompt had the same prefix up to and including it (the chained
    keys the simulator's cache matches on); a last partial block never is. For workloads
    without a block-hashed trace (shared prefixes, multi-turn sessions, a traffic mix)."""
    ids: list[list] = []
    lens: list[int] = []
    for n, tokens in enumerate(prompts):
        keys: list = list(block_keys(tokens, block_tokens))
        if len(tokens) % block_tokens:
            keys.append(("tail", n))  # its own id: engines cache full blocks only
        ids.append(keys)
        lens.append(len(tokens))
    out = intended_reuse(ids, lens, block_tokens)
    out["basis"] = f"prompt text, {block_tokens}-word blocks"
    return out


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer to a well-spread one."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


_M64 = (1 << 64) - 1


def _state(seed: int, hash_id: int) -> int:
    """A 128-bit PCG64 state for block `hash_id` of run `seed`: the same on every run and
    process, different for every (seed, id)."""
    hi = _mix((seed & _M64) ^ 0x5851F42D4C957F2D)
    lo = _mix(hi ^ (hash_id & _M64))
    return (_mix(hi ^ lo) << 64) | lo


def _fillers(words: list[str], costs: list[int]) -> list[list[str]]:
    """For each r from 0 to the largest word cost, words whose costs add up to exactly r
    (cheapest words first), so any block can be topped up to its exact size."""
    top = max(costs)
    order = sorted(range(len(words)), key=lambda i: costs[i])
    fill: list[list[str] | None] = [[]] + [None] * top
    for r in range(1, top + 1):
        for i in order:
            c = costs[i]
            if c <= r and fill[r - c] is not None:
                fill[r] = [*fill[r - c], words[i]]  # type: ignore[misc]
                break
    missing = [r for r, f in enumerate(fill) if f is None]
    if missing:
        raise ValueError(
            f"the tokenizer splits every prompt word into {min(costs)}+ tokens, so a block "
            f"cannot be topped up by {missing[0]} token(s); use the model's own tokenizer"
        )
    return fill  # type: ignore[return-value]
