"""`tokenbench tune`: measure a serving engine at every combination of its settings.

An experiment file holds an engine launch (bench.launchers), its health path, `params` (each
setting's list of values) and the usual scenario keys, with an optional `sweep` (the load
plan: rates, concurrencies or an auto sweep, with the scenario's SLO searched as `tokenbench
sweep` searches it). For each combination: start the engine in its own process group on a
free port, wait until its health path answers, warm it up, measure through bench.drive.measure
(one stored run, the settings, engine version and command line in its metadata), stop the
whole group. A combination already stored is skipped, so a rerun resumes; a launch that fails
or an engine that dies is stored as a failed run with its log's tail, and the experiment goes
on. The ranking reads the stored runs back, by capacity at the SLO as `compare` computes it.
"""

from __future__ import annotations

import itertools
import json
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.launchers import LAUNCHERS, LaunchSpecError, command_line, version_command
from bench.launchers._process import EngineProcess, LaunchError, engine_version, free_port
from bench.scenario import Scenario, ScenarioError, parse_scenario
from bench.session import Display, Headless
from bench.sweep import SweepPlan

TUNE_KEYS = ("launch", "health", "params", "sweep", "warmup_requests")
LAUNCH_KEYS = ("engine", "command", "binary", "args", "version")
SWEEP_KEYS = (
    "request_rates", "concurrency", "auto", "slo_iterations", "point_duration_s", "warmup_s",
    "cooldown_s", "max_error_rate",
)  # fmt: skip


class ExperimentError(ValueError):
    """An experiment file that cannot run; the message names the file and the field."""


@dataclass
class Experiment:
    """A parsed experiment file."""

    name: str
    engine: str  # a kind of bench.launchers.LAUNCHERS
    template: str | None  # launch.command (engine `command`)
    binary: str | None
    fixed: dict[str, Any]  # launch.args: settings every combination has
    version: str | None  # launch.version: a command printing the engine's version
    health_path: str
    health_timeout_s: float
    params: dict[str, list]
    scenario: Scenario
    sweep: SweepPlan | None
    warmup_requests: int
    base_dir: Path | None = None

    def combinations(self) -> list[dict[str, Any]]:
        """Every combination of the settings' values, in the file's order."""
        names = list(self.params)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product(*self.params.values())
        ]


def combo_key(settings: dict[str, Any]) -> str:
    """A combination as one stable string (the resume key)."""
    return json.dumps(settings, sort_keys=True)


def settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "(defaults)"


def load_experiment(
    path: Path, *, binary: str | None = None, args: dict[str, Any] | None = None
) -> Experiment:
    """Read and check an experiment file; every error names the file and the field.

    `binary` and `args` override the file's launch.binary and add to (or replace) its
    launch.args, so one file serves machines whose engine and model live elsewhere."""
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise ExperimentError(f"experiment file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: an experiment is a mapping with launch, params, ...")
    if binary is not None or args:
        launch = data.get("launch")
        launch = {"command": launch} if isinstance(launch, str) else dict(launch or {})
        if binary is not None:
            launch["binary"] = binary
        if args:
            launch["args"] = {**(launch.get("args") or {}), **args}
        data["launch"] = launch
    return parse_experiment(
        data, source=str(path), base_dir=path.parent, scenario_text=_scenario_text(text)
    )


def _scenario_text(text: str) -> str | None:
    """The file with its tune sections blanked line for line, so the scenario's errors name
    the file's own line numbers; None when the file is not a block mapping at the top."""
    node = yaml.compose(text)
    if not isinstance(node, yaml.MappingNode) or node.flow_style:
        return None
    lines = text.splitlines()
    starts = [key.start_mark.line for key, _ in node.value] + [len(lines)]
    for i, (key, _) in enumerate(node.value):
        if key.value in TUNE_KEYS:
            for n in range(starts[i], starts[i + 1]):
                lines[n] = ""
    return "\n".join(lines) + "\n"


