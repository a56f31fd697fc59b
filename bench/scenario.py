"""Scenario files: one YAML document describing a run's traffic, validated with pydantic.

A scenario holds the load shape, the request mix and the measurement settings. CLI flags
override its values. An invalid file gets an error naming the file, the line, the field and
the value, e.g. `chat.yaml line 7: load.request_rate: Input should be greater than 0 (got -2)`.
"""

from __future__ import annotations

import math
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from bench import arrivals
from bench.backends.openai import COMPLETIONS, ENDPOINTS
from bench.backends.urls import normalize_base_url
from bench.blocks import DEFAULT_BLOCK_SIZE, BlockPrompts
from bench.datasets import DATASETS
from bench.lengths import LENGTHS
from bench.metrics import (
    CLASS_NAME,
    DEFAULT_PERCENTILES,
    LATENCY_METRICS,
    Threshold,
    parse_goodput,
    parse_slo,
    scoped_slo,
)
from bench.shapes import SHAPES
from bench.tokenizer import TokenizerError, load_tokenizer
from bench.traces import TRACE_FORMATS
from bench.workload import _WORDS, LengthDist, MixedWorkload, TrafficClass, Workload


def _checked_slo(v: str | None) -> str | None:
    parse_slo(v, flag="slo")  # a bad SLO is an error naming the field, at load time
    return v


# An SLO as a scenario file gives it (bench.metrics.parse_slo's forms), checked when read.
SloText = Annotated[str | None, AfterValidator(_checked_slo)]


class ScenarioError(ValueError):
    """A scenario file or flag value the user must fix; the message says where and how."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Where the bearer token comes from unless a scenario names another variable; the service
# sends only this one to targets (server/api.py).
API_KEY_ENV = "OPENAI_API_KEY"


class Target(_Strict):
    base_url: str | None = None
    endpoint: str = COMPLETIONS
    backend: str = "vllm"
    model: str | None = None
    api_key_env: str = API_KEY_ENV
    # Fields added to every request body (vLLM's sampling flags and --extra-body), and
    # headers sent with every request (--header KEY=VALUE), as `vllm bench serve` sends them.
    extra_body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not name or any(c in name for c in " :\r\n\t") or any(c in value for c in "\r\n"):
                raise ValueError(
                    f"header {name!r}: a name without spaces or ':' and a one-line value"
                )
            if name.lower() in ("host", "content-length", "content-type", "transfer-encoding"):
                raise ValueError(f"header {name!r} is set by tokenbench itself")
        return v

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return None if v is None else normalize_base_url(v)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v not in ENDPOINTS:
            raise ValueError(f"must be {' or '.join(ENDPOINTS)}")
        return v


class Rate(_Strict):
    rate: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class RampSpec(_Strict):
    start_rate: float = Field(ge=0)
    end_rate: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class RampUpSpec(_Strict):
    """vLLM's --ramp-up-strategy with its start and end RPS (load.shape ramp_up): request i
    of n is sent at the rate start + (end - start) * i / (n - 1) (linear) or start *
    (end / start) ** (i / (n - 1)) (exponential), with load.burstiness's gamma gaps."""

    strategy: arrivals.RampStrategy
    start_rps: float = Field(gt=0, allow_inf_nan=False)
    end_rps: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _rising(self) -> RampUpSpec:
        if self.start_rps > self.end_rps:
            raise ValueError(
                f"start_rps {self.start_rps:g} is above end_rps {self.end_rps:g}: vLLM's "
                "ramp-up only rises (a falling rate: load.shape ramp)"
            )
        return self


class TraceSpec(_Strict):
    path: str
    format: TRACE_FORMATS.name_type() | None = None  # bench.traces; None: by the suffix
    time_scale: float = Field(default=1.0, gt=0)
    use_lengths: bool = True
    # Replay at this mean rate (req/s) instead: the timestamps scaled to it (--request-rate
    # with a trace dataset); inf sends every request at once.
    request_rate: float | None = Field(default=None, gt=0)


