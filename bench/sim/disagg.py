"""Disaggregated prefill/decode: a prefill pool, a KV transfer, a decode pool.

A deployment "xPyD" (InferenceX's and Dynamo's name: x prefill instances, y decode instances,
each of the parallelism it is given) runs a request's prompt on the prefill pool (its own FCFS
queue and batching, prefill only: the pool's engine is asked for one token, as vLLM's disagg
proxy asks its prefill instance for max_tokens=1), then moves the prompt's KV to the decode
pool (transfer_s: KV bytes / link bandwidth + the link's set-up latency; NVLink when both pools
fit in one scale-up domain, else each GPU's network NIC, bench/hardware/gpus.yaml), where it
is admitted with that KV computed and decoded (decode-only steps: no prefill interferes). As in
vLLM's KV connectors the decode instance recomputes the last prompt token to sample from, so
its first step for a request is one token of work and the client's first token leaves at its
end: TTFT = prefill queue + prefill + transfer + decode queue + that first decode step, which is
what vLLM's and SGLang's disaggregated servers report (the first token streams from the decode
instance).

`DisaggEngine` has the driver API of bench.sim.engine.Engine, so `sim run` (bench.sim.virtual)
and `sim serve` (bench.sim.server) drive it unchanged. Its steps are the decode pool's steps
(every decoding sequence emits one token at each one's end, the invariant both drivers keep);
the prefill pool and transfers are advanced by time in between, and when the decode pool is
idle a step of no work lasts until the next prefill step or transfer ends. A driver says how
long before the current step's end a request arrived (`ago_s`), so the prefill pool, which
does not wait for the decode pool's steps, takes it into its first step that starts after it
arrived. Instances of a pool share one scheduler (one
engine with dp ranks, perfect balancing between instances). The prefill pool frees a prompt's
blocks when its prefill ends (the transfer overlapping its next steps); its memory needs only
the prompts in flight, and its KV room comes from the same memory arithmetic as the decode
pool's (bench.sim.memory).
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, replace

from bench.sim.engine import FINISHED, RUNNING, WAITING, Engine, Seq, StepResult, engine_for
from bench.sim.roofline import Deployment


def parse_disagg(spec: str) -> tuple[int, int]:
    """(prefill instances, decode instances) of "1P1D", "2p3d"; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*p\s*(\d+)\s*d\s*", spec or "", re.IGNORECASE)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(
            f"--disagg {spec!r} is not xPyD (x prefill and y decode instances, each 1 or more: "
            "1P1D, 1P2D, 2P1D)"
        )
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class KvLink:
    """What a prompt's KV crosses from the prefill to the decode pool."""

    name: str
    bytes_s: float  # per GPU, one direction
    latency_s: float
    lanes: int  # GPU pairs sending at once (each prefill rank holds its share of the KV)

    def transfer_s(self, kv_bytes: float) -> float:
        return self.latency_s + kv_bytes / (self.bytes_s * self.lanes)


LINKS = ("auto", "nvlink", "network")


def kv_link(prefill: Deployment, decode: Deployment, gpus: int, choice: str = "auto") -> KvLink:
    """The link a deployment of `gpus` GPUs moves KV over: the GPU's scale-up link (NVLink)
    when `choice` says so or, for "auto", when both pools fit in one scale-up domain; else its
    network NIC. Each prefill rank sends its own KV shard on its own link, to a decode rank
    holding the same heads: min(prefill, decode) KV shards move in parallel."""
    from bench.hardware import interconnects

    g = prefill.gpu
    if choice not in LINKS:
        raise ValueError(f"--kv-link {choice!r} must be one of {', '.join(LINKS)}")
    if choice == "nvlink" and gpus > g.world_size:
        raise ValueError(
            f"--kv-link nvlink: {gpus} GPUs exceed {g.name}'s scale-up domain of "
            f"{g.world_size}; use --kv-link network"
        )
    use_nvlink = choice == "nvlink" or (choice == "auto" and gpus <= g.world_size)
    lanes = max(1, min(prefill.kv_shards, decode.kv_shards))
    links = interconnects()
    if use_nvlink:
        link = links.get(g.scale_up)
        latency = link.latency_us * 1e-6 if link else 0.0
        return KvLink(g.scale_up or "scale-up", g.scale_up_bytes_s, latency, lanes)
    link = links.get(g.scale_out)
    if link is None:
        raise ValueError(
            f"{g.name} names no network link (scale_out in bench/hardware/gpus.yaml); "
            "add one or use --kv-link nvlink"
        )
    return KvLink(link.name, link.bytes_s, link.latency_us * 1e-6, lanes)