def parse_experiment(
    data: dict, *, source: str, base_dir: Path | None = None, scenario_text: str | None = None
) -> Experiment:
    """Check an experiment's fields (`data`, parsed); `scenario_text`: the file's text with
    the tune sections blanked, read for the scenario so its errors carry the file's lines."""
    data = dict(data)
    launch = data.pop("launch", None)
    if isinstance(launch, str):  # a bare command template
        launch = {"command": launch}
    if not isinstance(launch, dict):
        raise ExperimentError(
            f"{source}: launch: give engine: <{LAUNCHERS.help()}> or command: '<template>'"
        )
    unknown = [k for k in launch if k not in LAUNCH_KEYS]
    if unknown:
        raise ExperimentError(
            f"{source}: launch.{unknown[0]}: unknown; use {', '.join(LAUNCH_KEYS)}"
        )
    engine = launch.get("engine") or "command"
    if engine not in LAUNCHERS:
        raise ExperimentError(
            f"{source}: launch.engine {engine!r}: choose one of {LAUNCHERS.help()}"
        )
    fixed = launch.get("args") or {}
    if not isinstance(fixed, dict):
        raise ExperimentError(f"{source}: launch.args: a mapping of setting: value")
    params = data.pop("params", None) or {}
    if not isinstance(params, dict) or not all(isinstance(v, list) and v for v in params.values()):
        raise ExperimentError(f"{source}: params: a mapping of setting: [value, value, ...]")
    health = data.pop("health", None) or {}
    if isinstance(health, str):
        health = {"path": health}
    launcher = LAUNCHERS.get(engine)
    path = str(health.get("path") or launcher.health)
    if not path.startswith("/"):
        raise ExperimentError(f"{source}: health.path {path!r}: a path such as /health")
    timeout = float(health.get("timeout_s", launcher.start_timeout_s))
    warmup = data.pop("warmup_requests", 2)
    if not isinstance(warmup, int) or warmup < 0:
        raise ExperimentError(f"{source}: warmup_requests {warmup!r}: a count >= 0")
    sweep_spec = data.pop("sweep", None)
    if (data.get("target") or {}).get("base_url"):
        raise ExperimentError(
            f"{source}: target.base_url: leave it out; tune points the run at the engine it starts"
        )
    default_name = {} if data.get("name") else {"name": Path(source).stem}
    try:
        if scenario_text is None:
            scenario_text = yaml.safe_dump({**data, **default_name})
        scenario = parse_scenario(scenario_text, source=source, overrides=default_name)
    except ScenarioError as exc:
        raise ExperimentError(str(exc)) from None
    exp = Experiment(
        name=scenario.name, engine=engine, template=launch.get("command"),
        binary=launch.get("binary"), fixed=fixed, version=launch.get("version"),
        health_path=path, health_timeout_s=timeout, params=params, scenario=scenario,
        sweep=_sweep_plan(sweep_spec, scenario, source), warmup_requests=warmup,
        base_dir=base_dir,
    )  # fmt: skip
    try:  # every combination must make a command line before anything starts
        for settings in exp.combinations():
            command_of(exp, settings, port=0)
    except LaunchSpecError as exc:
        raise ExperimentError(f"{source}: {exc}") from None
    return exp


def _sweep_plan(spec: Any, scenario: Scenario, source: str) -> SweepPlan | None:
    """The `sweep` section as a SweepPlan (None: one point at the scenario's own load)."""
    from bench.metrics import parse_thresholds
    from bench.sweep import PointSpec

    if spec is None:
        return None
    if not isinstance(spec, dict) or any(k not in SWEEP_KEYS for k in spec):
        raise ExperimentError(f"{source}: sweep: a mapping of {', '.join(SWEEP_KEYS)}")
    given = [k for k in ("request_rates", "concurrency", "auto") if spec.get(k) is not None]
    if len(given) != 1:
        raise ExperimentError(
            f"{source}: sweep: give exactly one of request_rates, concurrency or auto"
        )
    try:
        specs = [PointSpec("rate", float(v)) for v in spec.get("request_rates") or []]
        specs += [PointSpec("concurrency", int(v)) for v in spec.get("concurrency") or []]
        thresholds = parse_thresholds(scenario.slo, flag="slo")
        plan = SweepPlan(
            specs=specs, auto=spec.get("auto"), thresholds=thresholds,
            slo_iterations=int(spec.get("slo_iterations", 4)),
            point_duration_s=spec.get("point_duration_s"),
            warmup_s=float(spec.get("warmup_s", 0.0)), cooldown_s=float(spec.get("cooldown_s", 0.0)),
        )  # fmt: skip
        if spec.get("max_error_rate") is not None:
            plan.max_error_rate = float(spec["max_error_rate"])
    except (TypeError, ValueError) as exc:
        raise ExperimentError(f"{source}: sweep: {exc}") from None
    return plan