# Load shapes as scenario files, the CLI and the API name them: the kinds of
# bench.shapes.SHAPES (renewal processes at a rate, rate functions, a replayed trace, a
# closed loop of users).
Shape = SHAPES.name_type()
# Requests per load point when neither a count nor a duration is given: a run is one point
# (vLLM's --num-prompts default), a sweep's points are many and each gets fewer. The CLI,
# `sim run` and the API's jobs all read these.
DEFAULT_NUM_PROMPTS = {"run": 1000, "sweep": 200}


class Load(_Strict):
    shape: Shape = "poisson"
    request_rate: float = Field(default=math.inf, gt=0)
    burstiness: float = Field(default=1.0, gt=0)
    num_prompts: int | None = Field(default=None, gt=0)
    duration_s: float | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)
    burst: Rate | None = None
    quiet: Rate | None = None
    ramp: RampSpec | None = None
    ramp_up: RampUpSpec | None = None
    steps: list[Rate] | None = None
    trace: TraceSpec | None = None
    concurrency: int | None = Field(default=None, gt=0)
    think_time_s: float = Field(default=0.0, ge=0)
    ramp_up_s: float = Field(default=0.0, ge=0)  # closed loop: spread the users' starts
    process: arrivals.Process = "poisson"
    # Requests sent before each load point and left out of its figures and its stored
    # requests, as vLLM's --num-warmups (bench.executor.warmup_plan).
    num_warmups: int = Field(default=0, ge=0, le=100_000)

    @model_validator(mode="after")
    def _shape_fields(self) -> Load:
        needs = SHAPES.get(self.shape).needs
        missing = [n for n in needs if getattr(self, n) is None]
        if missing:
            raise ValueError(f"shape {self.shape!r} needs {', '.join(missing)}")
        return self


class Lengths(_Strict):
    dist: LENGTHS.name_type() = "fixed"  # bench.lengths
    mean: int = Field(default=256, gt=0)
    range_ratio: float = Field(default=0.0, ge=0, lt=1)
    std: float = Field(default=0.0, ge=0)
    sigma: float = Field(default=0.5, gt=0)
    min: int = Field(default=1, ge=1)
    max: int = Field(default=1_000_000, ge=1)

    def to_dist(self) -> LengthDist:
        return LengthDist(
            self.dist, self.mean, self.range_ratio, self.std, self.sigma, self.min, self.max
        )


class WorkloadSpec(_Strict):
    dataset: DATASETS.name_type() = "random"  # bench.datasets
    dataset_path: str | None = None
    input: Lengths = Field(default_factory=lambda: Lengths(mean=1024))
    output: Lengths = Field(default_factory=lambda: Lengths(mean=128))
    prefix_ratio: float = Field(default=0.0, ge=0, le=1)
    num_prefixes: int = Field(default=1, ge=1)
    turns: int = Field(default=1, ge=1)
    prompt_format: Literal["text", "token_ids"] = "text"
    # None: vLLM's rule, ignore_eos for synthetic (random) prompts only; a dataset's prompts
    # end where the model ends them.
    ignore_eos: bool | None = None

    def forces_length(self) -> bool:
        """Whether requests ask for exactly their output length (ignore_eos)."""
        return self.dataset == "random" if self.ignore_eos is None else self.ignore_eos

    # A local Hugging Face tokenizer (a folder with tokenizer.json, or the file): prompts of
    # exactly input.mean tokens, and output tokens counted when a server sends no usage.
    tokenizer: str | None = None
    # Tokens per hash id of a block-hashed trace (workload.dataset mooncake).
    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, gt=0)


