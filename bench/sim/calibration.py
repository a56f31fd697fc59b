"""The simulator against published measurements (profiles/published.yaml), and the efficiency fit.

Each published point is reproduced by its source's method:
  batch1         one stream's decode rate;
  max_tput       offline maximum throughput (output tok/s per GPU) with as many sequences as the
                 KV cache holds at mean context ISL + OSL/2;
  interactivity  InferenceX: every parallelism of the point's sweep x every concurrency (x MTP
                 off/on; narrower where the point records its source's narrower search: mtp,
                 min_conc, max_conc), the Pareto front of total tok/s/GPU against tok/s/user
                 (1 / median TPOT), linear interpolation at the published interactivity. A target outside the front has no
                 value: the simulator cannot reach it, and the point scores -100%.
InferenceX draws prompt lengths uniformly in 80-100% of the nominal ISL [S2], so its total
tokens count 0.9 x ISL; trtllm-bench uses the nominal lengths.

Two clocks reproduce a point: `formula` (steady_state: the engine's step-time function at the
engine's steady-state schedule, microseconds per point, used for fitting) and `engine` (the
closed-loop engine in virtual time, what `sim run` and `sim serve` execute). Deployments that do
not fit in memory are skipped, not fatal.

The fit (`fit()`): global parameters (overheads, MoE imbalance, collective latency) plus MBU and
MFU per (vendor, engine, weight format) group, least squares on log(simulated / published)
with a soft-L1 loss and a weak pull toward the initial values (so a group with three points
cannot wander to implausible efficiencies). The Jacobian is sparse (a point sees the globals
and its own group), so every group is differenced in the same evaluations: a fit takes seconds.
A group a published point or ratio needs but no fitted point measures gets a prior (`_prior`):
the same engine and format on another vendor, else the same engine at a sibling format scaled,
else the vendor's mean at that format; anything else falls back to the vendor's means.
`leave_one_source_out()` refits without each source and scores that source's points, marking
those whose group only the prior reaches (`Result.group_fitted`); summary() reports the
held-out error over all points and over the points whose group is still fitted.

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

from bench.sim.profiles import (
    EFFICIENCY_YAML,
    HERE,
    Efficiency,
    GPUProfile,
    ModelProfile,
    _efficiency_file,
    efficiency_for,
    get_gpu,
    get_model,
    get_precision,
    serving_defaults,
)
from bench.sim.roofline import Deployment, parse_parallel, steady_state

PUBLISHED_YAML: Path = HERE / "published.yaml"
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


@dataclass
class Result:
    point: Point
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

    @property
    def scored(self) -> list[Point]:
        return [p for p in self.points if p.expressible]


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
    return Published(
        points, ratios, data["sweeps"], data["sweep_concurrency"], dict(data["sources"]), limits
    )


# -- reproducing points ------------------------------------------------------------------------

MTP_SWEEP = (0, 1)  # drafted tokens InferenceX's curves are searched over (0 = MTP off)
# engine clock: configurations the formula puts more than 10% behind the front are not run
FRONT_MARGIN = 0.10


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
    ) -> None:
        if clock not in ("formula", "engine"):
            raise ValueError(f"clock {clock!r} is not formula or engine")
        self.profiles, self.clock = profiles, clock
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
        try:
            dep = Deployment.build(
                g, m, precision, tp, dp=dp, ep=ep, engine=engine, mtp=mtp,
                resolved=self._effs[key],
            )  # fmt: skip
            dep.kv_capacity_tokens(serving_defaults().gpu_memory_utilization)
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
        runs: list[tuple[float, float, str, Deployment, float]] = []
        mtps = MTP_SWEEP if _model(p.model).mtp_layers and p.mtp else (0,)
        concs = [c for c in self.pub.concurrency if p.min_conc <= c <= (p.max_conc or c)]
        for par in self.pub.sweeps[p.sweep]:
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
        if self.clock == "engine":
            kept = _near_front(runs, FRONT_MARGIN)
            runs = [(*self.measure(d, p, c)[::2], cfg, d, c) for _, _, cfg, d, c in kept]
        self._fronts[key] = [(x, y, cfg) for x, y, cfg, _, _ in runs]
        return self._fronts[key]

    def reproduce(self, p: Point) -> Result:
        """The simulator's figure for one published point, by that point's method."""
        if p.kind == "interactivity":
            return pareto_interpolate(p, self.front(p))
        dep = self.deployment(p.gpu, p.model, p.precision, p.parallel, p.engine)
        if dep is None:
            return Result(p, 0.0, f"{p.parallel} does not fit")
        if p.kind == "batch1":
            return Result(p, self.measure(dep, p, 1)[0], f"{p.parallel} c1")
        if p.kind == "max_tput":
            limits = self.pub.engine_limits.get(_engine_family(p.engine), {})
            c = max_concurrency(
                dep, p.isl, p.osl, limits.get("max_batch_size", 0),
                limits.get("kv_reserve") == "prompt+max_output",
            )  # fmt: skip
            return Result(p, self.measure(dep, p, c)[1], f"{p.parallel} c{c:.0f}")
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
    """
    util = serving_defaults().gpu_memory_utilization
    c = dep.kv_capacity_tokens(util) / (isl + (osl if reserve_full else osl / 2))
    return min(c, max_batch * dep.dp) if max_batch else c


