"""The simulator against published measurements (profiles/published.yaml), and the efficiency fit.

Each published point is reproduced by its source's method:
  batch1         one stream's decode rate;
  max_tput       offline maximum throughput (output tok/s per GPU) with as many sequences as the
                 KV cache holds at mean context ISL + OSL/2;
  interactivity  InferenceX: every parallelism of the point's sweep x every concurrency (x MTP
                 off/on; narrower where the point records its source's narrower search: mtp,
                 min_conc, max_conc), the Pareto front of total tok/s/GPU against tok/s/user
                 (1 / median TPOT), linear interpolation at the published interactivity. A target outside the front has no
                 value: the simulator cannot reach it, and the point scores -100%. Where the
                 source's search also (or only) ran disaggregated prefill/decode (the point's
                 `disagg`), the front includes every xPyD split its sweep's disagg_sweeps entry
                 allows, each at its best prefill-to-decode ratio and counting both pools' GPUs
                 (bench.sim.disagg.best_disagg_split; the formula twin of `sim run --disagg`).
InferenceX draws prompt lengths uniformly in 80-100% of the nominal ISL [S2], so its total
tokens count 0.9 x ISL; trtllm-bench uses the nominal lengths. Its client draws output lengths
the same way (sample_uniform with --ignore-eos [S3]); the validation still asks for the nominal
OSL: replaying both as drawn, refitted, left in sample and after the fit unchanged but put held
out by source at 19.6% (18.9%; its high-interactivity cliff points) and the disaggregated fronts
at 29.3% (25.0%) (README, "InferenceX's output lengths").

Two clocks reproduce a point: `formula` (steady_state: the engine's step-time function at the
engine's steady-state schedule, microseconds per point, used for fitting) and `engine` (the
closed-loop engine in virtual time, what `sim run` and `sim serve` execute; a disaggregated
split keeps its formula figures there, since one engine cannot hold replicas of an expert-parallel
instance, and tests/test_sim_disagg.py holds the formula to `sim run --disagg` where it can).
Deployments that do not fit in memory are skipped, not fatal.

The fit (`fit()`): the few parameters efficiency.yaml's `fit` lists (HBM and KV bandwidth
efficiency, the GEMMs' ceiling MFU and the token rows at which they reach half of it, FP4 and
AMD factors, overheads, MoE and collective terms; a parameter scoped per engine gets one value
per engine), each inside its documented physical range, least squares on
log(simulated / published) over the points and the GPU ratios, with a soft-L1 loss and a weak
pull toward the initial values. A point whose source also (or only) ran disaggregated splits is
fitted and scored on the front its source searched, splits included (Sim's default), since
the sixth refit (2026-12-07): a single-pool stand-in read those points 30-55% slow at mid
interactivity, and the fit made DeepSeek-R1 fast to meet them. Every (vendor, engine, compute
unit) resolves to fitted values.
ML.ENERGY's vLLM decode steps at a measured batch [S84] (profiles/decode_step_rows.fit_rows)
are fitted beside the points, each residual weighted STEP_WEIGHT: the published fronts alone
cannot tell a step's fixed costs from its per-token ones, nor the dense TP overhead from the
MoE layer's.
`leave_one_source_out()` refits without each source and scores that source's points;
`steps_held_out()` scores the decode steps with a fit that never saw them.
Points marked `after_fit` in published.yaml were added after the fit: never fitted on, scored
on their own row of `validation_table()`.

`Sim` memoises deployments and runs within one validation, so the three points of a curve share
their sweep; with the engine clock, only configurations within 10% of the formula's Pareto front
run through the engine.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.sim.disagg import best_disagg_split
from bench.sim.profiles import (
    COMPUTE_PRECISIONS,
    EFFICIENCY_YAML,
    HERE,
    PUBLISHED_YAML,
    Efficiency,
    GPUProfile,
    ModelProfile,
    _efficiency_file,
    efficiency_for,
    engine_defaults,
    get_gpu,
    get_model,
    get_precision,
)
from bench.sim.profiles.decode_step_rows import fit_rows
from bench.sim.profiles.per_request_runs import TTFT_ROUNDS, nim_runs, nim_s75, steady_window
from bench.sim.roofline import Deployment, parse_parallel, steady_state, timed_layers

INFERENCEX_ISL = (0.8, 1.0)  # prompt lengths uniform in 80-100% of nominal [S2][S3]
UNREACHED = -1.0  # error of a point whose interactivity the simulator cannot reach


@dataclass(frozen=True)
class Point:
    """One published figure and how to reproduce it."""

    id: str
    set: str
    kind: str
    gpu: str
    model: str
    precision: str
    engine: str
    isl: int
    osl: int
    measured: float
    source: str
    parallel: str = "tp1"
    sweep: str = ""
    mtp: bool = True  # the source's search includes MTP where the model has it
    min_conc: int = 0  # the source's concurrency search, where narrower than sweep_concurrency
    max_conc: int = 0
    interactivity: float = 0.0
    note: str = ""
    expressible: bool = True
    reason: str = ""
    after_fit: bool = False  # added after the fit: never fitted on, scored on its own row
    disagg: str = ""  # the source's search also ("also") or only ("only") runs xPyD splits
    batch: float = 0.0  # decode_step: the sequences decoding in the step
    context: float = 0.0  # decode_step: the mean tokens each of them reads

    @property
    def vendor(self) -> str:
        try:
            return get_gpu(self.gpu).vendor
        except ValueError:
            return "unknown"

    @property
    def group(self) -> tuple[str, str, str]:
        """(vendor, engine, weight format): the efficiency profile this point informs."""
        return (self.vendor, _engine_family(self.engine), weight_format(self.precision))

    @property
    def mean_isl(self) -> float:
        return self.isl * sum(INFERENCEX_ISL) / 2 if self.kind == "interactivity" else self.isl


@dataclass(frozen=True)
class Ratio:
    id: str
    num: dict[str, Any]
    den: dict[str, Any]
    engine: str
    measured: float
    source: str
    num_engine: str = ""
    note: str = ""


@dataclass(frozen=True)
class Speedup:
    """A published speed-up of MTP over the same deployment without it (published.yaml's
    mtp_speedups): scored, never fitted."""

    id: str
    source: str
    gpu: str
    model: str
    precision: str
    engine: str
    parallel: str
    isl: int
    osl: int
    drafts: int
    concurrency: tuple[float, float]  # without MTP, with it
    measured: float
    figure: str = "e2e"  # e2e: a request's end-to-end time; tpot: the token pace
    acceptance_length: float | None = None  # the source's own; None: the model's default
    note: str = ""
    set: str = "mtp"


@dataclass
class Result:
    point: Point | Speedup
    simulated: float  # 0 when unreachable
    config: str = ""  # the parallelism/concurrency that produced it
    group_fitted: bool = True  # held out: False when no other source informs the point's group

    @property
    def error(self) -> float:
        if self.simulated <= 0:
            return UNREACHED
        return self.simulated / self.point.measured - 1


@dataclass
class Published:
    points: list[Point]
    ratios: list[Ratio]
    sweeps: dict[str, list[str]]
    concurrency: list[int]
    sources: dict[str, str] = field(default_factory=dict)
    engine_limits: dict[str, dict] = field(default_factory=dict)
    disagg_sweeps: dict[str, dict] = field(default_factory=dict)
    mtp_speedups: list[Speedup] = field(default_factory=list)

    @property
    def scored(self) -> list[Point]:
        """The points the fit uses (in sample)."""
        return [p for p in self.points if p.expressible and not p.after_fit]

    @property
    def after_fit(self) -> list[Point]:
        """Points added after the fit: scored, never fitted on."""
        return [p for p in self.points if p.expressible and p.after_fit]


def weight_format(precision: str) -> str:
    """fp4 is an alias of nvfp4; every other precision is its own kernel family."""
    return "nvfp4" if precision == "fp4" else precision


def _engine_family(engine: str) -> str:
    """dynamo-sglang shares SGLang's kernels; the orchestration is what differs."""
    return engine.split("-")[-1]


