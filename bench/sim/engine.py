"""A continuous-batching serving engine modelled on vLLM's scheduler, as a pure step function.

Each call to `Engine.step()` is one engine iteration: it schedules work (running decodes first,
then running prefill chunks, then admissions from the FCFS waiting queue, within max_num_seqs
and max_num_batched_tokens), allocates KV blocks of `block_size` tokens, preempts the newest
running sequence by recompute when the cache is full, and returns what the iteration did and
how long it takes by the roofline (bench.sim.roofline). An admitted sequence starts from the
prefix its engine's cache holds (bench.sim.prefix_cache: cached tokens are not prefilled, and
cached blocks live in the same KV pool, evicted as allocations need them). The engine holds
no clock: a driver adds requests and advances time by each step's duration, either in virtual time
(bench.sim.virtual) or on the wall clock (bench.sim.server). Same inputs, same outputs.

Decoding sequences are accounted for lazily: a sequence that decodes from step s0 emits one
token at the end of every step until it finishes or is preempted, so the engine only touches it
when it needs a new KV block (every block_size steps) or finishes. That keeps a step's cost
proportional to what changed, not to the batch size, which is what makes an hour of heavy
traffic simulate in seconds.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from bench.sim.prefix_cache import Hit, make_cache, policy_for
from bench.sim.profiles import GPUProfile, engine_defaults, engine_family
from bench.sim.roofline import Deployment

if TYPE_CHECKING:
    from bench.sim.memory import MemoryPlan

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
JITTER_SEED = 20261204  # one fixed stream: the same run replays to the same figures
JITTER_BLOCK = 4096


class StepJitter:
    """Multiplicative noise on step durations: lognormal with mean 1 and the calibrated
    coefficient of variation (Efficiency.step_cv). A real engine's steps scatter around the
    roofline's time (OS scheduling, garbage collection, an API server's work on the same
    host); with every step at its mean the simulated tails are too short. The stream is
    seeded, so a replay is deterministic and a calibration's objective is smooth in step_cv
    (the same normal draws, scaled). cv 0 draws nothing and returns exactly 1."""

    def __init__(self, cv: float) -> None:
        self.sigma = math.sqrt(math.log1p(cv * cv)) if cv > 0 else 0.0
        self._rng = np.random.default_rng(JITTER_SEED) if self.sigma else None
        self._block: np.ndarray = np.empty(0)
        self._i = 0

    def next(self) -> float:
        if self._rng is None:
            return 1.0
        if self._i >= len(self._block):
            z = self._rng.standard_normal(JITTER_BLOCK)
            self._block = np.exp(self.sigma * z - self.sigma * self.sigma / 2)
            self._i = 0
        self._i += 1
        return float(self._block[self._i - 1])


@dataclass(frozen=True)
class ServeOptions:
    """The engine knobs `sim run` and `sim serve` take and the validation uses; None = the
    engine's own default (engines.yaml, efficiency.yaml). Limits are per engine instance."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_precision: str | None = None
    mtp: int | None = None  # draft tokens per step
    mtp_acceptance: float | None = None
    memory_fraction: float | None = None
    prefix_cache: str | None = None  # a policy (bench.sim.prefix_cache) or "off"
    # disaggregated prefill/decode (bench.sim.disagg): "xPyD" instances, each pool's
    # parallelism (None: the deployment's own) and the KV link (auto, nvlink, network)
    disagg: str | None = None
    prefill_parallel: str | None = None
    decode_parallel: str | None = None
    kv_link: str | None = None
    # the mean tokens a verify step yields per sequence, instead of mtp_acceptance
    mtp_acceptance_length: float | None = None
    # front-end processes streaming the tokens (vLLM --api-server-count); None = one per
    # data-parallel rank
    api_server_count: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler's knobs over the whole deployment (per-rank limits x data-parallel ranks);
    memory_fraction None = the engine's own default (engines.yaml)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    memory_fraction: float | None
    watermark: float
    prefix_cache: str | None = None  # None: the engine's own policy (prefix_cache.yaml)

    @classmethod
    def default(
        cls, engine: str = "vllm", gpu: GPUProfile | None = None, **overrides: float | int | None
    ) -> EngineConfig:
        """The engine's own knobs on `gpu` (its batch limits can depend on the device)."""
        d = engine_defaults(engine, gpu)
        base = {
            "max_num_seqs": d.max_num_seqs,
            "max_num_batched_tokens": d.max_num_batched_tokens,
            "block_size": d.block_size,
            "memory_fraction": d.memory_fraction,
            "watermark": d.watermark,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "id",
        "prompt_len",
        "max_tokens",
        "order",
        "status",
        "target",
        "computed",
        "blocks",
        "window_blocks",
        "out",
        "dec_step",
        "dec_computed",
        "dec_out",
        "preemptions",
        "tag",
        "keys",
        "shared",
        "refs",
        "cached_tokens",
        "preloaded",
    )

    def __init__(self, rid: int, prompt_len: int, max_tokens: int, order: int, tag: object) -> None:
        self.id = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.order = order
        self.status = WAITING
        self.target = prompt_len  # tokens to prefill (prompt, plus outputs after a preemption)
        self.computed = 0  # tokens whose KV is computed (valid while prefilling)
        self.blocks = 0
        self.window_blocks = 0  # blocks its sliding-window layers hold (0 without them)
        self.out = 0  # output tokens emitted (valid while not decoding)
        self.dec_step = -1  # step index at which decoding began; -1 when not decoding
        self.dec_computed = 0
        self.dec_out = 0
        self.preemptions = 0
        self.tag = tag  # the driver's own handle (a stream, a record builder)
        self.keys: list[int] = []  # the prompt's block keys (bench.sim.prefix_cache)
        self.shared = 0  # engine blocks it holds through the prefix cache (not its own)
        self.refs: list = []  # the cache's nodes it holds (or its llama.cpp slot)
        self.cached_tokens = -1  # prompt tokens the cache served at first admission
        self.preloaded = 0  # prompt tokens whose KV arrived computed (disaggregated decode)

    def out_at(self, step: int) -> int:
        """Output tokens emitted by the end of step-1 (i.e. before step `step` runs)."""
        if self.dec_step < 0:
            return self.out
        return self.dec_out + (step - self.dec_step)

    def computed_at(self, step: int) -> int:
        if self.dec_step < 0:
            return self.computed
        return self.dec_computed + (step - self.dec_step)