def _measure(dep: Deployment, p: Point, conc: float, clock: str) -> tuple[float, float, float]:
    """(interactivity, output tok/s/GPU, total tok/s/GPU) at one concurrency."""
    if clock == "formula":
        s = steady_state(dep, p.mean_isl, p.osl, conc)
        return s["interactivity"], s["output_tps_per_gpu"], s["total_tps_per_gpu"]
    from bench.sim.engine import Engine, EngineConfig
    from bench.sim.virtual import run_closed_loop

    c = max(int(conc), 1)
    d = serving_defaults()
    cfg = EngineConfig.default(
        max_num_seqs=c, max_num_batched_tokens=d.max_num_batched_tokens * dep.dp
    )
    if p.kind == "interactivity":
        lo, hi = (round(p.isl * f) for f in INFERENCEX_ISL)
    else:
        lo = hi = p.isl
    r = run_closed_loop(Engine(dep, cfg), c, (lo, hi), p.osl)
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
) -> Result:
    """The simulator's figure for one published point, by that point's method."""
    return Sim(profiles, clock, pub).reproduce(p)


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


# -- fitting -----------------------------------------------------------------------------------

GLOBAL = {  # name: (initial, low, high)
    "t_fix_s": (0.002, 0.0005, 0.01),
    "t_tok_s": (1e-6, 1e-8, 3e-5),
    "t_moe_tok_s": (1e-7, 1e-9, 2e-6),
    "moe_imbalance": (0.2, 0.001, 1.5),
    "moe_mfu_ratio": (0.7, 0.2, 1.5),
    "allreduce_latency_s": (2e-5, 2e-6, 1e-4),
    "mfu_prefill_ratio": (1.2, 0.7, 2.0),
}
GROUP = {"mbu": (0.8, 0.4, 0.95), "mfu": (0.4, 0.08, 0.85)}
FIT_NFEV = 150  # cost evaluations of the least-squares fit (each Jacobian costs ~10 more)
PRIOR_WEIGHT = 0.05  # per parameter, on log(value / initial): a 2x move costs as a 3.5% miss


Group = tuple[str, str, str]  # (vendor, engine family, weight format)