class ClassSpec(_Strict):
    """One traffic class of a mixed scenario (`classes:`): its share of the sessions (or its
    own rate, the run's rate then being their sum), its own request mix and its own SLO in
    the one SLO grammar ("p99_ttft_ms<=2000,p99_tpot_ms<=50" or "ttft:2000 tpot:50")."""

    name: str
    share: float | None = Field(default=None, gt=0)
    request_rate: float | None = Field(default=None, gt=0)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    slo: SloText = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not CLASS_NAME.fullmatch(v):
            raise ValueError(
                "a class name is letters, digits, '_' and '-', starting with a letter "
                "(at most 40), e.g. chat or agent"
            )
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> ClassSpec:
        if (self.share is None) == (self.request_rate is None):
            raise ValueError(f"class {self.name!r}: give its share or its request_rate (one)")
        if DATASETS.get(self.workload.dataset).trace_format is not None:
            raise ValueError(
                f"class {self.name!r}: workload.dataset {self.workload.dataset!r} replays its "
                "own timestamps, which a class of a mix cannot (the mix draws the arrivals)"
            )
        return self


class GPUInfo(_Strict):
    type: str | None = None
    count: int = Field(default=1, ge=1)


class Scenario(_Strict):
    name: str = "adhoc"
    description: str = ""
    target: Target = Field(default_factory=Target)
    load: Load = Field(default_factory=Load)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    # None (the default): every run draws its own seed and every load point of a sweep its
    # own prompts, so a server's prefix cache cannot answer them from an earlier run or
    # point. A fixed seed repeats the same prompts (and schedule) run after run.
    seed: int | None = None
    goodput: str | None = None
    # The SLO a sweep finds the capacity at when --slo is not given (bench.metrics.parse_slo:
    # "p99_ttft_ms<=2000,p99_tpot_ms<=50" or vLLM's "ttft:2000 tpot:50").
    slo: SloText = None
    percentiles: list[float] = Field(default_factory=lambda: list(DEFAULT_PERCENTILES))
    percentile_metrics: list[str] = Field(default_factory=lambda: list(LATENCY_METRICS))
    request_timeout_s: float = Field(default=600.0, gt=0)
    gpu: GPUInfo = Field(default_factory=GPUInfo)
    label: str | None = None
    # Traffic classes mixed in one run (chat, agent, batch), each with its own request mix
    # and SLO; `workload` is then unused. Capacity is the highest load at which every class
    # meets its own SLO (capacity_slo).
    classes: list[ClassSpec] | None = None
    _drawn_seed: int | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _dataset_trace(self) -> Scenario:
        """A dataset that is a timed trace (mooncake) is also the load: its timestamps are
        replayed (scaled to load.request_rate when one is given)."""
        fmt = DATASETS.get(self.workload.dataset).trace_format
        if fmt is None:
            return self
        name, path, load = self.workload.dataset, self.workload.dataset_path, self.load
        if not path:
            raise ValueError(f"workload.dataset {name!r} needs workload.dataset_path")
        if self.workload.prompt_format != "text":
            raise ValueError(f"workload.dataset {name!r} sends text prompts (prompt_format)")
        if load.shape == "trace":
            return self
        if load.shape != "poisson":
            raise ValueError(
                f"workload.dataset {name!r} replays its own timestamps; load.shape "
                f"{load.shape!r} cannot go with it (give a rate to scale them instead)"
            )
        rate = load.request_rate if "request_rate" in load.model_fields_set else None
        load.shape = "trace"
        load.trace = TraceSpec(path=path, format=fmt, request_rate=rate)
        return self

    @model_validator(mode="after")
    def _classes(self) -> Scenario:
        """A mix: unique names, shares or rates (not both); rates set the run's rate."""
        if self.classes is None:
            return self
        if not self.classes:
            raise ValueError("classes: give at least one class, or leave classes out")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: names must differ (got {', '.join(names)})")
        rates = [c.request_rate for c in self.classes]
        if any(r is None for r in rates) and any(r is not None for r in rates):
            raise ValueError("classes: give every class a share, or every class a request_rate")
        if rates[0] is not None:
            if "request_rate" in self.load.model_fields_set:
                raise ValueError(
                    "classes with their own request_rate set the run's rate (their sum); "
                    "leave load.request_rate out, or give the classes shares instead"
                )
            self.load.request_rate = float(sum(rates))
        if self.workload.model_fields_set:
            raise ValueError(
                "workload: a scenario with classes sends each class's own workload "
                "(classes[].workload), so the top-level workload (and --random-*/--dataset-* "
                f"flags) would be ignored; move {', '.join(sorted(self.workload.model_fields_set))} "
                "into the classes"
            )
        return self

    def class_shares(self) -> dict[str, float]:
        """Each class's share of the sessions (summing to 1); {} without classes."""
        if not self.classes:
            return {}
        raw = [c.share if c.share is not None else c.request_rate for c in self.classes]
        total = float(sum(raw))
        return {c.name: float(r) / total for c, r in zip(self.classes, raw, strict=True)}

    def capacity_slo(self, slo: str | None = None) -> list[Threshold]:
        """The SLO a capacity is judged at: `slo` (--slo) or the scenario's run-wide one,
        plus every class's own SLO on that class's figures (agent:p99_ttft_ms<=...)."""
        out = parse_slo(self.slo if slo is None else slo, flag="slo" if slo is None else "--slo")
        return out + self.class_slo()

    def class_slo(self) -> list[Threshold]:
        """Every class's own SLO on that class's figures (agent:p99_ttft_ms<=...); [] for
        a scenario without classes."""
        out: list[Threshold] = []
        for c in self.classes or ():
            out += scoped_slo(parse_slo(c.slo, flag=f"classes.{c.name}.slo"), c.name)
        return out

    @field_validator("goodput")
    @classmethod
    def _goodput(cls, v: str | None) -> str | None:
        parse_goodput(v)
        return v

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < p < 100 for p in v):
            raise ValueError("percentiles must be between 0 and 100 (exclusive)")
        return v

    # ------------------------------------------------------------ derived plans

    @property
    def seed_fixed(self) -> bool:
        return self.seed is not None

    def run_seed(self) -> int:
        """The seed of this run: --seed when given, else one drawn once for this scenario
        object (copies made for a sweep's points keep it), so it can be stored and replayed."""
        if self.seed is not None:
            return self.seed
        if self._drawn_seed is None:
            self._drawn_seed = secrets.randbits(32)
        return self._drawn_seed

    def point_seed(self, load_point: int = 0) -> int:
        """The prompts' seed at one load point: the run seed when fixed (every point sends
        the same prompts, as `vllm bench serve` does), else one of its own per point."""
        seed = self.run_seed()
        if self.seed_fixed or load_point == 0:
            return seed
        return int(np.random.SeedSequence([seed, load_point]).generate_state(1)[0])

    def num_requests(self) -> int | None:
        return self.load.num_prompts

    def offsets(self, base_dir: Path | None = None) -> np.ndarray | None:
        """Intended send offsets (s) for open-loop shapes; None for a closed loop."""
        rng = np.random.default_rng([self.run_seed(), 0])
        return SHAPES.get(self.load.shape).offsets(self, rng, base_dir)

    def session_lengths(self, base_dir: Path | None = None) -> tuple | None:
        """(input lengths, output lengths) per session from the load shape's own source (a
        trace's columns, either may be None), or None where the shape has none."""
        lengths = SHAPES.get(self.load.shape).session_lengths
        return None if lengths is None else lengths(self, base_dir)

    def trace(self, base_dir: Path | None = None) -> arrivals.Trace:
        spec = self.load.trace
        path = _resolve(spec.path, base_dir)
        trace = arrivals.load_trace(
            path,
            time_scale=spec.time_scale,
            max_requests=self.load.num_prompts,
            format=spec.format,
        )
        if spec.request_rate is not None:
            trace.offsets_s = arrivals.scaled_to_rate(trace.offsets_s, spec.request_rate)
        return trace

    def workload_plan(
        self, base_dir: Path | None = None, load_point: int = 0
    ) -> Workload | MixedWorkload:
        """The request mix of one load point: the scenario's workload, or its classes' mix
        (each class's prompts from a seed of its own)."""
        if not self.classes:
            return self._workload_plan(self.workload, base_dir, load_point)
        seed = self.point_seed(load_point)
        shares = self.class_shares()
        mix = []
        for k, c in enumerate(self.classes):
            own = self._workload_plan(c.workload, base_dir, load_point)
            own.seed = int(np.random.SeedSequence([seed, 7, k]).generate_state(1)[0])
            mix.append(TrafficClass(c.name, shares[c.name], own))
        return MixedWorkload(mix, seed=seed)

    def _workload_plan(self, w: WorkloadSpec, base_dir: Path | None, load_point: int) -> Workload:
        dataset = None
        load = DATASETS.get(w.dataset).load
        if load is not None:
            if not w.dataset_path:
                raise ScenarioError(f"workload.dataset {w.dataset!r} needs workload.dataset_path")
            dataset = load(_resolve(w.dataset_path, base_dir))
        tokenizer = None
        if w.tokenizer:
            try:
                tokenizer = load_tokenizer(_resolve(w.tokenizer, base_dir))
                tokenizer.check_spells(list(_WORDS))
            except TokenizerError as exc:
                raise ScenarioError(str(exc)) from None
        blocks = None
        fmt = DATASETS.get(w.dataset).trace_format
        if fmt is not None:
            if self.load.shape != "trace":  # a sweep's rate point replaced the trace
                raise ScenarioError(
                    f"workload.dataset {w.dataset!r} replays its own timestamps, so it cannot "
                    f"run as load.shape {self.load.shape!r} (a sweep over concurrency); sweep "
                    "it over --request-rates instead"
                )
            path = _resolve(w.dataset_path or "", base_dir)
            try:
                rows = TRACE_FORMATS.get(fmt).rows(path)[: self.load.num_prompts]
                blocks = BlockPrompts(
                    rows,
                    block_size=w.block_size,
                    seed=self.point_seed(load_point),
                    vocabulary=_WORDS,
                    tokenizer=tokenizer,
                    path=path,
                )
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
        return Workload(
            blocks=blocks,
            tokenizer=tokenizer,
            seed=self.point_seed(load_point),
            input=w.input.to_dist(),
            output=w.output.to_dist(),
            prefix_ratio=w.prefix_ratio,
            num_prefixes=w.num_prefixes,
            turns=w.turns,
            prompt_format=w.prompt_format,
            dataset=dataset,
        )


