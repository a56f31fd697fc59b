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
        # No tokenizer (a word is a token): blocks are runs of pooled 16-word chunks
        # (`ChunkPool`), chosen by hashing (seed, id, position), a whole prompt at once.
        self._pool = chunk_pool(tuple(self.words.tolist())) if self.unit_costs else None
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
        if self._pool is not None:
            return self._pool.prompt(self.seed, self.hash_ids[index], n, self.block_size)
        parts = []
        for k, h in enumerate(self.hash_ids[index]):
            size = min(self.block_size, n - k * self.block_size)
            if size <= 0:
                break
            parts.append(self._block(h, size))
        return "".join(parts)

    def _render_block(self, hash_id: int, size: int) -> str:
        """`size` tokens of words for this id: the same words (a prefix of them for a short
        last block) wherever the id appears. With a tokenizer: words drawn one by one,
        topped up to the exact token count (the pooled chunks cannot be cut to tokens)."""
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


class ReuseCounter:
    """The hit rate requests in send order imply with a cache that keeps every block, counted
    one request at a time: a block is a hit when an earlier block had its id. Holds one
    entry per distinct block; `max_blocks` bounds that (the count then stops and says how
    many requests it covers)."""

    def __init__(self, block_size: int, max_blocks: int | None = None) -> None:
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.seen: set = set()
        self.hit_tokens = self.total_tokens = self.hit_blocks = self.blocks = 0
        self.requests = 0
        self.full = False

    def add(self, ids: Sequence[Hashable], n: int) -> bool:
        """Count one request (its block ids, its n prompt tokens); False, counting nothing,
        once the bound is reached."""
        if self.full or (
            self.max_blocks is not None and len(self.seen) + len(ids) > self.max_blocks
        ):
            self.full = True
            return False
        for k, h in enumerate(ids):
            size = min(self.block_size, n - k * self.block_size)
            self.blocks += 1
            self.total_tokens += size
            if h in self.seen:
                self.hit_blocks += 1
                self.hit_tokens += size
            self.seen.add(h)
        self.requests += 1
        return True

    def result(self) -> dict:
        return {
            "cache": "infinite",
            "block_size": self.block_size,
            "blocks": self.blocks,
            "blocks_seen_before": self.hit_blocks,
            "cached_tokens": self.hit_tokens,
            "prompt_tokens": self.total_tokens,
            "share": self.hit_tokens / self.total_tokens if self.total_tokens else None,
        }


def intended_reuse(
    hash_ids: Sequence[Sequence[Hashable]], input_lens: Sequence[int], block_size: int
) -> dict:
    """The hit rate requests in this order imply, with a cache that keeps every block:
    prompt tokens (and blocks) whose hash id an earlier block had."""
    counter = ReuseCounter(block_size)
    for ids, n in zip(hash_ids, input_lens, strict=True):
        counter.add(ids, n)
    return counter.result()


# Words per block when the reuse a workload implies is judged from its prompts' text
# (`content_reuse`): vLLM's 16-token blocks, a word being the simulator's token.
CONTENT_BLOCK = 16
# At most this many distinct text blocks are remembered (~70 MB measured: a hash and a set slot
# each), 16M prompt tokens of distinct text; later requests are left out and said so.
CONTENT_MAX_BLOCKS = 1_000_000