def _profiles_from(
    x: np.ndarray, groups: list[Group], wanted: list[Group] | None = None
) -> list[dict]:
    """Efficiency profiles for parameter vector x: the global values, one profile per fitted
    group, a prior (`_prior`) for every wanted group without points, and vendor-level means for
    any other deployment a user may simulate."""
    names = list(GLOBAL)
    g = dict(zip(names, x[: len(names)], strict=True))
    ratio = g.pop("mfu_prefill_ratio")
    g["alltoall_latency_s"] = g["allreduce_latency_s"]
    profiles: list[dict] = [{"match": {}, "set": {k: float(v) for k, v in g.items()}}]
    fitted: dict[Group, dict[str, float]] = {}
    for i, grp in enumerate(groups):
        off = len(names) + i * len(GROUP)
        fitted[grp] = {k: float(v) for k, v in zip(GROUP, x[off : off + len(GROUP)], strict=True)}

    def entry(grp: Group, vals: dict[str, float], source: str = "") -> dict:
        vals = {**vals, "mfu_prefill": min(vals["mfu"] * ratio, 0.9)}
        vendor, engine, fmt = grp
        prof = {"match": {"vendor": vendor, "engine": engine, "precision": fmt}, "set": vals}
        return {**prof, "source": source} if source else prof

    # vendor-level means for deployments no published point or ratio names: the same vendor's
    # groups at the same compute precision, overridden by those at the same weight format
    # (listed later, so applied later); never another vendor's groups
    by_key: dict[tuple, list[dict]] = {}
    for (vendor, _, fmt), vals in fitted.items():
        compute = get_precision(fmt).compute
        by_key.setdefault((("vendor", vendor), ("compute", compute)), []).append(vals)
        by_key.setdefault((("vendor", vendor), ("precision", fmt)), []).append(vals)
    for key in sorted(by_key, key=lambda k: k[1][0]):
        vals = _mean(by_key[key])
        profiles.append(
            {"match": dict(key), "set": {**vals, "mfu_prefill": min(vals["mfu"] * ratio, 0.9)}}
        )
    profiles += [entry(grp, vals) for grp, vals in fitted.items()]
    for grp in sorted(set(wanted or ()) - set(fitted)):
        prior = _prior(grp, fitted)
        if prior:
            profiles.append(entry(grp, prior[0], f"fallback (prior): {prior[1]}"))
    return profiles


def _mean(vals: list[dict[str, float]]) -> dict[str, float]:
    """Geometric mean per parameter (efficiencies combine multiplicatively)."""
    return {k: float(np.exp(np.mean([np.log(v[k]) for v in vals]))) for k in vals[0]}


def _prior(grp: Group, fitted: dict[Group, dict[str, float]]) -> tuple[dict, str] | None:
    """What a group without points of its own falls back to, most specific evidence first.

    1. The same engine at the same format on another vendor: the engine's kernels and scheduler
       set most of the efficiency (vLLM's FP8 GEMMs on ROCm are hipBLASLt's, tuned as cuBLAS).
    2. The same vendor and engine at another format run by the same tensor-core unit (NVFP4
       and MXFP4 both on the FP4 cores), scaled by how the two formats compare in the engines
       fitted at both (per parameter, geometric mean). Formats on different units are not
       scaled into each other: the only MXFP4 points are gpt-oss (MoE), the only FP8 vLLM
       ones Llama (dense), so their ratio would carry the model, not the format.
    3. The mean of the same vendor's groups at the same format, else at the same compute unit.
    Values stay inside the fit's bounds (GROUP). None: nothing to go on; the defaults apply.
    """
    vendor, engine, fmt = grp
    same = [v for (vd, e, f), v in fitted.items() if e == engine and f == fmt and vd != vendor]
    if same:
        return _mean(same), f"{engine} {fmt} as fitted on another vendor"
    scaled, via = [], []
    compute = get_precision(fmt).compute
    for (vd, e, f), vals in fitted.items():
        if vd != vendor or e != engine or get_precision(f).compute != compute:
            continue
        pairs = [
            (fitted[(v2, e2, fmt)], fitted[(v2, e2, f)])
            for (v2, e2, f2) in fitted
            if f2 == f and (v2, e2, fmt) in fitted
        ]
        if pairs:
            factor = {k: _mean([{k: a[k] / b[k]} for a, b in pairs])[k] for k in vals}
            scaled.append({k: vals[k] * factor[k] for k in vals})
            via.append(f"{f} x {fmt}/{f} of {len(pairs)} engine(s)")
    if scaled:
        vals = _mean(scaled)
        vals = {k: min(max(v, GROUP[k][1]), GROUP[k][2]) for k, v in vals.items()}
        return vals, f"{vendor} {engine} at " + "; ".join(via)
    for level, test in (
        ("format", lambda f: f == fmt),
        ("compute", lambda f: get_precision(f).compute == get_precision(fmt).compute),
    ):
        near = [v for (vd, _, f), v in fitted.items() if vd == vendor and test(f)]
        if near:
            return _mean(near), f"mean of {vendor}'s groups at the same {level}"
    return None