def pool_deployment(dep: Deployment, instances: int) -> Deployment:
    """`instances` replicas of a deployment as one scheduler's data-parallel ranks (a replica
    of a tensor-parallel deployment shares nothing with the others, as dp ranks of a dense
    model share nothing in the roofline). Replicas of an expert-parallel deployment cannot be
    written that way: ValueError."""
    if instances == 1:
        return dep
    if dep.ep > 1 or dep.dp > 1:
        raise ValueError(
            f"{dep.parallel} is data/expert parallel: give one instance of it per pool "
            f"(e.g. --disagg 1P1D) or use a tpN parallelism"
        )
    return replace(dep, dp=instances)


class DisaggEngine:
    """A prefill pool, a KV link and a decode pool behind Engine's driver API."""

    def __init__(
        self, prefill: Engine, decode: Engine, link: KvLink, spec: str,
        parallels: tuple[str, str] = ("", ""),
    ) -> None:  # fmt: skip
        """parallels: one prefill and one decode instance's parallelism (tp4), as stored."""
        self.prefill, self.decode, self.link, self.spec = prefill, decode, link, spec
        self.parallels = (
            parallels[0] or prefill.dep.parallel,
            parallels[1] or decode.dep.parallel,
        )
        self.dep = decode.dep  # the deployment tokens come from (its MTP, its label)
        self.cfg = decode.cfg
        self.cache = prefill.cache  # prompts share prefixes on the prefill pool
        self.prefix_policy = prefill.prefix_policy
        self.capacity_tokens = decode.capacity_tokens
        self.now = 0.0  # the end of the last step returned
        self.step_index = 0
        self._p_next = 0.0  # when the prefill pool's next step may start
        self._moving: list[tuple[float, int, Seq]] = []  # (arrives at decode, order, seq)
        self._arrivals: list[tuple[float, int, Seq, list[int] | None]] = []  # not yet in a step
        self._order = 0
        self._in_prefill: dict[int, Seq] = {}  # decode seq id -> its prefill-pool seq

    # -- what the drivers and /metrics read ---------------------------------------------------

    @property
    def gpus(self) -> int:
        """Every GPU of both pools, as InferenceX counts a disaggregated deployment."""
        return self.prefill.dep.gpus + self.decode.dep.gpus

    @property
    def label(self) -> str:
        """What it simulates, in words: both pools and every GPU."""
        d = self.decode.dep
        x, y = parse_disagg(self.spec)
        mtp = f" MTP{d.eff.mtp_tokens}" if d.eff.mtp_tokens else ""
        return (
            f"{d.model.name} {d.precision.name} on {self.gpus}x {d.gpu.name} {self.spec}: "
            f"prefill {x} x {self.parallels[0].upper()}, decode {y} x "
            f"{self.parallels[1].upper()} {d.engine}{mtp} (simulated)"
        )

    @property
    def max_model_len(self) -> int:
        return self.decode.max_model_len

    def knobs(self) -> dict:
        p, d = self.prefill.dep, self.decode.dep
        return {
            **self.decode.knobs(),
            "parallel": self.parallels[1],  # one decode instance's
            "disagg": self.spec,
            "prefill_gpus": p.gpus,
            "decode_gpus": d.gpus,
            "prefill_parallel": self.parallels[0],  # each instance's
            "decode_parallel": self.parallels[1],
            "prefill_kv_capacity_tokens": self.prefill.capacity_tokens,
            "kv_link": self.link.name,
            "kv_link_gbps": self.link.bytes_s / 1e9,
            "prefix_cache": self.prefix_policy,
        }

    def transfer_s(self, prompt_len: int) -> float:
        """Seconds to move a prompt's KV from the prefill to the decode pool."""
        return self.link.transfer_s(prompt_len * self.prefill.dep.kv_bytes_per_token)

    @property
    def num_running(self) -> int:
        return self.prefill.num_running + len(self._moving) + self.decode.num_running

    @property
    def num_waiting(self) -> int:
        return self.prefill.num_waiting + self.decode.num_waiting

    @property
    def kv_usage(self) -> float:
        return self.decode.kv_usage

    @property
    def num_preemptions(self) -> int:
        return self.prefill.num_preemptions + self.decode.num_preemptions

    @property
    def prompt_tokens_total(self) -> int:
        return self.prefill.prompt_tokens_total

    @property
    def generation_tokens_total(self) -> int:
        return self.decode.generation_tokens_total

    @property
    def cache_queries(self) -> int:
        return self.prefill.cache_queries

    @property
    def cache_hits(self) -> int:
        return self.prefill.cache_hits

    def has_work(self) -> bool:
        return (
            bool(self._arrivals)
            or self.prefill.has_work()
            or bool(self._moving)
            or self.decode.has_work()
        )

    def decoding(self) -> list[Seq]:
        return self.decode.decoding()

    # -- driver API ---------------------------------------------------------------------------

    def add_request(
        self,
        rid: int,
        prompt_len: int,
        max_tokens: int,
        tag: object = None,
        keys: list[int] | None = None,
        ago_s: float = 0.0,
    ) -> Seq:
        """Queue a request for the prefill pool, arrived `ago_s` before the end of the last
        step; the returned sequence is the one the decode pool will run (its tag is the
        driver's). ValueError when either pool could never hold it."""
        seq = self.decode.new_seq(rid, prompt_len, max_tokens, tag)
        self.prefill.new_seq(rid, prompt_len, 1)  # the prefill pool could hold it too
        self._order += 1
        at = self.now - max(ago_s, 0.0)
        heapq.heappush(self._arrivals, (at, self._order, seq, keys))
        return seq

    def check(self, prompt_len: int, max_tokens: int) -> None:
        """ValueError when either pool could never hold such a request."""
        self.decode.check(prompt_len, max_tokens)
        self.prefill.check(prompt_len, 1)

    def abort(self, seq: Seq) -> None:
        pf = self._in_prefill.pop(seq.id, None)
        if pf is not None:
            self.prefill.abort(pf)
        if seq.status in (WAITING, RUNNING) and pf is None:
            self.decode.abort(seq)  # not in the decode pool yet: a no-op there
        seq.status = FINISHED  # a transfer in flight is dropped when it lands

    def step(self, list_decoding: bool = False) -> StepResult | None:
        """One decode-pool step (or, with the decode pool idle, a wait until the next prefill
        step or transfer ends); None when there is nothing to do."""
        if not self.has_work():
            return None
        self._advance_prefill(self.now, inclusive=True)
        while self._moving and self._moving[0][0] <= self.now:
            _, _, seq = heapq.heappop(self._moving)
            if seq.status == FINISHED:
                continue  # aborted while its KV was on the way
            seq.preloaded = seq.prompt_len - 1  # the last prompt token is recomputed here
            self.decode.waiting.append(seq)
        res = self.decode.step(list_decoding) if self.decode.has_work() else None
        if res is None:
            due = [t for t in (self._moving[0][0] if self._moving else None,
                               self._p_next if self.prefill.has_work() else None,
                               max(self._arrivals[0][0], self._p_next) if self._arrivals else None)
                   if t is not None]  # fmt: skip
            res = StepResult(index=0, duration_s=max(min(due) - self.now, 0.0), n_decode=0,
                             n_prefill=0, decoding=[] if list_decoding else None)  # fmt: skip
        res.index = self.step_index
        self.step_index += 1
        self.now += res.duration_s
        return res

    def _advance_prefill(self, until: float, inclusive: bool) -> None:
        """Run the prefill pool's steps that start before `until` (at it, if inclusive), each
        with the requests that arrived by its start; each finished prompt's KV leaves when
        its step ends."""
        p = self.prefill
        while True:
            if not p.has_work():
                if not self._arrivals:
                    break
                self._p_next = max(self._p_next, self._arrivals[0][0])
            start = self._p_next
            if start > until or (start == until and not inclusive):
                break
            while self._arrivals and self._arrivals[0][0] <= start:
                _, _, seq, keys = heapq.heappop(self._arrivals)
                if seq.status != FINISHED:  # not aborted while it waited
                    pf = p.add_request(seq.id, seq.prompt_len, 1, seq, keys)
                    self._in_prefill[seq.id] = pf
            if not p.has_work():
                continue
            r = p.step()
            if r is None:
                break
            end = self._p_next + r.duration_s
            for pf in r.finished:
                seq = pf.tag
                self._in_prefill.pop(seq.id, None)
                if seq.status == FINISHED:
                    continue
                if seq.cached_tokens < 0 and pf.cached_tokens >= 0:
                    seq.cached_tokens = pf.cached_tokens
                self._order += 1
                heapq.heappush(
                    self._moving, (end + self.transfer_s(seq.prompt_len), self._order, seq)
                )
            if r.duration_s <= 0 and not r.finished and not r.n_prefill:
                break  # nothing could be scheduled (cannot happen for admitted prompts)
            self._p_next = end