@dataclass
class StepResult:
    """What one iteration did. Tokens are emitted at the end of the step (now + duration_s).

    first_tokens: sequences whose prefill completed this step and so emitted a token (their
    first, or the next one after a recompute); every other running decoding sequence in
    `decoding` emitted one token too. finished: done after this step (they emitted their last
    token in this step). preempted: evicted before this step ran (they emit nothing now).
    """

    index: int
    duration_s: float
    n_decode: int
    n_prefill: int
    first_tokens: list[Seq] = field(default_factory=list)
    finished: list[Seq] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)
    decoding: list[Seq] | None = None  # filled only when the engine was asked to list them


class Engine:
    """vLLM-style continuous batching over a simulated deployment."""

    def __init__(self, dep: Deployment, config: EngineConfig | None = None) -> None:
        self.dep = dep
        self.cfg = config or EngineConfig.default(dep.engine, dep.gpu)
        bs = self.cfg.block_size
        self.capacity_tokens = dep.kv_capacity_tokens(self.cfg.memory_fraction, *self._rank_limits)
        self.total_blocks = self.capacity_tokens // bs
        self.free_blocks = self.total_blocks
        self.watermark_blocks = int(self.cfg.watermark * self.total_blocks)
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # admission order; the last is the newest
        self.prefilling: dict[int, Seq] = {}
        self.n_decode = 0
        self.decode_ctx = 0  # sum of computed tokens over decoding sequences, at step start
        self.step_index = 0
        self._block_due: dict[int, list[Seq]] = {}
        self._finish_due: dict[int, list[Seq]] = {}
        self._order = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.max_model_len = dep.model.context
        policy = policy_for(engine_family(dep.engine), self.cfg.prefix_cache)
        self.prefix_policy = policy
        self.cache = make_cache(policy, bs, self.cfg.max_num_seqs)
        self.cache_queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.cache_hits = 0  # of which served from the cache (vllm:prefix_cache_hits)
        self._jitter = StepJitter(dep.eff.step_cv)

    @property
    def _rank_limits(self) -> tuple[int, int]:
        """max_num_seqs and max_num_batched_tokens of one engine instance (data-parallel rank)."""
        return self.cfg.max_num_seqs // self.dep.dp, self.cfg.max_num_batched_tokens // self.dep.dp

    def memory_plan(self) -> MemoryPlan:
        """One GPU's memory as this engine's settings divide it (the KV cache it was sized by)."""
        from bench.sim.memory import memory_plan

        return memory_plan(self.dep, self.cfg.memory_fraction, *self._rank_limits)

    def knobs(self) -> dict[str, float | int | str]:
        """The engine's effective settings, per engine instance, to store beside its results."""
        dep = self.dep
        seqs, tokens = self._rank_limits
        knobs = {
            "max_num_seqs": seqs,
            "max_num_batched_tokens": tokens,
            "kv_precision": dep.kv_precision.name,
            "kv_capacity_tokens": self.capacity_tokens,
            "mtp_tokens": int(dep.eff.mtp_tokens),
            "mtp_acceptance": dep.eff.mtp_acceptance,
            "prefix_cache": self.prefix_policy,
        }
        if dep.eff.t_fe_tok_s:  # a front end that can pace the steps (vLLM's)
            knobs["api_server_count"] = dep.front_ends
        if dep.mtp_positions:  # how the drafts were accepted: first, per position, on average
            knobs["mtp_acceptance"] = dep.mtp_positions[0]
            knobs["mtp_per_position"] = list(dep.mtp_positions)
            knobs["mtp_acceptance_length"] = round(dep.mtp_gain, 6)
        return knobs

    # -- driver API -------------------------------------------------------------------------

    @property
    def gpus(self) -> int:
        """GPUs the deployment occupies (a disaggregated one counts both pools)."""
        return self.dep.gpus

    @property
    def label(self) -> str:
        return self.dep.label

    def add_request(
        self,
        rid: int,
        prompt_len: int,
        max_tokens: int,
        tag: object = None,
        keys: list[int] | None = None,
        ago_s: float = 0.0,
    ) -> Seq:
        """Queue a request. prompt_len >= 1 and max_tokens >= 1 tokens. keys: the prompt's
        block keys at the cache's granularity (`self.cache.keys(tokens)`); none: no reuse.
        ago_s: how long before the last step's end it arrived; one scheduler sees it at its
        next step whenever it came (a disaggregated engine's prefill pool reads it)."""
        seq = self.new_seq(rid, prompt_len, max_tokens, tag)
        seq.keys = keys or []
        self.waiting.append(seq)
        return seq

    def new_seq(self, rid: int, prompt_len: int, max_tokens: int, tag: object = None) -> Seq:
        """A sequence this engine could run, not queued; ValueError when it never could
        (too long for the model's context or the KV cache)."""
        self.check(prompt_len, max_tokens)
        seq = Seq(rid, prompt_len, max_tokens, self._order, tag)
        self._order += 1
        return seq

    def check(self, prompt_len: int, max_tokens: int) -> None:
        """ValueError when this engine could never run such a request."""
        if prompt_len < 1 or max_tokens < 1:
            raise ValueError("prompt_len and max_tokens must be at least 1")
        if prompt_len + max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({prompt_len}) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {self.max_model_len} tokens"
            )
        window = self._window_blocks(prompt_len + max_tokens)
        if self._blocks_for(prompt_len + max_tokens) + window > self.total_blocks:
            raise ValueError(
                f"a request of {prompt_len + max_tokens} tokens cannot fit in the KV cache "
                f"({self.capacity_tokens} tokens)"
            )
        # admission keeps the watermark free even for a request alone (step): one whose first
        # chunk would eat into it waits for ever (vLLM refuses such a prompt the same way)
        first = min(prompt_len, self.cfg.max_num_batched_tokens)
        room = (self.total_blocks - self.watermark_blocks) * self.cfg.block_size
        if self._blocks_for(first) + window > self.total_blocks - self.watermark_blocks:
            raise ValueError(
                f"a prompt of {prompt_len} tokens cannot be admitted: its first chunk of {first} "
                f"tokens needs more than the {room} tokens of KV cache the scheduler lets a "
                f"new request take ({self.capacity_tokens} less its {self.cfg.watermark:.0%} "
                "watermark); a smaller --max-num-batched-tokens chunks it"
            )

    def abort(self, seq: Seq) -> None:
        """Drop a request (client went away); frees its blocks."""
        if seq.status == WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        elif seq.status == RUNNING:
            self._evict(seq, self.step_index)
        seq.status = FINISHED

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0

    def decoding(self) -> list[Seq]:
        """Running sequences past their prefill (each emits one token per step)."""
        return [s for s in self.running.values() if s.dec_step >= 0]

    def step(self, list_decoding: bool = False) -> StepResult | None:
        """Run one iteration; None when there is nothing to do."""
        if not self.has_work():
            return None
        s = self.step_index
        res = StepResult(index=s, duration_s=0.0, n_decode=0, n_prefill=0)
        self._allocate_decode_blocks(s, res)
        budget = self.cfg.max_num_batched_tokens - self.n_decode
        n_pf, pf_ctx, chunks = 0, 0.0, []
        for seq in list(self.prefilling.values()):
            if budget <= 0:
                break
            if seq.status != RUNNING:
                continue
            n = self._schedule_chunk(seq, budget, s, res, allow_preempt=True)
            if n:
                chunks.append((seq, n))
                n_pf += n
                pf_ctx += n * (seq.computed + n / 2)
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            # KV that arrived from a prefill pool stands in for a cache hit, on own blocks
            hit = None if seq.preloaded else self._lookup(seq)
            cached = hit.tokens if hit else seq.preloaded
            shared = hit.shared if hit else 0
            n = min(seq.target - cached, budget)
            need = self._blocks_for(cached + n) - shared
            revive = hit.revive if hit else 0
            window = self._window_blocks(seq.prompt_len + seq.max_tokens)
            if self.free_blocks - need - revive - window < self.watermark_blocks:
                break
            self.waiting.popleft()
            seq.status = RUNNING
            seq.computed = cached
            if hit:
                self._acquire(seq, hit)
            seq.blocks, seq.window_blocks = need, window
            self._take(need + window)
            self.running[seq.id] = seq
            self.prefilling[seq.id] = seq
            chunks.append((seq, n))
            n_pf += n
            pf_ctx += n * (cached + n / 2)
            budget -= n
        if list_decoding:
            res.decoding = self.decoding()
        res.n_decode, res.n_prefill = self.n_decode, n_pf
        done = sum(1 for seq, n in chunks if seq.computed + n >= seq.target)  # logit rows
        res.duration_s = self._jitter.next() * self.dep.step_time(
            self.n_decode, self.decode_ctx, n_pf, pf_ctx, prefill_seqs=done
        )
        self._finish_step(s, chunks, res)
        self.step_index = s + 1
        return res

    # -- internals --------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _window_blocks(self, seq_tokens: int) -> int:
        """Blocks a running sequence's sliding-window layers hold (reserved at admission for
        the window it will reach: prompt + max_tokens, capped at the window)."""
        return self._blocks_for(self.dep.window_kv_tokens(seq_tokens))

    # -- prefix cache hooks (bench.sim.prefix_cache) ------------------------------------------

    def _take(self, n: int) -> None:
        """Allocate n free blocks; cached free blocks are evicted as the free ones run out."""
        self.free_blocks -= n
        if self.cache is not None and self.cache.pooled:
            self.cache.evict_to(self.free_blocks)

    def _lookup(self, seq: Seq) -> Hit | None:
        if self.cache is None:
            return None
        return self.cache.lookup(seq.keys, seq.prompt_len, seq.target)

    def _acquire(self, seq: Seq, hit: Hit) -> None:
        """The admitted sequence takes the cached prefix: those tokens are not computed."""
        self.cache.acquire(hit)
        self.free_blocks -= hit.revive
        seq.refs, seq.shared = list(hit.nodes) if self.cache.pooled else [hit.nodes[0]], hit.shared
        if seq.cached_tokens < 0:  # counted once per request, as vLLM's usage reports it
            seq.cached_tokens = hit.tokens
            self.cache_queries += seq.prompt_len
            self.cache_hits += hit.tokens

    def _register(self, seq: Seq) -> None:
        """Full prompt blocks computed so far enter the cache, held by this sequence."""
        cache = self.cache
        full = min(min(seq.computed, seq.prompt_len) // cache.block_tokens, len(seq.keys))
        for i in range(len(seq.refs), full):
            node = cache.register(seq.keys[i], seq.refs[-1] if seq.refs else None)
            if node is None:
                break
            seq.refs.append(node)
            seq.blocks -= cache.unit
            seq.shared += cache.unit

    def _release(self, seq: Seq) -> None:
        if self.cache.pooled:
            self.free_blocks += self.cache.release(seq.refs)
        elif seq.refs:
            kept = min(seq.computed, seq.prompt_len)
            self.cache.finish(seq.refs[0], seq.keys[:kept], seq.computed)
        seq.refs, seq.shared = [], 0

    def _preempt_newest(self, step: int, res: StepResult) -> Seq:
        victim = next(reversed(self.running.values()))
        self._evict(victim, step)
        victim.status = WAITING
        victim.preemptions += 1
        victim.target = victim.prompt_len + victim.out  # recompute prompt + generated so far
        victim.computed = 0
        victim.preloaded = 0  # its transferred KV is gone with its blocks: recompute here
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        res.preempted.append(victim)
        return victim

    def _evict(self, seq: Seq, step: int) -> None:
        """Remove a running sequence from every structure and free its blocks."""
        if seq.dec_step >= 0:
            seq.out = seq.out_at(step)
            seq.computed = seq.computed_at(step)
            self.n_decode -= 1
            self.decode_ctx -= seq.computed
            seq.dec_step = -1
        self.running.pop(seq.id, None)
        self.prefilling.pop(seq.id, None)
        self.free_blocks += seq.blocks + seq.window_blocks
        seq.blocks = seq.window_blocks = 0
        if self.cache is not None:
            self._release(seq)

    def _allocate_decode_blocks(self, s: int, res: StepResult) -> None:
        """Decoding sequences whose next token starts a new block get one, preempting if full."""
        due = self._block_due.pop(s, None)
        if not due:
            return
        for seq in due:
            if seq.status != RUNNING or seq.dec_step < 0:
                continue  # preempted since this was scheduled
            if (seq.blocks + seq.shared) * self.cfg.block_size > seq.computed_at(s):
                continue  # stale entry: the slot this step writes is already allocated
            while self.free_blocks < 1:
                if self._preempt_newest(s, res) is seq:
                    break
            if seq.status != RUNNING:
                continue
            self._take(1)
            seq.blocks += 1
            self._block_due.setdefault(s + self.cfg.block_size, []).append(seq)

    def _schedule_chunk(
        self, seq: Seq, budget: int, s: int, res: StepResult, allow_preempt: bool
    ) -> int:
        """Next prefill chunk of a running sequence, allocating its blocks (may preempt)."""
        n = min(seq.target - seq.computed, budget)
        need = self._blocks_for(seq.computed + n) - seq.blocks - seq.shared
        while need > self.free_blocks and allow_preempt:
            if self._preempt_newest(s, res) is seq:
                return 0
        if need > self.free_blocks:
            return 0
        self._take(need)
        seq.blocks += need
        return n

    def _finish_step(self, s: int, chunks: list[tuple[Seq, int]], res: StepResult) -> None:
        """Account for the step's tokens: prefill completions start decoding; finishes leave."""
        ran_decoding = self.n_decode  # each of these wrote one more KV slot and emitted a token
        self.generation_tokens_total += ran_decoding
        self.decode_ctx += ran_decoding
        for seq, n in chunks:
            seq.computed += n
            if self.cache is not None and self.cache.pooled and seq.keys:
                self._register(seq)
            if seq.computed < seq.target:
                continue
            # prefill done: the step samples a token
            del self.prefilling[seq.id]
            if seq.target == seq.prompt_len:  # first time (not a recompute)
                self.prompt_tokens_total += seq.prompt_len
            seq.out += 1
            self.generation_tokens_total += 1
            res.first_tokens.append(seq)
            if seq.out >= seq.max_tokens:
                self._retire(seq, s, res)
                continue
            seq.dec_step = s + 1
            seq.dec_computed = seq.computed
            seq.dec_out = seq.out
            self.n_decode += 1
            self.decode_ctx += seq.computed
            self._finish_due.setdefault(s + seq.max_tokens - seq.out, []).append(seq)
            first_block = (-seq.computed) % self.cfg.block_size
            self._block_due.setdefault(s + 1 + first_block, []).append(seq)
        for seq in self._finish_due.pop(s, ()):
            if seq.status == RUNNING and seq.dec_step >= 0 and seq.out_at(s + 1) >= seq.max_tokens:
                self._retire(seq, s + 1, res)

    def _retire(self, seq: Seq, step: int, res: StepResult) -> None:
        self._evict(seq, step)
        seq.status = FINISHED
        res.finished.append(seq)


def engine_for(
    dep: Deployment,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    memory_fraction: float | None = None,
    prefix_cache: str | None = None,
) -> Engine:
    """The engine `sim run`, `sim serve` and the validation all build for a deployment.

    Limits are one engine instance's (the engine's own defaults when None); each data-parallel
    rank is its own instance in a real server, so the one simulated scheduler gets them x dp.
    """
    d = engine_defaults(dep.engine, dep.gpu)
    cfg = EngineConfig.default(
        dep.engine,
        dep.gpu,
        max_num_seqs=(max_num_seqs or d.max_num_seqs) * dep.dp,
        max_num_batched_tokens=(max_num_batched_tokens or d.max_num_batched_tokens) * dep.dp,
        memory_fraction=memory_fraction,
    )
    if prefix_cache is not None:
        cfg = replace(cfg, prefix_cache=prefix_cache)
    return Engine(dep, cfg)