def wanted_groups(pub: Published) -> list[Group]:
    """Every (vendor, engine, format) a published point or ratio needs."""
    wanted = {p.group for p in pub.scored}
    for r in pub.ratios:
        for side, engine in ((r.num, r.num_engine or r.engine), (r.den, r.engine)):
            vendor = get_gpu(side["gpu"]).vendor
            wanted.add((vendor, _engine_family(engine), weight_format(side["precision"])))
    return sorted(wanted)


def _residuals(results: list[Result]) -> np.ndarray:
    return np.array([math.log(max(r.simulated, 1e-9 * r.point.measured) / r.point.measured) if r.simulated > 0 else math.log(0.05) for r in results])  # fmt: skip


def _hand_profiles() -> list[dict]:
    """efficiency.yaml's hand-set profiles (engine defaults such as MTP), kept under every fit."""
    return list(_efficiency_file(EFFICIENCY_YAML).get("profiles") or [])


def fit(points: list[Point]) -> tuple[list[dict], list[Group]]:
    """Fit global and per-group parameters on `points` (formula clock); returns the profiles.

    A point depends on the global parameters and on its own group's only, so the Jacobian is
    sparse and every group's columns are estimated in the same evaluations.
    """
    from bench.extras import require

    require("scipy", "Fitting the simulator")  # one line naming the extra, not a traceback
    from scipy.optimize import least_squares

    groups = sorted({p.group for p in points})
    specs = list(GLOBAL.values()) + [s for _ in groups for s in GROUP.values()]
    x0 = np.log([s[0] for s in specs])
    lo, hi = np.log([s[1] for s in specs]), np.log([s[2] for s in specs])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    pub = load_published()
    hand = _hand_profiles()

    def resid(z: np.ndarray) -> np.ndarray:
        sim = Sim(hand + _profiles_from(np.exp(z), groups), "formula", pub)
        fit_terms = _residuals([sim.reproduce(p) for p in points])
        return np.concatenate([fit_terms, PRIOR_WEIGHT * (z - x0)])  # pull toward defaults

    # columns that touch disjoint points are differenced together: each global alone, then
    # parameter k of every group at once (the prior rows are diagonal, so they never collide)
    n_glob = len(GLOBAL)
    colours = [[i] for i in range(n_glob)] + [
        [n_glob + j * len(GROUP) + k for j in range(len(groups))] for k in range(len(GROUP))
    ]

    def jac(z: np.ndarray) -> np.ndarray:
        f0 = resid(z)
        J = np.zeros((len(f0), len(z)))
        for cols in colours:
            h = np.zeros_like(z)
            h[cols] = 0.02 * np.maximum(1.0, np.abs(z[cols])) * np.where(z[cols] >= 0, 1, -1)
            step = np.where(z + h > hi, -h, h)  # stay inside the bounds
            df = resid(z + step) - f0
            for c in cols:
                rows = np.zeros(len(f0), dtype=bool)
                rows[len(points) + c] = True
                if c < n_glob:
                    rows[: len(points)] = True
                else:
                    grp = groups[(c - n_glob) // len(GROUP)]
                    rows[: len(points)] = [p.group == grp for p in points]
                J[rows, c] = df[rows] / step[c]
        return J

    # x_scale="jac": the parameters move the residuals by orders of magnitude apart (a global
    # overhead touches 60 points, an AMD efficiency three), and unscaled the trust region
    # collapsed after 18 evaluations at 3.8x the cost reached with scaling
    sol = least_squares(
        resid, x0, jac=jac, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=FIT_NFEV,
        x_scale="jac",
    )  # fmt: skip
    return hand + _profiles_from(np.exp(sol.x), groups, wanted_groups(pub)), groups


def leave_one_source_out(points: list[Point]) -> list[Result]:
    """For each source, fit on every other source's points and reproduce this source's.

    A held-out point whose (vendor, engine, format) group no other source measures is marked
    group_fitted=False: its efficiency is the prior (`_prior`), not a fit, so it tests the
    prior's physics rather than the fit's transfer. summary() reports both figures.
    """
    out: list[Result] = []
    for src in sorted({p.source for p in points}):
        train = [p for p in points if p.source != src]
        profiles, groups = fit(train)
        for r in validate(profiles, points=[p for p in points if p.source == src]):
            r.group_fitted = r.point.group in groups
            out.append(r)
    return out


def write_fit(profiles: list[dict], points: list[Point], path: Path = EFFICIENCY_YAML) -> None:
    """Store fitted profiles in efficiency.yaml's `fitted` list, each naming its points."""
    data = yaml.safe_load(path.read_text())
    ids_by_group: dict[tuple, list[str]] = {}
    for p in points:
        ids_by_group.setdefault(p.group, []).append(p.id)
    srcs = sorted({p.source for p in points})
    hand = _hand_profiles()
    profiles = [dict(prof) for prof in profiles if prof not in hand]
    for prof in profiles:
        m = prof["match"]
        key = (m.get("vendor"), m.get("engine"), m.get("precision"))
        ids = ids_by_group.get(key)
        prof["set"] = {k: float(f"{v:.4g}") for k, v in prof["set"].items()}
        if not m:
            prof["source"] = f"fitted (global) on {len(points)} points of {', '.join(srcs)}"
        elif ids:
            prof["source"] = f"fitted on {len(ids)} points: {', '.join(ids)}"
        elif not prof.get("source"):
            prof["source"] = "fallback: mean of this vendor's fitted groups it matches"
    data["fitted"] = profiles
    header = path.read_text().split("schema_version")[0]
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))
    _efficiency_file.cache_clear()