def mean_rate(scenario) -> float | None:
    """The mean offered rate of the scenario's own load shape (None for a closed loop):
    what a sweep scales a shape to and what a stored scenario's demand is (bench.plan)."""
    load = scenario.load
    return SHAPES.get(load.shape).mean_rate(load)


def own_rate(scenario, base_dir: Path | None = None) -> float | None:
    """The rate at which one point sends the scenario's own load: its shape's mean rate, or
    for a replayed trace (load.shape trace, a Mooncake/agentic dataset) the mean rate of
    its timestamps as loaded, (n - 1) / span as arrivals.scaled_to_rate counts it, so a
    point at this rate replays them exactly as they are. Reads the trace file; None for a
    closed loop or a trace of one instant."""
    rate = mean_rate(scenario)
    if rate is not None or scenario.load.shape != "trace":
        return rate
    offsets = scenario.trace(base_dir).offsets_s
    span = float(offsets[-1] - offsets[0]) if len(offsets) else 0.0
    return (len(offsets) - 1) / span if span > 0 and len(offsets) > 1 else None


def _resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path)
    if not p.is_absolute() and base_dir is not None and not p.exists():
        candidate = base_dir / p
        if candidate.exists():
            return candidate
    return p


# ---------------------------------------------------------------- loading with line numbers