@lru_cache(maxsize=4)
def load_published(path: Path = PUBLISHED_YAML) -> Published:
    """The reference file: points, ratios, sweeps and the [S#] source list."""
    data = yaml.safe_load(Path(path).read_text())
    points = [Point(**{k: v for k, v in p.items()}) for p in data["points"]]
    for p in points:
        if p.source not in data["sources"]:
            raise ValueError(f"{path}: point {p.id} cites {p.source}, not in the source list")
    ratios = [Ratio(**r) for r in data.get("ratios") or []]
    limits = {k: v for k, v in (data.get("engine_limits") or {}).items()}
    speedups = [
        Speedup(**{**s, "concurrency": tuple(s["concurrency"])})
        for s in data.get("mtp_speedups") or []
    ]
    for sp in speedups:
        if sp.source not in data["sources"]:
            raise ValueError(f"{path}: MTP speed-up {sp.id} cites {sp.source}, not in the sources")
    return Published(
        points, ratios, data["sweeps"], data["sweep_concurrency"], dict(data["sources"]), limits,
        dict(data.get("disagg_sweeps") or {}), speedups,
    )  # fmt: skip


# -- reproducing points ------------------------------------------------------------------------

MTP_SWEEP = (0, 1)  # drafted tokens InferenceX's curves are searched over (0 = MTP off)
# engine clock: configurations the formula puts more than 10% behind the front are not run
FRONT_MARGIN = 0.10
DISAGG_ROW = "disaggregated fronts (the points whose sources ran xPyD splits, on those fronts)"
MTP_ROW = "MTP speed-ups (published with / without MTP; scored, never fitted)"
STEPS_ROW = "decode steps at a measured batch [S84] (vLLM; in the fit at weight {w:g})"
STEPS_HELD_ROW = "decode steps [S84], their source held out of the fit"


class Sim:
    """The simulator under one set of efficiency profiles and one clock, memoised per run.

    Points of one InferenceX curve share every run of their sweep, and the ratios share the
    offline points of the TensorRT-LLM table, so each (deployment, concurrency) is simulated
    once per Sim. With the engine clock, the formula first ranks every configuration of a sweep
    and only those within FRONT_MARGIN of its Pareto front run through the engine: the two
    clocks agree within a few per cent, so a configuration 10% behind the formula's front
    cannot reach the engine's.
    """

    def __init__(
        self,
        profiles: list[dict] | None = None,
        clock: str = "formula",
        pub: Published | None = None,
        disagg: bool = True,
    ) -> None:
        """disagg: fronts of points whose source ran disaggregated splits include them, as
        that source searched them (as the fit and the validation score them); False keeps a
        single-pool front from concurrency 1 (what the disaggregated splits add, measured)."""
        if clock not in ("formula", "engine"):
            raise ValueError(f"clock {clock!r} is not formula or engine")
        self.profiles, self.clock, self.disagg = profiles, clock, disagg
        self.pub = pub or load_published()
        self._deps: dict[tuple, Deployment | None] = {}
        self._effs: dict[tuple, Efficiency] = {}
        self._runs: dict[tuple, tuple[float, float, float]] = {}
        self._fronts: dict[tuple, list[tuple[float, float, str]]] = {}

    def deployment(
        self, gpu: str, model: str, precision: str, parallel: str, engine: str, mtp: int = 0
    ) -> Deployment | None:
        """The deployment, or None when it cannot exist (too many GPUs, does not fit)."""
        key = (gpu, model, precision, parallel, _engine_family(engine), mtp)
        if key not in self._deps:
            self._deps[key] = self._build(*key)
        return self._deps[key]

    def _build(self, gpu: str, model: str, precision: str, parallel: str, engine: str, mtp: int):
        tp, dp, ep = parse_parallel(parallel)
        g, m = _gpu(gpu), _model(model)
        if ep > 1 and not m.is_moe:
            return None
        key = (g.name, m.name, precision, engine)
        if key not in self._effs:
            self._effs[key] = efficiency_for(g, precision, engine, m.name, self.profiles)
        try:  # one acceptance for every draft (efficiency.yaml's): the sources' random-token
            # prompts, not the model's published curve on real ones (Deployment.build)
            dep = Deployment.build(
                g, m, precision, tp, dp=dp, ep=ep, engine=engine, mtp=mtp,
                mtp_acceptance=self._effs[key].mtp_acceptance, resolved=self._effs[key],
            )  # fmt: skip
            dep.kv_capacity_tokens()
        except ValueError:
            return None
        return dep

    def measure(
        self, dep: Deployment, p: Point, conc: float, clock: str | None = None
    ) -> tuple[float, float, float]:
        """(interactivity, output tok/s/GPU, total tok/s/GPU) at one concurrency."""
        clock = clock or self.clock
        key = (id(dep), p.kind == "interactivity", p.isl, p.osl, conc, clock)
        if key not in self._runs:
            self._runs[key] = _measure(dep, p, conc, clock)
        return self._runs[key]

    def front(self, p: Point) -> list[tuple[float, float, str]]:
        """Every (interactivity, total tok/s/GPU, config) of the point's sweep worth running."""
        key = (p.gpu, p.model, p.precision, _engine_family(p.engine), p.sweep, p.isl, p.osl)
        key += (p.mtp, p.min_conc, p.max_conc)
        if key in self._fronts:
            return self._fronts[key]
        runs: list[tuple[float, float, str, Deployment | None, float]] = []
        mtps = MTP_SWEEP if _model(p.model).mtp_layers and p.mtp else (0,)
        lowest = p.min_conc
        pars = self.pub.sweeps[p.sweep]
        if self.disagg and p.disagg:
            runs += self._disagg_runs(p, mtps)
            lowest = max(lowest, self.pub.disagg_sweeps[p.sweep]["single_node_min_conc"])
            pars = pars if p.disagg == "also" else []
        concs = [c for c in self.pub.concurrency if lowest <= c <= (p.max_conc or c)]
        for par in pars:
            for mtp in mtps:
                dep = self.deployment(p.gpu, p.model, p.precision, par, p.engine, mtp)
                if dep is None:
                    continue
                cap = max_concurrency(dep, p.mean_isl, p.osl)
                for c in concs:
                    if c * 0.5 > cap:  # the engine would only queue: InferenceX drops such runs
                        continue
                    x, _, y = self.measure(dep, p, min(c, cap), "formula")
                    d = dep.eff.mtp_tokens
                    cfg = f"{dep.parallel}{f' mtp{d}' if d else ''} c{c}"
                    runs.append((x, y, cfg, dep, min(c, cap)))
        if self.clock == "engine":  # a disaggregated split keeps its formula figures
            kept = _near_front(runs, FRONT_MARGIN)
            runs = [
                (*self.measure(d, p, c)[::2], cfg, d, c) if d else (x, y, cfg, d, c)
                for x, y, cfg, d, c in kept
            ]
        self._fronts[key] = [(x, y, cfg) for x, y, cfg, _, _ in runs]
        return self._fronts[key]

    def _disagg_runs(self, p: Point, mtps: tuple[int, ...]) -> list[tuple]:
        """(interactivity, total tok/s/GPU, config, None, sequences per decode instance) of
        every disaggregated split the point's source searched: each prefill and decode
        parallelism of its sweep's disagg_sweeps entry, each sequence count per decode instance,
        the best xPyD split of each (disagg_steady_state)."""
        spec = self.pub.disagg_sweeps[p.sweep]
        runs = []
        for ppar in spec["prefill"]:
            pre = self.deployment(p.gpu, p.model, p.precision, ppar, p.engine, 0)
            for dpar in spec["decode"] if pre else ():
                for mtp in mtps:
                    dec = self.deployment(p.gpu, p.model, p.precision, dpar, p.engine, mtp)
                    for n in spec["per_decode"] if dec else ():
                        best = best_disagg_split(
                            pre, dec, p.mean_isl, p.osl, n,
                            spec["max_decode"], spec["max_prefill"], spec["max_gpus"],
                        )  # fmt: skip
                        if best is None:
                            continue
                        (x, y), s = best
                        d = dec.eff.mtp_tokens
                        cfg = (
                            f"{x}P{y}D {pre.parallel}/{dec.parallel}{f' mtp{d}' if d else ''} n{n}"
                        )
                        runs.append((s["interactivity"], s["total_tps_per_gpu"], cfg, None, n))
        return runs

    def reproduce(self, p: Point) -> Result:
        """The simulator's figure for one published point, by that point's method."""
        if p.kind == "interactivity":
            return pareto_interpolate(p, self.front(p))
        dep = self.deployment(p.gpu, p.model, p.precision, p.parallel, p.engine)
        if dep is None:
            return Result(p, 0.0, f"{p.parallel} does not fit")
        if p.kind == "decode_step":  # steps per second, so its error reads as a throughput's
            step = dep.step_time(p.batch, p.batch * p.context, 0, 0)
            return Result(p, 1 / step, f"{p.parallel} b{p.batch:.0f}")
        if p.kind == "batch1":
            return Result(p, self.measure(dep, p, 1)[0], f"{p.parallel} c1")
        if p.kind == "max_tput":
            limits = self.pub.engine_limits.get(_engine_family(p.engine), {})
            seqs = p.max_conc or engine_defaults(p.engine, dep.gpu).max_num_seqs  # the run's
            c = max_concurrency(
                dep, p.isl, p.osl, seqs, limits.get("kv_reserve") == "prompt+max_output"
            )
            return Result(p, self.measure(dep, p, c)[1], f"{p.parallel} c{max(int(c), 1)}")
        raise ValueError(f"unknown reference point kind {p.kind!r} ({p.id})")

    def ratio(self, r: Ratio) -> float:
        """Simulated per-GPU offline maximum of num over den (Llama-3.3-70B 1000/1000)."""
        vals = []
        for side, engine in ((r.num, r.num_engine or r.engine), (r.den, r.engine)):
            p = Point(
                id=r.id, set="ratio", kind="max_tput", gpu=side["gpu"], model="llama-3.3-70b",
                precision=side["precision"], engine=engine, isl=1000, osl=1000, measured=1.0,
                source=r.source, parallel=side["parallel"],
            )  # fmt: skip
            vals.append(self.reproduce(p).simulated)
        return vals[0] / vals[1] if vals[1] else 0.0