def block_keys(tokens: Sequence, block_tokens: int) -> list[int]:
    """Chained keys of the full blocks of `tokens` (words or token ids): equal key i means
    the first i+1 blocks are equal. A last partial block has no key (engines cache full
    blocks only)."""
    keys, parent = [], 0
    for k in range(len(tokens) // block_tokens):
        parent = hash((parent, *tokens[k * block_tokens : (k + 1) * block_tokens]))
        keys.append(parent)
    return keys


class ContentReuse:
    """`intended_reuse` of prompts given as words (or token ids), one at a time in send
    order: a full block is a hit when an earlier prompt had the same prefix up to and
    including it (the chained keys the simulator's cache matches on); a last partial block
    never is. For workloads without a block-hashed trace (shared prefixes, multi-turn
    sessions, a traffic mix). Bounded by CONTENT_MAX_BLOCKS distinct blocks."""

    def __init__(self, block_tokens: int = CONTENT_BLOCK, max_blocks: int = CONTENT_MAX_BLOCKS):
        self.counter = ReuseCounter(block_tokens, max_blocks)
        self.offered = 0

    def add(self, tokens: Sequence) -> None:
        size = self.counter.block_size
        keys: list = list(block_keys(tokens, size))
        if len(tokens) % size:
            keys.append(("tail", self.offered))  # its own id: engines cache full blocks only
        self.offered += 1
        self.counter.add(keys, len(tokens))

    def result(self) -> dict:
        out = self.counter.result()
        out["basis"] = f"prompt text, {self.counter.block_size}-word blocks"
        if self.counter.requests < self.offered:
            out["requests"] = self.counter.requests
            out["note"] = (
                f"counted over the first {self.counter.requests:,} of {self.offered:,} "
                f"requests (at most {self.counter.max_blocks:,} distinct blocks are kept)"
            )
        return out


def content_reuse(prompts: Iterable[Sequence], block_tokens: int = CONTENT_BLOCK) -> dict:
    """ContentReuse over these prompts, in order."""
    reuse = ContentReuse(block_tokens)
    for tokens in prompts:
        reuse.add(tokens)
    return reuse.result()


CHUNK_WORDS = 16  # words per pooled chunk
POOL_CHUNKS = 1 << 16  # chunks per pool: 2^20 words, about 8.5 MB per process and vocabulary


class ChunkPool:
    """Block text without a tokenizer, from a pool of POOL_CHUNKS pre-joined chunks of
    CHUNK_WORDS random words (drawn once per process from a fixed seed, so every process
    and worker has the same pool). Word j*16..j*16+15 of block id h in run `seed` is chunk
    hash(seed, h, j) of the pool, so equal ids give identical text, a short last block is a
    prefix of its id's full text, and a prompt is joined from ready strings: drawing a
    block's 512 words one by one cost ~27 us a block, ~0.65 ms per 12k-token prompt
    (benchmarks/loadgen.py agentic). Two different ids share a chunk at the same place with
    chance 1/65,536 per chunk; a prefix cache matches only whole equal prefixes, so that
    makes a false hit only where the two prompts are equal up to it (the first 16 words of
    two different first blocks: a few 16-token blocks in a 10,000-request trace)."""

    def __init__(self, vocabulary: Sequence[str]) -> None:
        rng = np.random.default_rng(0x7B10C5)
        spaced = [" " + w for w in vocabulary]
        flat = [spaced[i] for i in rng.integers(0, len(spaced), POOL_CHUNKS * CHUNK_WORDS)]
        self.chunks = [
            "".join(flat[k * CHUNK_WORDS : (k + 1) * CHUNK_WORDS]) for k in range(POOL_CHUNKS)
        ]

    def prompt(self, seed: int, hash_ids: Sequence[int], n: int, block_size: int) -> str:
        """The first n words of the blocks `hash_ids` (each `block_size` words) of run `seed`."""
        used = min(len(hash_ids), -(-n // block_size)) if n > 0 else 0
        if not used:
            return ""
        per = -(-block_size // CHUNK_WORDS)  # chunks a full block spans
        ids = np.array([h & _M64 for h in hash_ids[:used]], dtype=np.uint64)
        with np.errstate(over="ignore"):
            x = _mix_np(ids ^ np.uint64(_mix(seed & _M64)))
            x = _mix_np(x[:, None] + np.arange(1, per + 1, dtype=np.uint64) * _GOLDEN)
        choice = (x >> np.uint64(64 - POOL_CHUNKS.bit_length() + 1)).tolist()
        chunks, parts = self.chunks, []
        for k, row in enumerate(choice):
            size = min(block_size, n - k * block_size)
            full, rest = divmod(size, CHUNK_WORDS)
            parts += [chunks[c] for c in row[:full]]
            if rest:  # a chunk's first words: a prefix of what a longer block has there
                parts.append(" ".join(chunks[row[full]].split(" ")[: rest + 1]))
        return "".join(parts)


_POOLS: dict[tuple[str, ...], ChunkPool] = {}
_POOLS_LOCK = threading.Lock()


def chunk_pool(vocabulary: tuple[str, ...]) -> ChunkPool:
    """The process's one pool for a vocabulary (built on first use, ~60 ms)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(vocabulary)
        if pool is None:
            pool = _POOLS[vocabulary] = ChunkPool(vocabulary)
        return pool


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """`_mix` on a uint64 array (wrapping arithmetic, as the integers' & _M64 does)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


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