MAX_YAML_ALIASES = 20


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file, line, field and value."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ScenarioError(f"scenario file {path} not found") from None
    return parse_scenario(text, source=str(path))


def parse_scenario(
    text: str,
    *,
    source: str = "<scenario>",
    overrides: dict | None = None,
    defaults: dict | None = None,
) -> Scenario:
    """YAML text -> Scenario: `defaults` < the text's values < `overrides` (partial trees)."""
    try:
        aliases = sum(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text))
        if aliases > MAX_YAML_ALIASES:
            # Nested aliases expand exponentially ("billion laughs"): a few lines of YAML
            # can become billions of values, which validation and messages would walk.
            raise ScenarioError(
                f"{source}: {aliases} YAML aliases (*name); a scenario may use at most "
                f"{MAX_YAML_ALIASES}"
            )
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ScenarioError(
            f"{source}{where}: not valid YAML ({getattr(exc, 'problem', exc)})"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{source}: a scenario must be a mapping of fields, got {type(data).__name__}"
        )
    if defaults:
        data = deep_merge(defaults, data)
    if overrides:
        data = deep_merge(data, overrides)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc, node, source)) from None


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _format_errors(exc: ValidationError, node: Any, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(node, loc)
        where = f" line {line}" if line else ""
        value = err.get("input")
        if isinstance(value, str) and "://" in value:
            from bench.backends.urls import shown_url

            value = shown_url(value)  # a URL's password or ?key= never goes into an error
        shown = "" if isinstance(value, dict) or value is None else f" (got {_short(value)})"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; " + _nearest_fields(loc)
        lines.append(f"{source}{where}: {field}: {msg}{shown}")
    return "\n".join(lines)


def _nearest_fields(loc: list) -> str:
    """'did you mean X?' for a misspelt field, from the fields of the model at `loc`."""
    import difflib

    model: Any = Scenario
    for key in loc[:-1]:
        info = model.model_fields.get(str(key)) if isinstance(key, str) else None
        found = _model_in(getattr(info, "annotation", None))
        if found is None:
            if isinstance(key, int):
                continue
            break
        model = found
    fields = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.5)
    where = ".".join(str(p) for p in loc[:-1] if isinstance(p, str)) or "a scenario"
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}fields of {where}: {', '.join(fields)}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation: Model, Model | None, list[Model]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _short(value: Any) -> str:
    """repr of a bad value, bounded (a list of a million items is not echoed whole)."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = 200
    return short.repr(value)


def _line_of(node: Any, loc: list) -> int | None:
    """Line (1-based) of the YAML node at a pydantic error location, as deep as it exists."""
    best = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(key)), None)
            if match is None:
                key_node = next((k for k, _ in node.value if k.value == str(key)), None)
                return key_node.start_mark.line + 1 if key_node is not None else best
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        best = node.start_mark.line + 1
    return best


def workload_shape(sc: Scenario) -> str:
    """The request shape a capacity holds for, in words: 'input 1,024 tokens (fixed),
    output 256 (lognormal, at most 384), poisson arrivals'. A capacity measured with one
    shape says little about another (longer outputs, burstier arrivals)."""
    if sc.classes:
        shares = sc.class_shares()
        return "a mix of traffic classes: " + "; ".join(
            f"{c.name} ({shares[c.name]:.0%}): input {c.workload.input.mean:,}, output "
            f"{c.workload.output.mean:,} tokens ({c.workload.input.dist})"
            for c in sc.classes
        )
    w = sc.workload

    def lengths(name: str, spec) -> str:
        most = f", at most {spec.max:,}" if spec.max < 1_000_000 else ""
        return f"{name} {spec.mean:,} tokens ({spec.dist}{most})"

    source = "" if w.dataset == "random" else f"{w.dataset} prompts; "
    turns = f", {w.turns} turns" if w.turns > 1 else ""
    prefix = f", {w.prefix_ratio:.0%} shared prefix" if w.prefix_ratio else ""
    arrivals = {"on_off": "on/off bursty", "closed": "closed-loop"}.get(
        sc.load.shape, sc.load.shape
    )
    return (
        f"{source}{lengths('input', w.input)}, {lengths('output', w.output)}{turns}{prefix}, "
        f"{arrivals} arrivals"
    )


def stored_shape(scenario_text: str | None) -> str | None:
    """workload_shape of a stored scenario (None when it cannot be read)."""
    if not scenario_text:
        return None
    try:
        sc = parse_scenario(yaml.safe_dump(yaml.safe_load(scenario_text)), source="stored")
    except (yaml.YAMLError, ScenarioError, ValueError):
        return None
    return workload_shape(sc)