@lru_cache(maxsize=64)
def _gpu(name: str) -> GPUProfile:
    return get_gpu(name)


@lru_cache(maxsize=64)
def _model(name: str) -> ModelProfile:
    return get_model(name)


def _near_front(runs: list[tuple], margin: float) -> list[tuple]:
    """Runs not beaten by another on both axes by more than `margin` (an epsilon-Pareto set)."""
    kept = []
    for x, y, *rest in runs:
        beaten = any(x2 >= x * (1 + margin) and y2 >= y * (1 + margin) for x2, y2, *_ in runs)
        if not beaten:
            kept.append((x, y, *rest))
    return kept


def max_concurrency(
    dep: Deployment, isl: float, osl: int, max_batch: int = 0, reserve_full: bool = False
) -> float:
    """Sequences the KV cache holds, at most max_batch per data-parallel rank (each rank is its
    own engine instance). An engine that admits by the context a sequence has (vLLM, SGLang)
    holds KV / (ISL + OSL/2) in steady state; one that reserves every request's prompt plus its
    whole output at admission (reserve_full: TensorRT-LLM's GUARANTEED_NO_EVICT) KV / (ISL + OSL).
    A model with sliding-window layers also holds their window per sequence (window_kv_tokens).
    """
    per_seq = isl + (osl if reserve_full else osl / 2) + dep.window_kv_tokens(isl + osl)
    c = dep.kv_capacity_tokens() / per_seq
    return min(c, max_batch * dep.dp) if max_batch else c


