"""`tokenbench sim tune`: search the simulator's configurations for the cheapest way to hold an SLO.

A buyer asks which GPU, at which settings, holds the SLO most cheaply. Within one GPU type
every pricing tier charges per GPU-hour, so the cheapest configuration on each tier is the one
with the highest capacity per GPU at the SLO; across GPU types the tiers' prices decide.

The search, in virtual time (bench.sim.virtual), per GPU type:
1. every combination of parallelism (TP; DEP/TEP for MoE models), precision, MTP and the
   coarse batch limits; those whose weights do not fit (bench.sim.memory's arithmetic, through
   the deployment build) or that the GPU cannot run are dropped with the reason;
2. each remaining configuration's saturated throughput: one point with every request sent at
   once, not stored. The capacity at an SLO is the throughput of a load the deployment keeps up
   with, so it does not exceed the saturated throughput; that is the bound the search prunes by;
3. configurations in order of that bound: each gets the SLO search every sweep uses
   (bench.sweep.Sweep through bench.drive.measure: bracket the boundary from the saturated rate
   down, bisect, re-measure the bracket), stored as one simulated run; a configuration whose
   bound (times PRUNE_MARGIN) is below the `top`-th best capacity found is not searched;
4. coarse to fine: the batch limits around the best configuration are refined (max-num-seqs
   halfway between the best value and its neighbours on a log scale; max-num-batched-tokens
   halved and doubled) and searched the same way, once;
5. disaggregated prefill/decode (bench.sim.disagg): the best configuration's settings split
   into xPyD prefill and decode pools of each TP degree (Space.disagg: 1P1D, 1P2D, 1P3D, 2P1D
   by default) within max_gpus, saturated and pruned the same way. Only around the best, not
   crossed with every coarse setting: a split changes where prefill runs, not which precision,
   MTP or batch limit suits the model, and crossing it would triple the search.

With a calibration profile (`--profile`, bench.sim.user_calibration), every configuration of
the profile's GPU type runs on the profile's device (its fitted efficiency and overheads) and
each capacity's range widens by the profile's own expected error, as `sim run --profile` does;
other GPU types keep the published fits and their category's held-out error.

Each stored run carries `tune` metadata (experiment, settings, the `sim run` command that
reproduces it), as `tokenbench tune` stores its runs, so compare, the dashboard and the deck
rank them the same way (bench.choose).
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bench.choose import cheaper_beyond_ranges, usd_range
from bench.cost import Catalogue, CostRow, PriceCatalogueError, cost_table
from bench.curves import Capacity
from bench.metrics import Threshold, slo_text
from bench.scenario import Scenario
from bench.sweep import PointSpec, SweepPlan, scenario_at

if TYPE_CHECKING:
    from bench.hardware import GPUProfile

# A configuration is skipped only when its saturated throughput, times this, is below the
# capacity it would have to beat: the saturated point's own sampling and drain tail moves it
# by a few percent, and a skipped configuration is never looked at again.
PRUNE_MARGIN = 1.10
KNOBS = ("parallel", "precision", "mtp", "max_num_seqs", "max_num_batched_tokens", "disagg")
DISAGG_SPLITS = ["1P1D", "1P2D", "1P3D", "2P1D"]


@dataclass(frozen=True)
class Config:
    """One simulated deployment: what `sim run` takes (None = the engine's default)."""

    gpu: str
    parallel: str  # tp2, dep8, tep8
    precision: str
    mtp: int = 0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    disagg: str | None = None  # "xPyD" instances of `parallel` each; None: colocated
    profile: str | None = None  # a calibration profile's file: this GPU is its device

    @property
    def gpus(self) -> int:
        """GPUs of the deployment; a disaggregated one counts both pools (InferenceX)."""
        from bench.sim.disagg import parse_disagg
        from bench.sim.roofline import parse_parallel

        tp, dp, _ = parse_parallel(self.parallel)
        instances = sum(parse_disagg(self.disagg)) if self.disagg else 1
        return tp * dp * instances

    def settings(self) -> dict[str, Any]:
        """The configuration as the settings a tune experiment stores (bench.tune); a
        colocated one stores no disagg key (as it did before the split was searched)."""
        out = {"gpu": self.gpu, **{k: getattr(self, k) for k in KNOBS}}
        if out["disagg"] is None:
            del out["disagg"]
        return out

    def text(self) -> str:
        seqs = f" seqs {self.max_num_seqs}" if self.max_num_seqs else ""
        tokens = f" tokens {self.max_num_batched_tokens}" if self.max_num_batched_tokens else ""
        mtp = f" MTP{self.mtp}" if self.mtp else ""
        split = f" {self.disagg}" if self.disagg else ""
        cal = " (calibrated)" if self.profile else ""
        return f"{self.gpu}{cal}{split} {self.parallel} {self.precision}{mtp}{seqs}{tokens}"

    def executor(self, model: str, engine: str, profile: Any = None):
        """The virtual-time executor of this configuration, from the one chooser; on a
        calibration profile's device (and stored with its errors) when `profile` is given."""
        from bench.drive import choose_executor
        from bench.sim.engine import ServeOptions

        options = ServeOptions(
            self.max_num_seqs, self.max_num_batched_tokens, mtp=self.mtp, disagg=self.disagg
        )
        virtual = {"gpu": self.gpu, "model": model, "precision": self.precision,
                   "parallel": self.parallel, "engine": engine, "options": options}  # fmt: skip
        if profile is not None:
            from bench.sim.error_bars import calibration_record

            virtual["gpu"] = profile.calibrated_device()
            virtual["calibration"] = calibration_record(profile)
        return choose_executor(virtual=virtual)

    def command(self, model: str, engine: str) -> str:
        """The `sim run` command line that simulates this configuration alone."""
        where = ["--profile", self.profile] if self.profile else ["--gpu", self.gpu]
        argv = ["tokenbench", "sim", "run", *where, "--model", model,
                "--precision", self.precision, "--parallel", self.parallel, "--engine", engine]  # fmt: skip
        if self.mtp:
            argv += ["--mtp", str(self.mtp)]
        if self.max_num_seqs:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens:
            argv += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.disagg:
            argv += ["--disagg", self.disagg]
        return shlex.join(argv)


@dataclass
class Space:
    """What the search may vary. `parallels` None: every TP degree (and DEP/TEP for a MoE
    model) of 1, 2, 4, 8 GPUs up to `max_gpus` and the GPU's scale-up domain."""

    gpus: list[str]
    precisions: list[str] = field(default_factory=lambda: ["fp8", "fp4", "bf16"])
    mtp: list[int] = field(default_factory=lambda: [0, 2])
    max_num_seqs: list[int] = field(default_factory=lambda: [32, 128, 512])
    max_num_batched_tokens: list[int | None] = field(default_factory=lambda: [None])
    parallels: list[str] | None = None
    max_gpus: int = 8
    refine: bool = True
    disagg: list[str] = field(default_factory=lambda: list(DISAGG_SPLITS))  # [] = colocated only


@dataclass
class Outcome:
    """What the search learned of one configuration.

    status: "searched" (SLO search run and stored), "pruned" (its saturated throughput could
    not beat the configurations kept), "unfit" (it cannot run: weights do not fit, or the GPU
    lacks the precision), "failed" (the simulation refused it)."""

    config: Config
    status: str
    reason: str = ""
    peak_per_gpu: float | None = None  # output tok/s per GPU with every request at once
    peak_rps: float | None = None
    capacity: Capacity | None = None
    run_id: str | None = None
    cost_rows: list[CostRow] = field(default_factory=list)
    stage: str = "coarse"  # "coarse", "refine" or "disagg"

    @property
    def value(self) -> float:
        """Capacity per GPU at the SLO, 0 when none (the order the search keeps)."""
        cap = self.capacity
        if cap is None or cap.kind in ("none", "below") or cap.value is None:
            return 0.0
        return cap.value


@dataclass
class TuneResult:
    """Every configuration's outcome, and the answers read from them."""

    experiment: str
    model: str
    engine: str
    scenario: str
    slo: list[Threshold]
    outcomes: list[Outcome]
    elapsed_s: float
    simulated_requests: int
    top: int = 3
    profile: Any = None  # the calibration profile one GPU type ran on (bench.sim.user_calibration)

    def expected_errors(self, gpu: str) -> tuple[dict[str, float], str]:
        """({quantity: relative error}, basis) of a GPU type's figures: the profile's own on
        its GPU type, else the category's held-out error (bench.sim.profiles.accuracy), at
        least the disaggregated fronts' or the MTP speed-ups' where its best configuration
        splits prefill from decode or drafts tokens, as that configuration's range does."""
        from bench.sim.profiles.accuracy import expected_errors

        on_profile = any(o.config.profile for o in self.outcomes if o.config.gpu == gpu)
        best = self.best(gpu)[:1]
        cfg = best[0].config if best else None
        return expected_errors(
            gpu, self.model, self.profile if on_profile else None,
            disagg=bool(cfg and cfg.disagg), mtp=bool(cfg and cfg.mtp), engine=self.engine,
        )  # fmt: skip

    def searched(self, gpu: str | None = None) -> list[Outcome]:
        """Searched configurations with a capacity, best first (per GPU: cheapest first)."""
        out = [o for o in self.outcomes if o.status == "searched" and o.value > 0]
        if gpu is not None:
            out = [o for o in out if o.config.gpu == gpu]
        return sorted(out, key=lambda o: -o.value)

    def gpus(self) -> list[str]:
        return list(dict.fromkeys(o.config.gpu for o in self.outcomes))

    def best(self, gpu: str) -> list[Outcome]:
        return self.searched(gpu)[: self.top]

    def tiers(self) -> list[dict[str, Any]]:
        """Per pricing tier, each GPU type's cheapest configuration and its $/Mtok (output
        tokens, with the range the capacity's range gives), cheapest GPU first."""
        rows: dict[str, list[dict[str, Any]]] = {}
        caps: dict[str, Capacity | None] = {}  # run id: its capacity, for the verdict
        for gpu in self.gpus():
            best = self.best(gpu)
            if not best:
                continue
            o = best[0]
            caps[o.run_id] = o.capacity
            for row in o.cost_rows:
                if row.output_usd_per_mtok is None:
                    continue
                low, high = usd_range(row.output_usd_per_mtok, o.capacity)
                rows.setdefault(row.tier, []).append(
                    {
                        "tier": row.tier, "gpu": gpu, "config": o.config.text(),
                        "settings": o.config.settings(), "gpus": o.config.gpus,
                        "usd_per_gpu_hour": row.price_usd_per_gpu_hr,
                        "output_usd_per_mtok": row.output_usd_per_mtok,
                        "output_usd_per_mtok_low": low, "output_usd_per_mtok_high": high,
                        "total_usd_per_mtok": row.total_usd_per_mtok, "run_id": o.run_id,
                    }
                )  # fmt: skip
        out = []
        for tier, entries in rows.items():
            entries.sort(key=lambda e: e["output_usd_per_mtok"])
            verdict = tier_verdict(entries, [caps.get(e["run_id"]) for e in entries])
            out.append({"tier": tier, "by_gpu": entries, "verdict": verdict})
        return out

    def sensitivity(self) -> list[dict[str, Any]]:
        """Which settings changed the answer most, per GPU type: for each setting, the best
        capacity per GPU reachable with it fixed at each value (the others re-tuned), and
        how much the worst value that can run loses against the best. A value whose best
        configuration was pruned is known only up to its saturated throughput (`at_most`),
        so its loss is a lower bound (`loss_is_bound`); a value no configuration can run
        at (weights do not fit, precision missing) is listed with `runs` false."""
        out = []
        for gpu in self.gpus():
            outs = [o for o in self.outcomes if o.config.gpu == gpu]
            best = max((o.value for o in outs), default=0.0)
            if not best:
                continue
            for knob in KNOBS:
                values: dict[Any, dict[str, Any]] = {}
                for o in outs:
                    e = values.setdefault(
                        getattr(o.config, knob),
                        {"value": getattr(o.config, knob), "capacity": None, "at_most": None,
                         "runs": False},
                    )  # fmt: skip
                    if o.status in ("unfit", "failed"):
                        continue
                    e["runs"] = True
                    if o.value:
                        e["capacity"] = max(e["capacity"] or 0.0, o.value)
                    elif o.peak_per_gpu is not None:  # pruned, or no load met the SLO
                        e["at_most"] = max(e["at_most"] or 0.0, o.peak_per_gpu)
                if len(values) < 2:
                    continue
                for e in values.values():
                    if e["at_most"] is not None and e["at_most"] <= (e["capacity"] or 0.0):
                        e["at_most"] = None  # a searched capacity already bounds it
                running = [e for e in values.values() if e["runs"]]
                ranked = sorted(running, key=lambda e: -max(e["capacity"] or 0, e["at_most"] or 0))
                ranked += [e for e in values.values() if not e["runs"]]
                worst = ranked[len(running) - 1] if running else ranked[-1]
                reach = max(worst["capacity"] or 0.0, worst["at_most"] or 0.0)
                out.append({
                    "gpu": gpu, "setting": knob, "values": ranked,
                    "best_value": ranked[0]["value"], "worst_value": worst["value"],
                    "loss": 1.0 - reach / best, "loss_is_bound": worst["at_most"] is not None,
                })  # fmt: skip
        out.sort(key=lambda e: (self.gpus().index(e["gpu"]), -e["loss"]))
        return out

    def to_json(self) -> dict[str, Any]:
        """The `--json` document: every configuration, the answers, how long it took."""
        errors = {}
        for gpu in self.gpus():
            per, basis = self.expected_errors(gpu)
            errors[gpu] = {"relative": max(per.values()), "basis": basis, "per_quantity": per}
        return {
            "experiment": self.experiment,
            "simulated": True,
            "model": self.model,
            "engine": self.engine,
            "scenario": self.scenario,
            "slo": slo_text(self.slo),
            "expected_error": errors,
            "elapsed_s": round(self.elapsed_s, 2),
            "simulated_requests": self.simulated_requests,
            "counts": {
                s: sum(o.status == s for o in self.outcomes)
                for s in ("searched", "pruned", "unfit", "failed")
            },  # fmt: skip
            "best": {gpu: [outcome_json(o) for o in self.best(gpu)] for gpu in self.gpus()},
            "tiers": self.tiers(),
            "sensitivity": self.sensitivity(),
            "configs": [outcome_json(o) for o in self.outcomes],
        }


def outcome_json(o: Outcome) -> dict[str, Any]:
    cap = o.capacity
    return {
        "config": o.config.text(),
        "settings": o.config.settings(),
        "gpus": o.config.gpus,
        "status": o.status,
        "reason": o.reason,
        "stage": o.stage,
        "peak_output_tps_per_gpu": o.peak_per_gpu,
        "capacity": None
        if cap is None
        else {
            "kind": cap.kind,
            "output_tps_per_gpu": cap.value,
            "low": cap.low,
            "high": cap.high,
            "requests_per_s": cap.point.requests_per_s if cap.point else None,
            "text": cap.text(),
            "simulator_error": cap.sim_error,
        },
        "run_id": o.run_id,
    }


def tier_verdict(
    entries: Sequence[dict[str, Any]], capacities: Sequence[Capacity | None] | None = None
) -> str:
    """The cheapest GPU on one tier, how far ahead, and whether the ranges separate them:
    with the capacities behind the entries, by the range of their ratio (choose.
    cheaper_beyond_ranges: the published fit's errors are shared by two simulated GPUs);
    without, by the entries' own $/Mtok ranges."""
    if not entries:
        return ""
    a = entries[0]
    head = f"{a['gpu']} ({a['config']}) at ${a['output_usd_per_mtok']:.3f}/Mtok output"
    if len(entries) < 2:
        return head + " (the only GPU priced on this tier)"
    b = entries[1]
    ratio = b["output_usd_per_mtok"] / a["output_usd_per_mtok"]
    if capacities is not None and None not in capacities[:2]:
        usd_a, usd_b = a["output_usd_per_mtok"], b["output_usd_per_mtok"]
        apart = cheaper_beyond_ranges(usd_a, usd_b, capacities[0], capacities[1])
    else:
        apart = (
            a["output_usd_per_mtok_high"] is not None
            and b["output_usd_per_mtok_low"] is not None
            and a["output_usd_per_mtok_high"] < b["output_usd_per_mtok_low"]
        )
    tail = "" if apart else ": not separable (their ranges overlap)"
    return f"{head}, {ratio:.2f}x cheaper than {b['gpu']} (${b['output_usd_per_mtok']:.3f}){tail}"


# ---------------------------------------------------------------- the space


def parallels_for(model: str, gpu: Any, max_gpus: int) -> list[str]:
    """TP over 1, 2, 4, 8 GPUs (within the GPU's scale-up domain and max_gpus); for a MoE
    model also attention-DP + expert parallel (dep) and TP + expert parallel (tep). `gpu` is
    a name or a device (a calibration profile's)."""
    from bench.sim.profiles import get_gpu, get_model

    g, m = get_gpu(gpu) if isinstance(gpu, str) else gpu, get_model(model)
    sizes = [n for n in (1, 2, 4, 8) if n <= min(max_gpus, g.world_size)]
    out = [f"tp{n}" for n in sizes]
    if m.is_moe:
        out += [f"{kind}{n}" for n in sizes if n > 1 for kind in ("dep", "tep")]
    return out


def configs_of(model: str, space: Space, profile: Any = None) -> list[Config]:
    """Every coarse configuration of the space, GPU by GPU; those of the GPU type a
    calibration profile describes (profile_gpu) on the profile's device."""
    out = []
    on = profile_gpu(profile, space.gpus) if profile is not None else None
    for gpu in space.gpus:
        device = profile.calibrated_device() if gpu == on else gpu
        path = str(profile.path) if gpu == on else None
        parallels = space.parallels or parallels_for(model, device, space.max_gpus)
        for par in parallels:
            for prec in space.precisions:
                for mtp in space.mtp:
                    for seqs in space.max_num_seqs:
                        for tokens in space.max_num_batched_tokens:
                            out.append(Config(gpu, par, prec, mtp, seqs, tokens, profile=path))
    return out


def disagg_configs(best: Config, model: str, space: Space) -> list[Config]:
    """The best configuration's settings split into prefill and decode pools: each split of
    Space.disagg over each TP degree (space.parallels' tpN, or TP over 1, 2, 4, 8) whose GPUs
    in all stay within max_gpus (a split needs at least 2)."""
    from bench.sim.roofline import parse_parallel

    parallels = space.parallels or parallels_for(model, best.gpu, space.max_gpus)
    out = []
    for par in parallels:
        tp, dp, ep = parse_parallel(par)
        if dp > 1 or ep > 1:
            continue  # one scheduler per pool holds replicas of a TP deployment only
        for split in space.disagg:
            c = replace(best, parallel=par, disagg=split)
            if c.gpus <= space.max_gpus:
                out.append(c)
    return out


def profile_gpu(profile: Any, gpus: Sequence[str]) -> str:
    """Which of `gpus` (as given: B200, h100, ...) is the GPU type the calibration profile's
    device is; ValueError in one line when none is: a profile describes one device, and a
    search that never runs on it would silently ignore it."""
    from bench.sim.profiles import get_gpu

    device = profile.device.name

    def canonical(name: str) -> str:
        try:
            return get_gpu(name).name
        except (KeyError, ValueError):
            return name

    for gpu in gpus:
        if gpu == device or canonical(gpu) == device:
            return gpu
    raise ValueError(
        f"{profile.path}: the profile calibrates {device}, which is not among --gpus "
        f"{','.join(gpus)}: add {device} to --gpus, or leave --gpus out to tune on the "
        "profile's device alone"
    )


def _gpu(config: Config) -> GPUProfile | None:
    """The configuration's GPU type, for the defaults an engine picks by device; None where the
    name is not a shipped GPU (a calibrated profile's own device keeps the base defaults)."""
    from bench.sim.profiles import ProfileError, get_gpu

    try:
        return get_gpu(config.gpu)
    except ProfileError:
        return None


def refinements(best: Config, space: Space, engine: str = "vllm") -> list[Config]:
    """Batch limits around the best coarse configuration: max-num-seqs halfway (log scale)
    to its coarse neighbours, max-num-batched-tokens halved and doubled."""
    from bench.sim.profiles import engine_defaults

    out = []
    coarse = sorted(space.max_num_seqs)
    if best.max_num_seqs in coarse:
        i = coarse.index(best.max_num_seqs)
        for j in (i - 1, i + 1):
            if 0 <= j < len(coarse):
                mid = round(math.sqrt(coarse[i] * coarse[j]))
                if mid not in coarse:
                    out.append(replace(best, max_num_seqs=mid))
    tokens = (
        best.max_num_batched_tokens or engine_defaults(engine, _gpu(best)).max_num_batched_tokens
    )
    for t in (tokens // 2, tokens * 2):
        if t not in space.max_num_batched_tokens:
            out.append(replace(best, max_num_batched_tokens=t))
    return out


# ---------------------------------------------------------------- the search


Progress = Callable[[int, int, str], None]  # (done, total, what now)


def search(
    scenario: Scenario,
    model: str,
    space: Space,
    slo: Sequence[Threshold],
    catalogue: Catalogue,
    *,
    engine: str = "vllm",
    db: str | None = None,
    store: bool = True,
    top: int = 3,
    slo_iterations: int = 6,
    slo_draws: int = 1,
    experiment: str | None = None,
    prune: bool = True,
    on_progress: Progress | None = None,
    profile: Any = None,
) -> TuneResult:
    """Search the space for the configurations with the most capacity per GPU at `slo` on
    the scenario's workload (see the module doc). `prune=False` searches every fitting
    configuration (brute force, what the pruning is tested against). With `profile` (a
    bench.sim.user_calibration.CalibrationProfile), its GPU type runs on its device."""
    if not slo:
        raise ValueError(
            "sim tune needs an SLO: give --slo (e.g. 'p99_ttft_ms<=2000,p99_tpot_ms<=50')"
        )
    started = time.monotonic()
    # One draw of prompts and arrivals for every configuration (copies keep the drawn seed),
    # so configurations differ by their settings, not by the workload they were shown.
    scenario = scenario.model_copy(deep=True)
    scenario.run_seed()
    name = experiment or f"sim-tune {model} {scenario.name}"
    state = _State(scenario, model, engine, list(slo), catalogue, db, store, top, slo_iterations,
                   slo_draws, name, prune, on_progress, profile)  # fmt: skip
    state.run(configs_of(model, space, profile), "coarse")
    if space.refine:
        for gpu in space.gpus:
            best = state.best_searched(gpu)
            if best is not None:
                state.run(refinements(best.config, space, engine), "refine")
    if space.disagg:
        for gpu in space.gpus:
            best = state.best_searched(gpu)
            if best is not None:
                state.run(disagg_configs(best.config, model, space), "disagg")
    return TuneResult(
        name, model, engine, scenario.name, list(slo), list(state.outcomes.values()),
        time.monotonic() - started, state.requests, top, profile,
    )  # fmt: skip


@dataclass
class _State:
    scenario: Scenario
    model: str
    engine: str
    slo: list[Threshold]
    catalogue: Catalogue
    db: str | None
    store: bool
    top: int
    slo_iterations: int
    slo_draws: int
    experiment: str
    prune: bool
    on_progress: Progress | None
    profile: Any = None
    outcomes: dict[Config, Outcome] = field(default_factory=dict)
    requests: int = 0
    done: int = 0
    total: int = 0

    def tick(self, what: str) -> None:
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, what)

    def best_searched(self, gpu: str) -> Outcome | None:
        found = [o for o in self.outcomes.values() if o.config.gpu == gpu and o.value > 0]
        return max(found, key=lambda o: o.value) if found else None

    def run(self, configs: list[Config], stage: str) -> None:
        """Fit, saturate, then SLO-search in order of the bound (see the module doc)."""
        configs = [c for c in dict.fromkeys(configs) if c not in self.outcomes]
        self.total += 2 * len(configs)
        fitting = []
        for c in configs:
            o = self._peak(c, stage)
            self.outcomes[c] = o
            self.tick(f"saturated {c.text()}")
            if o.status == "unfit" or o.status == "failed":
                self.tick("")  # no search to run
            else:
                fitting.append(o)
        fitting.sort(key=lambda o: -(o.peak_per_gpu or 0.0))
        for o in fitting:
            bar = self._bar(o.config.gpu)
            if self.prune and bar and (o.peak_per_gpu or 0.0) * PRUNE_MARGIN < bar:
                o.status = "pruned"
                o.reason = (
                    f"saturated throughput {o.peak_per_gpu:,.0f} tok/s per GPU is below the "
                    f"{self.top}th best capacity found ({bar:,.0f}) by more than "
                    f"{PRUNE_MARGIN - 1:.0%}"
                )
                self.tick(f"pruned {o.config.text()}")
                continue
            self._search(o)
            self.tick(f"searched {o.config.text()}")

    def _bar(self, gpu: str) -> float:
        """The capacity a configuration must be able to beat to matter: the `top`-th best
        of this GPU type so far (0 until `top` have a capacity)."""
        values = sorted(
            (o.value for o in self.outcomes.values() if o.config.gpu == gpu and o.value > 0),
            reverse=True,
        )
        return values[self.top - 1] if len(values) >= self.top else 0.0

    def _peak(self, c: Config, stage: str) -> Outcome:
        """The configuration's saturated throughput (every request sent at once), unstored;
        or why it cannot run."""
        from bench.drive import measure
        from bench.sim.profiles import ProfileError

        executor = c.executor(self.model, self.engine, self.profile if c.profile else None)
        try:
            sc = executor.adopt(self.scenario)
        except (ProfileError, ValueError) as exc:
            return Outcome(c, "unfit", str(exc), stage=stage)
        point = scenario_at(sc, PointSpec("rate", math.inf))
        try:
            result = measure(point, None, executor=executor, store=False, probe=None)
        except ValueError as exc:
            return Outcome(c, "failed", str(exc), stage=stage)
        s = result.points[0].summary
        self.requests += s.completed + s.failed
        if s.completed == 0:
            first = next(iter(s.errors), "every request failed")
            return Outcome(
                c, "failed", f"no request completed at saturation ({first})", stage=stage
            )
        return Outcome(
            c, "fits", peak_per_gpu=s.output_tokens_per_s / c.gpus,
            peak_rps=s.requests_per_s, stage=stage,
        )  # fmt: skip

    def _search(self, o: Outcome) -> None:
        """The SLO search of bench.sweep, from the saturated rate down, stored as one run."""
        from bench.drive import measure
        from bench.tune import combo_key

        c = o.config
        executor = c.executor(self.model, self.engine, self.profile if c.profile else None)
        sc = executor.adopt(self.scenario)
        sc.label = f"{c.text()} (sim tune)"
        plan = SweepPlan(
            specs=[PointSpec("rate", round(o.peak_rps or 1.0, 4))], thresholds=list(self.slo),
            slo_iterations=self.slo_iterations, slo_draws=self.slo_draws,
        )  # fmt: skip
        settings = c.settings()
        extra = {
            "tune": {
                "experiment": self.experiment, "key": combo_key(settings), "settings": settings,
                "engine": f"sim ({self.engine})", "engine_version": None,
                "command": c.command(self.model, self.engine), "outcome": "measured",
                "search": {"stage": o.stage, "peak_output_tps_per_gpu": o.peak_per_gpu},
            }
        }  # fmt: skip
        result = measure(sc, plan, executor=executor, db=self.db, store=self.store, probe=None,
                         extra=extra)  # fmt: skip
        self.requests += sum(p.summary.completed + p.summary.failed for p in result.points)
        o.status, o.run_id, o.capacity = "searched", result.run_id, result.at_slo
        cap = o.capacity
        if cap is not None and cap.point is not None and cap.value:
            try:
                o.cost_rows = cost_table(
                    c.gpu, c.gpus, cap.point.output_tps, cap.point.total_tps, self.catalogue
                )
            except PriceCatalogueError as exc:
                o.reason = f"no prices: {exc}"


def dumps(result: TuneResult) -> str:
    return json.dumps(result.to_json(), indent=2, default=str)