# -- report ------------------------------------------------------------------------------------


def table(results: list[Result], loso: list[Result] | None = None) -> str:
    held = {r.point.id: r for r in loso or []}
    lines = [
        f"{'point':34} {'set':5} {'source':6} {'published':>10} {'simulated':>10} {'error':>7}"
        + ("  LOSO" if held else "")
        + "  config"
    ]
    for r in results:
        p = r.point
        extra = f" {held[p.id].error:+6.0%}" if p.id in held else ""
        lines.append(
            f"{p.id:34} {p.set:5} {p.source:6} {p.measured:10,.1f} {r.simulated:10,.1f} "
            f"{r.error:+7.0%}{extra}  {r.config}"
        )
    return "\n".join(lines)


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
    ap.add_argument("--clock", choices=["formula", "engine"], default="formula")
    args = ap.parse_args()
    pts = load_published().scored
    if args.fit:
        profiles, _ = fit(pts)
        write_fit(profiles, pts)
    sim = Sim(clock=args.clock)
    results = validate(sim=sim)
    loso = leave_one_source_out(pts) if args.loso else None
    print(table(results, loso))
    print(
        {k: round(v, 3) if isinstance(v, float) else v for k, v in summary(results, loso).items()}
    )
    for r in load_published().ratios:
        print(f"ratio {r.id}: published {r.measured:.2f} simulated {sim.ratio(r):.2f}")


if __name__ == "__main__":
    main()