def command_of(exp: Experiment, settings: dict[str, Any], port: int) -> list[str]:
    return command_line(
        exp.engine, template=exp.template, binary=exp.binary, fixed=exp.fixed,
        settings=settings, port=port,
    )  # fmt: skip


# ---------------------------------------------------------------- what is stored


def stored_runs(name: str, db: str | None = None) -> dict[str, Any]:
    """combination key -> the newest stored run of experiment `name` with that combination
    (bench.store.RunInfo), measured or failed."""
    from bench.store import list_runs

    newest: dict[str, Any] = {}
    for run in list_runs(db):  # newest first
        tune = (run.extra_json or {}).get("tune") or {}
        if tune.get("experiment") == name and tune.get("key") not in newest:
            newest[tune.get("key")] = run
    return newest


def is_done(run: Any) -> bool:
    """A combination is done when its newest run measured it to the end."""
    tune = (run.extra_json or {}).get("tune") or {}
    return run.status == "completed" and tune.get("outcome") == "measured"


def record_failure(exp: Experiment, meta: dict, error: str, tail: str, db: str | None) -> str:
    """Store a failed launch (or an engine that died) as a failed run with its log's tail."""
    from bench.store import RunWriter

    extra = {"tune": {**meta, "outcome": "failed", "error": error, "log_tail": tail}}
    writer = RunWriter(
        db, name=exp.name, label=exp.scenario.label, scenario=exp.scenario.model_dump(mode="json"),
        endpoint=None, backend=exp.scenario.target.backend, model=exp.scenario.target.model,
        gpu_type=exp.scenario.gpu.type, gpu_count=exp.scenario.gpu.count, extra=extra,
    )  # fmt: skip
    writer.finish("failed", None)
    return writer.run_id


# ---------------------------------------------------------------- running


@dataclass
class TuneOutcome:
    """What one `tune` did: combinations measured, skipped (stored before), failed."""

    measured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False


def run_experiment(
    exp: Experiment,
    *,
    db: str | None = None,
    display: Display | None = None,
    log_dir: Path,
    stop_event: threading.Event | None = None,
    handle_sigint: bool = True,
    on_point: Callable | None = None,
) -> TuneOutcome:
    """Measure every combination not stored yet (see the module doc). The engine's log of
    each combination is written under `log_dir`. Raises bench.store.StoreError when the
    database fails; Ctrl-C stops the engine it started and ends the experiment."""
    from bench.drive import choose_executor, measure

    display = display or Headless()
    outcome = TuneOutcome()
    done = {k for k, run in stored_runs(exp.name, db).items() if is_done(run)}
    combos = exp.combinations()
    for number, settings in enumerate(combos, 1):
        if stop_event is not None and stop_event.is_set():
            outcome.interrupted = True  # SIGTERM between two combinations
            break
        key, text = combo_key(settings), settings_text(settings)
        if key in done:
            display.say(f"[{number}/{len(combos)}] {text}: stored already, skipped")
            outcome.skipped.append(key)
            continue
        port = free_port()
        argv = command_of(exp, settings, port)
        version = engine_version(version_command(exp.engine, argv, exp.version))
        meta = {
            "experiment": exp.name, "key": key, "settings": settings, "engine": exp.engine,
            "engine_version": version, "command": shlex.join(argv),
        }  # fmt: skip
        display.say(f"[{number}/{len(combos)}] {text}: starting {shlex.join(argv)}")
        log_path = log_dir / f"{exp.name}-{number}-{port}.log"
        try:
            with EngineProcess(argv, log_path) as engine:
                url = f"http://127.0.0.1:{port}"
                took = engine.wait_healthy(url + exp.health_path, exp.health_timeout_s, stop_event)
                display.say(f"  healthy after {took:.1f} s (engine {version or 'version unknown'})")
                scenario = exp.scenario.model_copy(deep=True)
                scenario.target.base_url = url
                # compare, the dashboard and the exports name each run by its settings
                scenario.label = scenario.label or f"{exp.name} {text}"
                _warm_up(scenario, exp, engine, stop_event)
                executor = choose_executor(handle_sigint=handle_sigint)
                result = measure(
                    scenario, exp.sweep, executor=executor, base_dir=exp.base_dir, db=db,
                    display=display, stop_event=stop_event, probe=None, on_point=on_point,
                    extra={"tune": {**meta, "outcome": "measured"}},
                )  # fmt: skip
                if not engine.alive():
                    raise LaunchError(
                        f"the engine died during the measurement (run {result.run_id} kept)",
                        engine.tail(),
                    )
        except LaunchError as exc:
            if stop_event is not None and stop_event.is_set():
                outcome.interrupted = True  # stopped by the user: not the engine's failure
                break
            run_id = record_failure(exp, meta, str(exc), exc.tail, db)
            display.warn(f"{text}: {exc}; stored as failed run {run_id[:8]} with the log's tail")
            outcome.failed.append(key)
            continue
        outcome.measured.append(key)
        if result.interrupted:
            outcome.interrupted = True
            break
    return outcome