def build_disagg(
    prefill: Deployment,
    decode: Deployment,
    spec: str,
    link: str = "auto",
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    memory_fraction: float | None = None,
    prefix_cache: str | None = None,
) -> DisaggEngine:
    """A disaggregated engine of `spec` ("xPyD") instances of the prefill and decode
    deployments (one instance each as given); the engine limits are per instance, both pools."""
    x, y = parse_disagg(spec)
    p_dep, d_dep = pool_deployment(prefill, x), pool_deployment(decode, y)
    p = engine_for(p_dep, max_num_seqs, max_num_batched_tokens, memory_fraction, prefix_cache)
    d = engine_for(d_dep, max_num_seqs, max_num_batched_tokens, memory_fraction, "off")
    kv = kv_link(p_dep, d_dep, p_dep.gpus + d_dep.gpus, link)
    return DisaggEngine(p, d, kv, f"{x}P{y}D", (prefill.parallel, decode.parallel))


def prefill_step(prefill: Deployment, isl: float) -> tuple[int, float]:
    """(prompts, seconds) of one prefill-pool step of prompts of isl tokens: prompts alone, as
    many per data-parallel rank as its token budget (max_num_batched_tokens) holds."""
    from bench.sim.profiles import engine_defaults

    budget = engine_defaults(prefill.engine, prefill.gpu).max_num_batched_tokens
    prompts = prefill.dp * max(1, int(budget // max(isl, 1.0)))  # one step's, every rank's
    t = prefill.step_time(0, 0, prompts * isl, prompts * isl * isl / 2, prefill_seqs=prompts)
    return prompts, t


def _decode_step(decode: Deployment, n: float, isl: float, osl: int) -> float:
    """Seconds of a decode instance's step: n sequences at the mean context isl + osl / 2 and
    no prompt in it (what disaggregation buys)."""
    return decode.step_time(n, n * (isl + osl / 2), 0, 0, prefill_seqs=0)


def disagg_steady_state(
    prefill: Deployment,
    decode: Deployment,
    isl: float,
    osl: int,
    concurrency: float,
    split: tuple[int, int],
) -> dict[str, float] | None:
    """Closed-loop steady state of an xPyD split (x prefill, y decode instances) at a fixed
    concurrency: the formula twin of DisaggEngine, as roofline.steady_state is Engine's.

    A decode instance runs decode-only steps (no prompt interferes: what disaggregation buys),
    so a user's token pace is that step's, and y instances of n sequences each finish
    y n / (osl x step) requests a second. The prefill pool serves x instances' worth of
    prompt-only steps (prefill_step) a second. When it keeps up, every user but the few in prefill is decoding (n = C / y); when
    it does not, users queue for it and the decode batch settles where both rates meet. The KV
    transfer overlaps the next prompt's prefill: it costs TTFT, not throughput. None when a
    decode instance's KV cannot hold its sequences. Totals count every GPU of both pools, as
    InferenceX counts a disaggregated deployment.
    """
    x, y = split
    prompts, t_prefill = prefill_step(prefill, isl)
    served = x * prompts / t_prefill

    def finished(n: float) -> tuple[float, float]:  # (requests a second, step time)
        t = _decode_step(decode, n, isl, osl)
        return y * n / (osl * t), t

    n = concurrency / y
    for _ in range(3):  # a user spends its prefill step out of the decode batch
        t = finished(n)[1]
        n = concurrency / y * osl * t / (osl * t + t_prefill)
    rate, t = finished(n)
    if rate > served:  # prefill-bound: the decode batch where the two rates meet
        lo, hi = 0.0, n
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if finished(mid)[0] < served else (lo, mid)
        n = max(hi, 1e-9)
        rate, t = finished(n)
    if n * (isl + osl / 2) > decode.kv_capacity_tokens():
        return None
    return _steady(t, rate * osl / (x * prefill.gpus + y * decode.gpus), isl, osl, n)


def _steady(t: float, out: float, isl: float, osl: int, n: float) -> dict[str, float]:
    """A split's steady state from its decode step (s) and output tok/s per GPU."""
    return {
        "tpot_s": t,
        "interactivity": 1 / t,
        "output_tps_per_gpu": out,
        "total_tps_per_gpu": out * (1 + isl / osl),
        "decoding_per_instance": n,
    }


def best_disagg_split(
    prefill: Deployment,
    decode: Deployment,
    isl: float,
    osl: int,
    per_decode: float,
    max_decode: int = 8,
    max_prefill: int = 16,
    max_gpus: int = 0,
) -> tuple[tuple[int, int], dict[str, float]] | None:
    """The xPyD split with the most throughput per GPU at per_decode sequences per decode
    instance: of y = 1..max_decode, each with the fewest prefill instances that keep its
    decode pool fed (fewer would starve it, more would idle), both pools within max_gpus
    (0: any). None when none fits. Fed, every decode instance runs per_decode sequences at one
    decode-only step's pace, so each split's figures follow from that step and its GPU count."""
    if per_decode * (isl + osl / 2) > decode.kv_capacity_tokens():
        return None
    t = _decode_step(decode, per_decode, isl, osl)
    prompts, t_prefill = prefill_step(prefill, isl)
    needed = per_decode / (osl * t) * t_prefill / prompts  # prefill instances per decode one
    best = None
    for y in range(1, max_decode + 1):
        x = max(1, math.ceil(y * needed - 1e-9))
        gpus = x * prefill.gpus + y * decode.gpus
        if x > max_prefill or (max_gpus and gpus > max_gpus):
            break
        out = y * per_decode / (t * gpus)
        if best is None or out > best[1]["output_tps_per_gpu"]:
            best = ((x, y), _steady(t, out, isl, osl, per_decode))
    return best