def _measure(dep: Deployment, p: Point, conc: float, clock: str) -> tuple[float, float, float]:
    """(interactivity, output tok/s/GPU, total tok/s/GPU) at one concurrency."""
    if clock == "formula":
        s = steady_state(dep, p.mean_isl, p.osl, conc)
        return s["interactivity"], s["output_tps_per_gpu"], s["total_tps_per_gpu"]
    from bench.sim.engine import engine_for
    from bench.sim.virtual import run_closed_loop

    c = max(int(conc), 1)
    if p.kind == "interactivity":
        lo, hi = (round(p.isl * f) for f in INFERENCEX_ISL)
    else:
        lo = hi = p.isl
    # the engine `sim run` builds, limited to the point's concurrency per rank
    r = run_closed_loop(engine_for(dep, max_num_seqs=-(-c // dep.dp)), c, (lo, hi), p.osl)
    return 1 / r["tpot_s"], r["output_tps"] / dep.gpus, r["total_tps"] / dep.gpus


def pareto_interpolate(p: Point, pts: list[tuple[float, float, str]]) -> Result:
    """Pareto front (more interactivity and more throughput are both better), interpolated at
    p.interactivity; unreachable (simulated 0) outside the front's interactivity range."""
    front: list[tuple[float, float, str]] = []
    best = -1.0
    for x, y, cfg in sorted(pts, reverse=True):  # from most interactive down
        if y > best:
            front.append((x, y, cfg))
            best = y
    if not front:
        return Result(p, 0.0, "no deployment fits")
    front.sort()
    xs = [f[0] for f in front]
    if not xs[0] <= p.interactivity <= xs[-1]:
        return Result(p, 0.0, f"front spans {xs[0]:.0f}-{xs[-1]:.0f} tok/s/user")
    y = float(np.interp(p.interactivity, xs, [f[1] for f in front]))
    i = min(int(np.searchsorted(xs, p.interactivity)), len(front) - 1)
    return Result(p, y, f"{front[max(i - 1, 0)][2]} .. {front[i][2]}")


def reproduce(
    p: Point,
    pub: Published | None = None,
    profiles: list[dict] | None = None,
    clock: str = "formula",
    disagg: bool = True,
) -> Result:
    """The simulator's figure for one published point, by that point's method (on the front
    its source searched; disagg=False: single-pool only)."""
    return Sim(profiles, clock, pub, disagg).reproduce(p)


def ratio_value(r: Ratio, profiles: list[dict] | None = None, sim: Sim | None = None) -> float:
    """Simulated per-GPU offline maximum of num over den (Llama-3.3-70B 1000/1000)."""
    return (sim or Sim(profiles)).ratio(r)


def validate(
    profiles: list[dict] | None = None,
    clock: str = "formula",
    points: list[Point] | None = None,
    sim: Sim | None = None,
) -> list[Result]:
    """Every expressible published point reproduced with the given (or shipped) efficiencies."""
    sim = sim or Sim(profiles, clock)
    return [sim.reproduce(p) for p in (points or sim.pub.scored)]


def mtp_speedup(s: Speedup, profiles: list[dict] | None = None) -> Result:
    """A published MTP speed-up reproduced on the formula clock: the deployment without and
    with the source's drafts, each arm at its own concurrency, as the ratio of the source's
    figure (a request's end-to-end time, or the token pace) without MTP to with it."""
    tp, dp, ep = parse_parallel(s.parallel)
    figures = []
    for drafts, conc in zip((0, s.drafts), s.concurrency, strict=True):
        dep = Deployment.build(
            s.gpu, s.model, s.precision, tp, dp=dp, ep=ep, engine=s.engine, mtp=drafts,
            mtp_acceptance_length=s.acceptance_length if drafts else None, profiles=profiles,
        )  # fmt: skip
        r = steady_state(dep, s.isl, s.osl, conc)
        end_to_end = conc * s.osl / (r["output_tps_per_gpu"] * dep.gpus)
        figures.append(r["tpot_s"] if s.figure == "tpot" else end_to_end)
    return Result(s, figures[0] / figures[1], f"{s.parallel} mtp{s.drafts} {s.figure}")


def mtp_speedups(profiles: list[dict] | None = None) -> list[Result]:
    """Every published MTP speed-up reproduced with the shipped (or given) fit: scored, never
    fitted on, the least error a simulated figure with MTP states."""
    return [mtp_speedup(s, profiles) for s in load_published().mtp_speedups]


def disaggregated(profiles: list[dict] | None = None, clock: str = "formula") -> list[Result]:
    """The points whose source also (or only) ran disaggregated splits, reproduced with those
    splits in their fronts (Sim's default) and the shipped or given fit: those in the fit
    (fitted on these fronts since 2026-12-07) and those added after it."""
    sim = Sim(profiles, clock)
    return [sim.reproduce(p) for p in sim.pub.points if p.expressible and p.disagg]


def source_disagreements(pub: Published | None = None, tolerance: float = 0.10) -> list[str]:
    """Where two sources publish the same InferenceX curve (GPU, model, precision, ISL/OSL) over
    overlapping interactivity, each one's points against the other's curve (log-linear
    interpolation between its points); pairs apart by more than `tolerance` are listed. A
    simulator cannot be closer to both than they are to each other."""
    pub = pub or load_published()
    curves: dict[tuple, dict[str, list[Point]]] = {}
    for p in pub.scored:
        if p.kind == "interactivity":
            key = (p.gpu, p.model, p.precision, p.isl, p.osl)
            curves.setdefault(key, {}).setdefault(p.source, []).append(p)
    out = []
    for by_src in curves.values():
        for a, pa in by_src.items():
            for b, pb in by_src.items():
                if a == b:
                    continue
                xs = sorted((q.interactivity, math.log(q.measured)) for q in pb)
                for q in pa:
                    if not xs[0][0] <= q.interactivity <= xs[-1][0]:
                        continue
                    other = math.exp(np.interp(q.interactivity, *zip(*xs, strict=True)))
                    gap = q.measured / other - 1
                    note = f"{q.id} ({a}) {q.measured:,.0f} vs {b}'s curve {other:,.0f}: {gap:+.0%}"
                    out.append(("!! " if abs(gap) > tolerance else "ok ") + note)
    return out


def mean_abs_error(results: list[Result]) -> float:
    return float(np.mean([abs(r.error) for r in results])) if results else float("nan")


# -- held out: what a point the fit never saw is off by -----------------------------------------

HELD_OUT_YAML: Path = HERE / "held_out.yaml"


def nim_closed_loop(isl: int, osl: int, conc: int, rounds: int = 4) -> list:
    """NIM's closed loop at one concurrency on the engine clock (what `sim run` executes): the
    records of `rounds` x concurrency requests (8 at least)."""
    from bench.sim.virtual import build_engine, replay_closed

    run = nim_runs()[0]  # the deployment, as per_request.yaml gives it
    engine = build_engine(
        run.gpu, run.model, run.precision, parallel=run.parallel, engine=run.engine
    )
    return replay_closed(engine, np.tile([isl, osl], (max(rounds * conc, 8), 1)), conc)


def steady_ttft_ms(records: list, conc: int) -> float:
    """Mean TTFT (ms) of the requests genai-perf's stable window reads (steady_window)."""
    late = steady_window(records, conc)
    return float(np.mean([(r.first_token_ns - r.sent_ns) / 1e6 for r in late]))


def independent_ttft() -> list[tuple[str, float, float]]:
    """(label, simulated, published) mean TTFT of NIM's points that publish one [S75]: the
    only time-to-first-token measurements the simulator is checked on (the fitted points
    score throughput at an interactivity, which TPOT sets and TTFT does not)."""
    out = []
    for isl, osl, conc, ttft, _, _ in nim_s75():
        sim = steady_ttft_ms(nim_closed_loop(isl, osl, conc, TTFT_ROUNDS), conc)
        out.append((f"nim-h100-70b-{isl}-{osl}-c{conc}", sim, ttft))
    return out


def gpu_pairs(loso: list[Result]) -> list[dict[str, Any]]:
    """The error of a ratio of two GPUs the simulator gives with their source held out: each
    pair of one source's points that differ only in the GPU (model, precision, engine,
    lengths, interactivity alike), as (1 + error A) / (1 + error B) - 1. A comparison of two
    simulated GPUs shares the fit's errors, so its ratio is off by this, not by the two
    GPUs' errors compounded. Category: AMD when either GPU is AMD, else the points' set."""

    def same(p: Point) -> tuple:
        return (p.source, p.kind, p.model, p.precision, p.engine, p.isl, p.osl, p.interactivity)

    out = []
    for i, a in enumerate(loso):
        for b in loso[i + 1 :]:
            pa, pb = a.point, b.point
            if same(pa) == same(pb) and pa.gpu != pb.gpu and a.simulated > 0 < b.simulated:
                cat = "amd" if "amd" in (pa.set, pb.set) else pa.set
                err = (1 + a.error) / (1 + b.error) - 1
                out.append({"a": pa.id, "b": pb.id, "category": cat, "error": round(err, 4)})
    return out


def disagg_held_out(loso: list[Result], after: list[Result]) -> list[Result]:
    """What a `--disagg` figure's range reads: the points whose sources ran disaggregated
    splits, on the fronts those sources searched, each predicted by a fit that never saw it
    (its source held out, or added after the fit)."""
    return [r for r in loso + after if r.point.disagg]


def held_out_document(
    loso: list[Result],
    after: list[Result],
    split: list[Result] | None = None,
    mtp: list[Result] | None = None,
) -> dict[str, Any]:
    """What bench.sim.profiles.accuracy reads: each point's error when its source was held out
    of the fit (or when it was added after the fit), the disaggregated fronts' (split,
    category "disagg"), the MTP speed-ups' (category "mtp"), and the independent TTFT
    checks, and the published per-request runs' latencies (bench.sim.per_request, the shipped
    fit's: write it after a refit's efficiency.yaml)."""
    from bench.sim.per_request import held_out_rows, per_request_errors

    def row(r: Result, how: str) -> dict[str, Any]:
        return {"id": r.point.id, "category": r.point.set, "source": r.point.source,
                "held_out": how, "error": round(r.error, 4)}  # fmt: skip

    return {
        "schema_version": 1,
        "points": [row(r, "source") for r in loso]
        + [row(r, "after_fit") for r in after]
        + [dict(row(r, "disagg_front"), category="disagg") for r in split or []]
        + [row(r, "mtp_speedup") for r in mtp or []],
        "gpu_pairs": gpu_pairs(loso),
        "ttft": [
            {
                "id": label,
                "source": "S75",
                "simulated_ms": round(sim, 1),
                "published_ms": pub,
                "error": round(sim / pub - 1, 4),
            }
            for label, sim, pub in independent_ttft()
        ],  # fmt: skip
        "per_request": held_out_rows(per_request_errors()),
    }


def write_held_out(
    loso: list[Result],
    after: list[Result],
    split: list[Result] | None = None,
    mtp: list[Result] | None = None,
    path: Path = HELD_OUT_YAML,
) -> None:
    header = (
        "# Generated by `python -m bench.sim.calibration --loso --write-held-out` after a refit:\n"
        "# each published point's error predicted by a fit that never saw its source (held_out:\n"
        "# source), added after the fit (after_fit), the same for the points whose sources ran\n"
        "# disaggregated splits, on those fronts (disagg_front), the published MTP speed-ups\n"
        "# (mtp_speedup, never fitted), the independent TTFT checks and the published\n"
        "# per-request runs. The expected error of every simulated figure is read from here\n"
        "# (bench/sim/profiles/accuracy.py); tests/test_sim_calibration.py checks it is current.\n"
    )
    doc = held_out_document(loso, after, split, mtp)
    path.write_text(
        header + yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=None)
    )


# -- fitting -----------------------------------------------------------------------------------

FIT_NFEV = 300  # cost evaluations of the least-squares fit (each Jacobian costs one per parameter)
# The loss's two knobs, chosen by leave-one-source-out (issue 25, fifth refit): of prior weights
# 0-0.15 and soft-L1 scales 0.05-0.4, 0.01 and 0.2 held out best (18.9% against 20.6% at the
# former 0.05 and 0.1; after the fit 25.4% against 26.3%). A stronger pull toward the initial
# values, or a loss nearer L1, left each fold's fit further from the sources it did not see.
PRIOR_WEIGHT = 0.01  # per parameter, on log(value / initial): a 2x move costs as a 0.7% miss
F_SCALE = 0.2  # soft-L1: a residual beyond ~20% counts less than its square
ENGINES = ("vllm", "sglang", "trtllm")
VENDORS = ("nvidia", "amd")
LOG_FLOOR = 1e-3  # a range starting at 0 is fitted in log space from 1e-3 x its top


@dataclass(frozen=True)
class FitParam:
    """One fitted quantity: efficiency.yaml's `fit` entry (initial value, physical range)."""

    name: str  # "mbu", or "mfu.vllm" for an engine-scoped one
    initial: float
    low: float
    high: float
    source: str
    stage: str = "shared"  # "vendor": fitted again on every observation of AMD GPUs (fit)
    # scope gpu: the efficiency parameter it sets on the GPUs listed, and nowhere else (one
    # value for one silicon generation, as t_mla_layer_s_cdna3 on MI300X and MI325X)
    sets: str = ""
    gpus: tuple[str, ...] = ()


def fit_params(path: Path = EFFICIENCY_YAML) -> list[FitParam]:
    """The free parameters, engine-scoped ones expanded per engine (those its `engines` lists:
    the engines whose sources measure it; the rest keep `parameters`' value), from
    efficiency.yaml."""
    out = []
    for name, spec in (_efficiency_file(path).get("fit") or {}).items():
        lo, hi = spec["range"]
        engines = spec.get("engines") or ENGINES
        names = [f"{name}.{e}" for e in engines] if spec["scope"] == "engine" else [name]
        stage = spec.get("stage", "shared")
        sets, gpus = spec.get("sets", ""), tuple(spec.get("gpus") or ())
        if spec["scope"] == "gpu" and not (sets and gpus):
            raise ValueError(f"{path}: fit {name}: scope gpu needs `sets` and `gpus`")
        out += [
            FitParam(n, spec["initial"], lo, hi, spec["source"], stage, sets, gpus) for n in names
        ]
    return out


def _gpu_scoped(x: dict[str, float]) -> list[dict]:
    """The profiles of the GPU-scoped parameters in x: each sets its efficiency parameter on
    its GPUs only (a one-key match, applied after the global entry, before the vendor, engine
    and compute ones, which never set it)."""
    return [
        {"match": {"gpu": g}, "set": {q.sets: float(x[q.name])}}
        for q in fit_params()
        if q.gpus and q.name in x
        for g in q.gpus
    ]


def mfu_prefill_max() -> float:
    """The most a prefill step's GEMMs reach: the top of the `mfu` range in efficiency.yaml
    (large FP8/BF16 GEMMs at 70-75% of dense peak). Prefill has more rows than decode, not a
    higher ceiling: at the former 0.85 cap the fit put TensorRT-LLM's prefill there, and NIM's
    5,000-token TTFT on H100 [S75] (never fitted on) read about 2x the simulated prefill."""
    return max(p.high for p in fit_params() if p.name.split(".")[0] == "mfu")


def _profiles_from(x: dict[str, float]) -> list[dict]:
    """Efficiency profiles for fitted values x: the global values, then one entry per (vendor,
    engine, compute unit) with its mfu = mfu x FP4 ratio x AMD ratio and mbu = mbu x AMD
    bandwidth ratio (each the engine's own where the fit scopes it per engine, "mfu.vllm"), so every
    deployment a user may simulate resolves to fitted values, none to a guess."""
    derived = {"mbu", "mfu", "fp4_mfu_ratio", "amd_ratio", "amd_mbu_ratio", "allreduce_latency_s"}
    derived |= {q.name for q in fit_params() if q.gpus}
    # a global the fit does not free (t_fix_s since issue 25's second refit) keeps its default
    g = {k: float(v) for k, v in x.items() if "." not in k and k not in derived}
    g["allreduce_latency_s"] = g["alltoall_latency_s"] = float(x["allreduce_latency_s"])
    profiles: list[dict] = [{"match": {}, "set": g}]
    cap = mfu_prefill_max()
    for vendor in VENDORS:
        for engine in ENGINES:
            own = {k.split(".")[0]: float(v) for k, v in x.items() if k.endswith(f".{engine}")}
            for compute in COMPUTE_PRECISIONS:
                mfu = own.get("mfu", x.get("mfu"))
                mfu *= x["fp4_mfu_ratio"] if compute == "fp4" else 1.0
                amd = vendor == "amd"
                mfu *= x["amd_ratio"] if amd else 1.0
                mbu = own.get("mbu", x.get("mbu")) * (x["amd_mbu_ratio"] if amd else 1.0)
                # mfu is the GEMMs' ceiling (gemm_half_rows); prefill attention runs at it too
                vals = {**own, "mbu": float(mbu), "mfu": float(mfu)}
                vals["mfu_prefill"] = float(min(mfu, cap))
                match = {"vendor": vendor, "engine": engine, "compute": compute}
                profiles.append({"match": match, "set": vals})
    return profiles + _gpu_scoped(x)


def points_per_parameter(points: list[Point], ratios: list[Ratio]) -> dict[str, int]:
    """Scored observations (points and GPU ratios) each free parameter is fitted on: NVIDIA's
    for the first stage's, AMD's for the vendor stage's (fit)."""
    split = stages(points, ratios)

    # (engine, compute unit) of each NVIDIA point and of both sides of each NVIDIA ratio
    nvidia = [(_engine_family(p.engine), get_precision(p.precision).compute) for p in split.points]
    nvidia += [
        (_engine_family(engine), get_precision(side["precision"]).compute)
        for r in split.ratios
        for side, engine in ((r.num, r.num_engine or r.engine), (r.den, r.engine))
    ]
    # a vendor-stage ratio observes only its AMD side: its NVIDIA side's parameters are fixed
    amd_sides = [s for r in split.vendor_ratios for s in (r.num, r.den)]
    n_vendor = len(split.vendor_points) + sum(get_gpu(s["gpu"]).vendor == "amd" for s in amd_sides)
    counts = {}
    for prm in fit_params():
        if prm.gpus:  # the points on its GPUs whose model has the layers it times
            on = [p for p in points if _gpu(p.gpu).name in prm.gpus]
            counts[prm.name] = sum(_times_layers(prm.sets, _model(p.model)) for p in on)
        elif prm.stage == "vendor":
            counts[prm.name] = n_vendor
        elif "." in prm.name:
            counts[prm.name] = sum(e == prm.name.split(".")[1] for e, _ in nvidia)
        elif prm.name == "fp4_mfu_ratio":
            counts[prm.name] = sum(c == "fp4" for _, c in nvidia)
        else:
            counts[prm.name] = len(nvidia)
    return counts


def _times_layers(parameter: str, model: ModelProfile) -> bool:
    """Whether an efficiency parameter moves this model's steps: a per-layer time only where
    the model has layers it times (roofline.timed_layers), any other parameter always."""
    return timed_layers(model).get(parameter, 1) > 0


# A decode step's residual against a published point's: the fit's 168 steps (one source, one
# engine) against 60 points and 6 ratios would otherwise outvote the fronts every stated error
# is read from; at 0.5 they weigh about as much as the points
STEP_WEIGHT = 0.5


@dataclass(frozen=True)
class Loss:
    """The fit's loss knobs (the published fit uses the defaults; choose_loss scores others)."""

    prior_weight: float = PRIOR_WEIGHT
    f_scale: float = F_SCALE
    step_weight: float = STEP_WEIGHT


# The settings the fifth refit scored by leave-one-source-out (README, "The loss chosen by
# holding sources out"): prior weights at the former scale, scales at the chosen weight, the
# decode steps' weight, and the pick's neighbours
LOSS_GRID = (
    Loss(0.0, 0.1), Loss(0.01, 0.1), Loss(0.02, 0.1), Loss(0.05, 0.1), Loss(0.15, 0.1),
    Loss(0.01, 0.05), Loss(0.01, 0.2), Loss(0.01, 0.4), Loss(0.01, 0.2, 0.25),
    Loss(0.01, 0.2, 1.0), Loss(0.005, 0.2), Loss(0.02, 0.2),
)  # fmt: skip


def decode_step_points(rows: list | None = None) -> list[Point]:
    """ML.ENERGY's vLLM decode steps [S84] the fit uses (decode_step_rows.fit_rows, or `rows`)
    as points, numbered (two checkpoints' runs may share a model profile and a batch limit):
    measured = steps per second (1,000 / the median gap in ms), so a step's error reads as a
    throughput's. They pin what the fronts cannot separate: the step at a known batch, the
    dense TP overhead at TP1-TP8, the MoE layer's cost at few sequences."""
    return [
        Point(
            id=f"s84-{i}-{r.task}-{r.model}-{r.precision}-{r.gpu}-{r.parallel}-n{r.max_num_seqs}",
            set="step",
            kind="decode_step",
            gpu=r.gpu,
            model=r.model,
            precision=r.precision,
            engine="vllm",
            isl=0,
            osl=0,
            measured=1000 / r.itl_p50,
            source="S84",
            parallel=r.parallel,
            batch=r.batch,
            context=r.context,
        )
        for i, r in enumerate(fit_rows(sources=load_published().sources) if rows is None else rows)
    ]


def _residuals(results: list[Result]) -> np.ndarray:
    return np.array([math.log(max(r.simulated, 1e-9 * r.point.measured) / r.point.measured) if r.simulated > 0 else math.log(0.05) for r in results])  # fmt: skip


def _hand_profiles() -> list[dict]:
    """efficiency.yaml's hand-set profiles (engine defaults such as MTP), kept under every fit."""
    return list(_efficiency_file(EFFICIENCY_YAML).get("profiles") or [])


def fit(
    points: list[Point],
    ratios: list[Ratio] | None = None,
    steps: list[Point] | None = None,
    loss: Loss = Loss(),
) -> tuple[list[dict], dict]:
    """Fit the few bounded parameters on `points`, GPU `ratios` and decode `steps` (by default
    decode_step_points(); [] fits without them), on the formula clock.

    Least squares on log(simulated / published) with a soft-L1 loss (a step's term weighted
    loss.step_weight), in log-parameter space inside each parameter's physical range
    (efficiency.yaml `fit`), with a weak pull toward the initial values, on NVIDIA's points
    and ratios. Then the vendor-stage parameters (the AMD factors, CDNA3's MLA layer time) are
    fitted on every AMD observation, the others fixed: AMD's figures inform AMD's parameters
    without moving what NVIDIA's set. With MI300X's fronts in the first stage, CDNA3's slow
    MLA layers pushed the shared per-layer times and bandwidths, and NVIDIA's DeepSeek-R1 fronts
    paid. Returns the profiles and the fitted values by name.
    """
    from bench.extras import require

    require("scipy", "Fitting the simulator")  # one line naming the extra, not a traceback
    from scipy.optimize import least_squares

    params = fit_params()
    names = [q.name for q in params]
    lo = np.log([q.low if q.low > 0 else q.high * LOG_FLOOR for q in params])
    hi = np.log([q.high for q in params])
    x0 = np.clip(np.log([q.initial for q in params]), lo + 1e-9, hi - 1e-9)
    pub = load_published()
    ratios = pub.ratios if ratios is None else ratios
    steps = decode_step_points() if steps is None else steps
    hand = _hand_profiles()

    split = stages(points, ratios)
    # the first stage frees only its own parameters: no NVIDIA observation moves the vendor
    # stage's, which stay at their initial values until AMD's observations fit them
    first = [i for i, q in enumerate(params) if q.stage != "vendor"]
    vendor = [i for i, q in enumerate(params) if q.stage == "vendor"]
    held = {names[i]: float(np.exp(x0[i])) for i in vendor}

    def resid(z: np.ndarray) -> np.ndarray:
        x = {**held, **{names[i]: float(v) for i, v in zip(first, np.exp(z), strict=True)}}
        sim = Sim(hand + _profiles_from(x), "formula", pub)
        terms = _residuals([sim.reproduce(p) for p in split.points])
        rterms = [math.log(max(sim.ratio(r), 1e-9) / r.measured) for r in split.ratios]
        sterms = loss.step_weight * _residuals([sim.reproduce(p) for p in steps])
        return np.concatenate([terms, rterms, sterms, loss.prior_weight * (z - x0[first])])

    sol = least_squares(
        resid, x0[first], bounds=(lo[first], hi[first]), loss="soft_l1", f_scale=loss.f_scale,
        max_nfev=FIT_NFEV, x_scale="jac",
    )  # fmt: skip
    values = {**held, **{names[i]: float(v) for i, v in zip(first, np.exp(sol.x), strict=True)}}
    values = {n: values[n] for n in names}  # in efficiency.yaml's order, as written
    if not vendor or not split.vendor_points + split.vendor_ratios:
        return hand + _profiles_from(values), values

    def vendor_resid(zv: np.ndarray) -> np.ndarray:
        x = {**values, **{names[i]: float(v) for i, v in zip(vendor, np.exp(zv), strict=True)}}
        sim = Sim(hand + _profiles_from(x), "formula", pub)
        terms = _residuals([sim.reproduce(p) for p in split.vendor_points])
        rterms = [math.log(max(sim.ratio(r), 1e-9) / r.measured) for r in split.vendor_ratios]
        return np.concatenate([terms, rterms, loss.prior_weight * (zv - x0[vendor])])

    sol = least_squares(
        vendor_resid, x0[vendor], bounds=(lo[vendor], hi[vendor]), loss="soft_l1",
        f_scale=loss.f_scale, max_nfev=FIT_NFEV, x_scale="jac",
    )  # fmt: skip
    values.update({names[i]: float(v) for i, v in zip(vendor, np.exp(sol.x), strict=True)})
    return hand + _profiles_from(values), values


def _amd_ratio(r: Ratio) -> bool:
    """A GPU ratio with an AMD GPU on either side (the AMD factors' second stage uses it)."""
    return any(get_gpu(side["gpu"]).vendor == "amd" for side in (r.num, r.den))


@dataclass(frozen=True)
class Stages:
    """The fit's observations by stage: NVIDIA's points and ratios fit the shared parameters;
    every observation of an AMD GPU (a point on one, a ratio with one on either side) fits the
    vendor stage's, the shared ones fixed. With MI300X's fronts in the first stage, CDNA3's
    slow MLA layers pushed the shared per-layer times and bandwidths (fit)."""

    points: list[Point]
    ratios: list[Ratio]
    vendor_points: list[Point]
    vendor_ratios: list[Ratio]


def stages(points: list[Point], ratios: list[Ratio]) -> Stages:
    """Split observations between the fit's stages (the one place the rule lives)."""
    return Stages(
        points=[p for p in points if p.vendor != "amd"],
        ratios=[r for r in ratios if not _amd_ratio(r)],
        vendor_points=[p for p in points if p.vendor == "amd"],
        vendor_ratios=[r for r in ratios if _amd_ratio(r)],
    )


def leave_one_source_out(points: list[Point], loss: Loss = Loss()) -> list[Result]:
    """For each source, fit on every other source's points and ratios (and the decode steps,
    another source's), and reproduce this source's points. group_fitted is False where the
    training set has no point of the held-out point's engine (or, for AMD, no AMD
    observation): then only the parameters' initial values and ranges reach it."""
    pub = load_published()
    out: list[Result] = []
    for src in sorted({p.source for p in points}):
        train = [p for p in points if p.source != src]
        ratios = [r for r in pub.ratios if r.source != src]
        profiles, _ = fit(train, ratios, loss=loss)
        engines = {_engine_family(p.engine) for p in train}
        split = stages(train, ratios)
        amd = bool(split.vendor_points or split.vendor_ratios)
        for r in validate(profiles, points=[p for p in points if p.source == src]):
            p = r.point
            r.group_fitted = _engine_family(p.engine) in engines and (p.vendor != "amd" or amd)
            out.append(r)
    return out


def steps_held_out(points: list[Point], steps: list[Point] | None = None) -> list[Result]:
    """The decode steps (`steps`, by default decode_step_points()) reproduced by a fit on
    `points` and the ratios alone: what their source adds, and what a step the fit never saw
    is off by."""
    profiles, _ = fit(points, steps=[])
    return validate(profiles, points=decode_step_points() if steps is None else steps)


def choose_loss(points: list[Point], grid: tuple[Loss, ...] = LOSS_GRID) -> list[dict[str, Any]]:
    """Each loss setting scored as the published one was chosen: a fit on `points` (its in-sample
    and after-the-fit error) and the fits that each hold one source out (the held-out error the
    choice minimises; a setting that fits the points it saw better but predicts the sources it
    did not see worse loses). About two minutes a setting on two cores."""
    after = load_published().after_fit
    rows = []
    for loss in grid:
        profiles, _ = fit(points, loss=loss)
        held = leave_one_source_out(points, loss)
        rows.append(
            {
                "loss": loss,
                "in_sample": mean_abs_error(validate(profiles, points=points)),
                "after_fit": mean_abs_error(validate(profiles, points=after)) if after else None,
                "held_out": mean_abs_error(held),
                "held_out_worst": max(abs(r.error) for r in held),
            }
        )
    return rows


def loss_table(rows: list[dict[str, Any]]) -> str:
    """choose_loss's rows as a Markdown table, the lowest held-out error marked."""
    best = min(rows, key=lambda r: r["held_out"])
    out = [
        "| prior weight | soft-L1 scale | step weight | in sample | after the fit | held out by "
        "source | worst held out |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        loss, mark = r["loss"], " (lowest)" if r is best else ""
        after = f"{r['after_fit']:.1%}" if r["after_fit"] is not None else "-"
        out.append(
            f"| {loss.prior_weight:g} | {loss.f_scale:g} | {loss.step_weight:g} | "
            f"{r['in_sample']:.1%} | {after} | {r['held_out']:.1%}{mark} | "
            f"{r['held_out_worst']:+.0%} |"
        )
    return "\n".join(out)


def write_fit(
    values: dict[str, float],
    points: list[Point],
    steps: list[Point] | None = None,
    path: Path = EFFICIENCY_YAML,
) -> None:
    """Store the fitted values in efficiency.yaml: `fitted_values` (each with its range and the
    observations that move it) and the `fitted` profiles they expand to."""
    data = yaml.safe_load(path.read_text())
    pub = load_published()
    steps = decode_step_points() if steps is None else steps
    counts = points_per_parameter(points + steps, pub.ratios)
    split = stages(points, pub.ratios)
    shared, amd = split.points, split.vendor_points
    srcs = sorted({p.source for p in shared})
    ranges = {q.name: [q.low, q.high] for q in fit_params(path)}
    data["fitted_values"] = {
        k: {"value": float(f"{v:.4g}"), "range": ranges[k], "observations": counts[k]}
        for k, v in values.items()
    }
    fitted = _profiles_from(values)
    for prof in fitted:
        prof["set"] = {k: float(f"{v:.4g}") for k, v in prof["set"].items()}
        prof["source"] = (
            f"fitted on {len(shared)} points and {len(split.ratios)} ratios of "
            + ", ".join(srcs)
            + (f", and {len(steps)} decode steps of S84" if steps else "")
            + (
                f"; the AMD parameters on {len(amd)} points and {len(split.vendor_ratios)} ratio of "
                + ", ".join(sorted({p.source for p in amd}))
                if amd
                else ""
            )
        )
    data["fitted"] = fitted
    header = path.read_text().split("schema_version")[0]
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))
    _efficiency_file.cache_clear()


# -- report ------------------------------------------------------------------------------------


def table(results: list[Result], loso: list[Result] | None = None, header: bool = True) -> str:
    held = {r.point.id: r for r in loso or []}
    title = (
        f"{'point':34} {'set':5} {'source':6} {'published':>10} {'simulated':>10} {'error':>7}"
        + ("  LOSO" if held else "")
        + "  config"
    )
    lines = [title] if header else []
    for r in results:
        p = r.point
        extra = f" {held[p.id].error:+6.0%}" if p.id in held else ""
        digits = 2 if isinstance(p, Speedup) else 1  # a speed-up (x), not tok/s
        lines.append(
            f"{p.id:34} {p.set:5} {p.source:6} {p.measured:10,.{digits}f} "
            f"{r.simulated:10,.{digits}f} {r.error:+7.0%}{extra}  {r.config}"
        )
    return "\n".join(lines)


def error_row(name: str, results: list[Result]) -> str:
    """One row of the validation table: points, mean and worst |error|, share within 25%, and
    the error 90% of the points are within as a range x/÷ (1 + e) around the simulated figure
    (what a simulated range states: accuracy.range_error)."""
    from bench.sim.profiles.accuracy import covering_error, range_error

    if not results:
        return f"| {name} | 0 | - | - | - | - |"
    errs = [abs(r.error) for r in results]
    worst = max(results, key=lambda r: abs(r.error))
    within = sum(e <= 0.25 for e in errs) / len(errs)
    return (
        f"| {name} | {len(errs)} | {np.mean(errs):.1%} | {worst.error:+.0%} ({worst.point.id}) "
        f"| {within:.0%} | {covering_error([range_error(r.error) for r in results]):.0%} |"
    )


def validation_table(
    in_sample: list[Result],
    loso: list[Result] | None,
    after: list[Result],
    engine: list[Result] | None = None,
    split: list[Result] | None = None,
    mtp: list[Result] | None = None,
    steps: list[Result] | None = None,
    steps_held: list[Result] | None = None,
) -> str:
    """The one validation table (benchmarks/simulator.py prints it; the README carries it)."""
    rows = [
        "| set | points | mean abs. error | worst | within ±25% | 90% within |",
        "|---|---|---|---|---|---|",
        error_row("in sample (formula clock, the fit's)", in_sample),
    ]
    if engine is not None:
        rows.append(error_row("in sample (engine clock: what `sim run` executes)", engine))
    if loso is not None:
        rows.append(error_row("leave-one-source-out (each source held out of the fit)", loso))
    rows.append(error_row("points added after the fit", after))
    if split is not None:
        rows.append(error_row(DISAGG_ROW, split))
    if mtp is not None:
        rows.append(error_row(MTP_ROW, mtp))
    if steps is not None:
        rows.append(error_row(STEPS_ROW.format(w=STEP_WEIGHT), steps))
    if steps_held is not None:
        rows.append(error_row(STEPS_HELD_ROW, steps_held))
    return "\n".join(rows)


def summary(results: list[Result], loso: list[Result] | None = None) -> dict[str, float]:
    """Mean abs. error overall and per set, worst point, and the held-out figure."""
    out = {"points": len(results), "mae": mean_abs_error(results)}
    out["max_abs"] = max(abs(r.error) for r in results)
    out["within_25"] = sum(abs(r.error) <= 0.25 for r in results)
    for s in ("dense", "moe", "amd"):
        out[f"mae_{s}"] = mean_abs_error([r for r in results if r.point.set == s])
    if loso:
        out["loso_mae"] = mean_abs_error(loso)
        out["loso_max_abs"] = max(abs(r.error) for r in loso)
        fitted = [r for r in loso if r.group_fitted]
        out["loso_fitted_points"] = len(fitted)
        out["loso_mae_fitted"] = mean_abs_error(fitted)
        out["loso_mae_prior"] = mean_abs_error([r for r in loso if not r.group_fitted])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Validate (and refit) the simulator")
    ap.add_argument("--fit", action="store_true", help="refit and write efficiency.yaml")
    ap.add_argument("--loso", action="store_true", help="leave-one-source-out (slow)")
    ap.add_argument(
        "--choose-loss", action="store_true",
        help="score the loss settings of LOSS_GRID by leave-one-source-out (~2 min each) and stop",
    )  # fmt: skip
    ap.add_argument("--clock", choices=["formula", "engine"], default="formula")
    ap.add_argument(
        "--write-held-out", action="store_true",
        help=f"with --loso: write {HELD_OUT_YAML.name} (the simulator's expected error)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.write_held_out and not args.loso:
        ap.error("--write-held-out needs --loso (the held-out errors it writes)")
    pts = load_published().scored
    if args.choose_loss:
        print(loss_table(choose_loss(pts)))
        return
    if args.fit:
        _, values = fit(pts)
        write_fit(values, pts)
    sim = Sim(clock=args.clock)
    results = validate(sim=sim)
    after = validate(sim=sim, points=load_published().after_fit)
    loso = leave_one_source_out(pts) if args.loso else None
    steps = validate(sim=sim, points=decode_step_points())
    steps_held = steps_held_out(pts) if args.loso else None
    split, mtp = disaggregated(), mtp_speedups()
    print(table(results + after, loso))
    print(table(split, header=False))  # the same points, their sources' splits in the fronts
    print(table(mtp, header=False))  # speed-ups (ratios), not tok/s
    if args.clock == "engine":  # the fit's own clock keeps its row; the engine's gets its own
        print(validation_table(validate(), loso, after, results, split, mtp, steps, steps_held))
    else:
        print(validation_table(results, loso, after, None, split, mtp, steps, steps_held))
    if args.write_held_out and loso is not None:
        write_held_out(loso, after, disagg_held_out(loso, after), mtp)
        print(f"wrote {HELD_OUT_YAML}")
    print(
        {k: round(v, 3) if isinstance(v, float) else v for k, v in summary(results, loso).items()}
    )
    for r in load_published().ratios:
        print(f"ratio {r.id}: published {r.measured:.2f} simulated {sim.ratio(r):.2f}")


if __name__ == "__main__":
    main()