def _warm_up(
    scenario: Scenario,
    exp: Experiment,
    engine: EngineProcess,
    stop_event: threading.Event | None = None,
) -> None:
    """A few requests one at a time, not stored, so the first measured point does not pay
    for the engine's first requests (graph capture, caches). None succeeding is a launch
    failure: the engine is up but cannot serve this scenario."""
    if exp.warmup_requests == 0:
        return
    from bench.drive import choose_executor, measure

    warm = scenario.model_copy(deep=True)
    warm.load.shape = "closed"
    warm.load.concurrency = 1
    warm.load.num_prompts = exp.warmup_requests
    warm.load.duration_s = None
    result = measure(
        warm, None, executor=choose_executor(), base_dir=exp.base_dir, store=False, probe=None,
        stop_event=stop_event,
    )  # fmt: skip
    summary = result.points[0].summary if result.points else None
    if summary is None or summary.completed == 0:
        raise LaunchError("the engine is healthy but no warm-up request succeeded", engine.tail())


# ---------------------------------------------------------------- choosing


@dataclass
class Ranked:
    """One combination's stored result: its capacity at the SLO (or peak throughput)."""

    settings: dict[str, Any]
    run_id: str
    capacity: Any  # bench.curves.Capacity
    engine_version: str | None = None


@dataclass
class Ranking:
    ranked: list[Ranked]  # best first
    failed: list[tuple[dict, str]]  # (settings, error) of combinations whose newest run failed
    slo: list  # thresholds (empty: ranked by peak throughput)

    def verdict(self) -> str | None:
        """One sentence: the winning setting, its capacity and how far ahead it is."""
        from bench.choose import overlaps
        from bench.curves import capacity_ratio

        if not self.ranked:
            return None
        best = self.ranked[0]
        head = f"Best: {settings_text(best.settings)}: {best.capacity.text()}"
        if len(self.ranked) == 1:
            return head + " (the only combination measured)"
        second = self.ranked[1]
        ratio, why = capacity_ratio(best.capacity, second.capacity)
        if ratio is None and best.capacity.kind == second.capacity.kind == "at_least":
            return (
                f"{head}; {best.capacity.value / second.capacity.value:.2f}x the runner-up "
                f"({settings_text(second.settings)}) at the highest loads tested, both within "
                "the SLO: raise the load to find their capacities"
            )
        if ratio is None:
            return f"{head}; against {settings_text(second.settings)}: {why}"
        flips = overlaps(ratio)  # the one reading of "could flip" (bench.choose)
        close = "; the two are within each other's ranges, so the order could flip" if flips else ""
        return f"{head}; {ratio.text()} the runner-up ({settings_text(second.settings)}){close}"


def _order(r: Ranked) -> tuple:
    cap = r.capacity
    usable = cap.kind not in ("none", "below") and cap.value is not None
    return (not usable, -(cap.value or 0.0) if usable else 0.0)


def rank(exp: Experiment, db: str | None = None) -> Ranking:
    """The experiment's stored combinations, best first, by capacity at the scenario's SLO
    (peak output throughput when it has none), computed as `compare` computes it."""
    from bench.curves import capacity_at_slo, run_curve

    slo = exp.sweep.thresholds if exp.sweep is not None else []
    ranked, failed = [], []
    wanted = {combo_key(s) for s in exp.combinations()}
    for key, run in stored_runs(exp.name, db).items():
        if key not in wanted:
            continue  # a combination the file no longer holds
        tune = run.extra_json["tune"]
        if not is_done(run):
            failed.append((tune["settings"], tune.get("error") or f"run {run.status}"))
            continue
        cap = capacity_at_slo(run_curve(run.id, db), slo)
        ranked.append(Ranked(tune["settings"], run.id, cap, tune.get("engine_version")))
    ranked.sort(key=_order)
    return Ranking(ranked, failed, slo)
