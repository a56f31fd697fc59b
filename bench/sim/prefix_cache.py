"""The simulated engine's prefix cache: which prompt tokens it can take from KV it already has.

A prompt is matched as a chain of block keys: key i is a hash of key i-1 and the i-th block of
`block_tokens` tokens, so equal keys mean equal prefixes, whoever sent the prompt
(`block_keys` hashes the tokens the HTTP simulator counts; `trace_block_keys` derives the same
chain from a block-hashed trace's ids without rendering its text). Three policies, one per
engine family (profiles/prefix_cache.yaml says which and cites each engine's code):

- `lru` (vLLM): computed blocks stay in the KV pool after their request ends, counted free
  but still cached; allocating evicts the least recently freed one (a request's tail first).
- `radix` (SGLang, TensorRT-LLM): the same pool, but only an unreferenced leaf of the prefix
  tree can be evicted, least recently used first, so a prefix outlives its extensions.
- `slots` (llama.cpp's llama-server): no shared pool; each slot keeps its last prompt, a
  request takes the idle slot sharing the longest prefix, and prompts displaced from a slot
  wait in a host-RAM prompt cache to be loaded back.

The pooled policies share the engine's KV blocks: a block held by a cached prefix is the same
memory a running request would otherwise need, so the cache is as large as the KV room left
after weights (bench.sim.memory) minus what running requests hold, as in the engines.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from bench.blocks import block_keys  # one chain for the simulator and the intended reuse

PROFILE = Path(__file__).parent / "profiles" / "prefix_cache.yaml"
POLICIES = ("lru", "radix", "slots")
OFF = "off"


@lru_cache(maxsize=1)
def _profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


def policy_for(engine_family: str, override: str | None = None) -> str:
    """The cache policy an engine uses (override: a policy name, or "off")."""
    if override is not None:
        if override not in (*POLICIES, OFF):
            raise ValueError(
                f"unknown prefix cache {override!r}; choose one of {', '.join((*POLICIES, OFF))}"
            )
        return override
    return _profile()["engines"].get(engine_family, OFF)


def trace_block_keys(
    hash_ids: Sequence[int], input_len: int, trace_block: int, block_tokens: int
) -> list[int]:
    """`block_keys` of a prompt built from a block-hashed trace (bench.blocks), from its ids:
    equal ids are identical text, and a short last block is a prefix of its id's full text,
    so token j of trace block k is identified by (block k's id, j). No text is rendered."""
    keys, parent = [], 0
    for k in range(input_len // block_tokens):
        first = k * block_tokens
        b, j = divmod(first, trace_block)
        if (first + block_tokens - 1) // trace_block != b:
            # a cache block straddling two trace blocks (block sizes that do not divide)
            parent = hash((parent, hash_ids[b], j, hash_ids[b + 1]))
        else:
            parent = hash((parent, hash_ids[b], j))
        keys.append(parent)
    return keys


@dataclass
class Hit:
    """What a lookup found: `tokens` prompt tokens cached; `revive` engine blocks that were
    free (cached, unreferenced) and become held when the request takes them."""

    tokens: int
    revive: int
    nodes: list  # the pooled cache's nodes, or the slot plan
    shared: int = 0  # engine blocks the hit's nodes hold (pooled caches)


class _Node:
    __slots__ = ("access", "children", "key", "parent", "present", "ref")

    def __init__(self, key: int, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.ref = 1
        self.children = 0
        self.access = 0
        self.present = True


class BlockCache:
    """vLLM's LRU of free blocks or SGLang's radix tree with LRU leaf eviction, over the
    engine's KV pool. Counted in engine blocks: one cache block is `unit` engine blocks."""

    pooled = True

    def __init__(self, policy: str, block_tokens: int, unit: int) -> None:
        if policy not in ("lru", "radix"):
            raise ValueError(f"BlockCache takes lru or radix, not {policy!r}")
        self.policy = policy
        self.block_tokens = block_tokens
        self.unit = unit
        self.nodes: dict[int, _Node] = {}
        self.evictable = 0  # engine blocks cached and unreferenced (free, but holding KV)
        self._free: OrderedDict[_Node, None] = OrderedDict()  # lru: eviction order
        self._leaves: list[tuple[int, int, _Node]] = []  # radix: (access, tie, node) heap
        self._clock = 0
        self.evictions = 0

    def keys(self, tokens: Sequence) -> list[int]:
        return block_keys(tokens, self.block_tokens)

    def lookup(self, keys: Sequence[int], prompt_len: int, target: int) -> Hit:
        """The cached leading blocks of a prompt, at most what leaves one token to compute."""
        limit = min(len(keys), (min(prompt_len, target) - 1) // self.block_tokens)
        found, revive = [], 0
        for key in keys[:limit]:
            node = self.nodes.get(key)
            if node is None:
                break
            found.append(node)
            revive += node.ref == 0
        return Hit(
            len(found) * self.block_tokens, revive * self.unit, found, len(found) * self.unit
        )

    def acquire(self, hit: Hit) -> None:
        """The request holds the hit's blocks: none of them can be evicted while it runs."""
        self._clock += 1
        for node in hit.nodes:
            if node.ref == 0:
                self.evictable -= self.unit
                self._free.pop(node, None)
            node.ref += 1
            node.access = self._clock

    def register(self, key: int, parent: _Node | None) -> _Node | None:
        """A block the request just computed, now cached (held by it); None when the same
        block is cached already (computed twice at once: the request keeps its own copy)."""
        if key in self.nodes:
            return None
        node = _Node(key, parent)
        self._clock += 1
        node.access = self._clock
        self.nodes[key] = node
        if parent is not None and parent.present:
            parent.children += 1
        return node

    def release(self, nodes: Sequence[_Node]) -> int:
        """The request let go of these blocks (tail first, as vLLM frees them); returns the
        engine blocks that became free (cached, evictable)."""
        freed = 0
        for node in reversed(nodes):
            node.ref -= 1
            if node.ref == 0 and node.present:
                freed += self.unit
                if self.policy == "lru":
                    self._free[node] = None
                elif node.children == 0:
                    heapq.heappush(self._leaves, (node.access, id(node), node))
        self.evictable += freed
        return freed

    def evict_to(self, free_blocks: int) -> None:
        """Evict until the cached free blocks fit in the engine's free blocks (an allocation
        took the rest)."""
        while self.evictable > free_blocks:
            node = self._pop_victim()
            node.present = False
            del self.nodes[node.key]
            self.evictable -= self.unit
            self.evictions += 1
            parent = node.parent
            if parent is not None and parent.present:
                parent.children -= 1
                if self.policy == "radix" and parent.children == 0 and parent.ref == 0:
                    heapq.heappush(self._leaves, (parent.access, id(parent), parent))

    def _pop_victim(self) -> _Node:
        if self.policy == "lru":
            return self._free.popitem(last=False)[0]
        while True:
            access, _, node = heapq.heappop(self._leaves)
            if node.present and node.ref == 0 and node.children == 0 and node.access == access:
                return node


class _Slot:
    __slots__ = ("busy", "index", "keys", "last_used", "length")

    def __init__(self, index: int) -> None:
        self.index = index
        self.keys: list[int] = []  # per-token chained keys of the prompt it holds
        self.length = 0  # tokens it holds (its prompt and the reply generated after it)
        self.busy = False
        self.last_used = -1


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Common prefix of two chained key lists: equal at i means equal up to i, so bisect."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SlotCache:
    """llama-server's per-slot prompt reuse and its host-RAM prompt cache (get_available_slot
    and server_prompt_cache, followed step by step; profiles/prefix_cache.yaml cites them).
    Slots hold their own KV outside any shared pool, so nothing here touches the engine's
    blocks; the host cache is taken as unbounded (8 GiB holds any prompt of a test model)."""

    pooled = False
    block_tokens = 1

    def __init__(self, slots: int, similarity: float, keep_below: float, load_min_keep: float):
        self.slots = [_Slot(i) for i in range(slots)]
        self.similarity = similarity
        self.keep_below = keep_below
        self.load_min_keep = load_min_keep
        self.saved: list[tuple[list[int], int]] = []  # (keys, length), oldest first
        self._clock = 0

    def keys(self, tokens: Sequence) -> list[int]:
        return block_keys(tokens, 1)

    def lookup(self, keys: Sequence[int], prompt_len: int, target: int) -> Hit:
        slot, update = self._choose(keys, prompt_len)
        held, loaded = (slot.keys, slot.length), False
        if update:
            best = self._best_saved(keys, prompt_len, held, self._after_save(slot))
            held, loaded = best, best is not held
        lcp = _lcp(held[0], keys)
        tokens = min(lcp, min(prompt_len, target) - 1)
        return Hit(max(tokens, 0), 0, [slot, update, held, loaded])

    def acquire(self, hit: Hit) -> None:
        slot, update, held, loaded = hit.nodes
        if update:
            self.saved = self._after_save(slot)
            if loaded:  # the loaded prompt leaves the host cache for the slot
                self.saved.remove(held)
        slot.keys, slot.length = held
        slot.busy = True

    def finish(self, slot: _Slot, keys: Sequence[int], length: int) -> None:
        """The request left its slot holding its prompt (its keys) and `length` tokens."""
        self._clock += 1
        slot.busy, slot.keys, slot.length, slot.last_used = False, list(keys), length, self._clock

    def _choose(self, keys: Sequence[int], n: int) -> tuple[_Slot, bool]:
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            raise RuntimeError("no idle llama.cpp slot: the engine admitted more than --parallel")
        best, f_best = None, 0.0
        for slot in idle:
            if not slot.length:
                continue
            f_sim = _lcp(slot.keys, keys) / n
            if f_sim > f_best and f_sim > self.similarity:
                best, f_best = slot, f_sim
        if best is not None:
            return best, f_best * n / best.length < self.keep_below
        lru = None
        for slot in idle:
            if lru is None or slot.last_used <= lru.last_used:
                lru = slot
        return lru, True

    def _after_save(self, slot: _Slot) -> list[tuple[list[int], int]]:
        """The host cache once the slot's prompt is saved (server_prompt_cache::alloc)."""
        if not slot.length:
            return list(self.saved)
        mine = slot.keys
        if any(_lcp(k, mine) == len(mine) for k, _ in self.saved):
            return list(self.saved)
        kept = [(k, n) for k, n in self.saved if _lcp(k, mine) != len(k)]
        return [*kept, (list(mine), slot.length)]

    def _best_saved(self, keys, n, held, saved) -> tuple[list[int], int]:
        """server_prompt_cache::load: the saved prompt that keeps the most, if better."""
        lcp = _lcp(held[0], keys)
        f_keep = lcp / held[1] if held[1] else -1.0
        f_sim = lcp / n
        best = held
        for entry in saved:
            cur = _lcp(entry[0], keys)
            keep, sim = cur / entry[1], cur / n
            if keep < self.load_min_keep:
                continue
            if f_keep < keep and f_sim < sim:
                f_keep, f_sim, best = keep, sim, entry
        return best


def make_cache(policy: str, engine_block: int, max_num_seqs: int) -> BlockCache | SlotCache | None:
    """The cache a simulated engine runs with (None: off)."""
    if policy == OFF:
        return None
    conf = _profile()["policies"][policy]
    if policy == "slots":
        return SlotCache(max_num_seqs, conf["similarity"], conf["keep_below"],
                         conf["load_min_keep"])  # fmt: skip
    # whole KV blocks: TensorRT-LLM's 32-token blocks are matched 32 at a time
    block = -(-(conf["block_tokens"] or engine_block) // engine_block) * engine_block
    return BlockCache(policy, block, block // engine_block)
