"""`tokenbench sim ...`: serve a simulated endpoint, list the GPU and model profiles.

Each command is a thin shell over the library (bench.sim.server, bench.sim.profiles);
bench/cli/__init__.py registers them on the `sim` group.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Annotated

import typer

from bench.cli.common import fail, flag_overrides, resolve_scenario
from bench.cli.options import (
    AutoOpt,
    ConcurrencyPointsOpt,
    CooldownOpt,
    DbOption,
    InputLenOpt,
    LabelOpt,
    MaxErrorRateOpt,
    NumPromptsOpt,
    NumWarmupsOpt,
    OutputLenOpt,
    PointDurationOpt,
    RampUpEndRpsOpt,
    RampUpStartRpsOpt,
    RampUpStrategyOpt,
    RequestRatesOpt,
    ScenarioOpt,
    SeedOpt,
    SloDrawsOpt,
    SloIterationsOpt,
    SloOpt,
    SummaryJsonOpt,
    SweepFailOnOpt,
    WarmupOpt,
)
from bench.cli.sim_calibrate import ProfileOpt, apply_profile
from bench.console import Table, console, err_console

if TYPE_CHECKING:
    from bench.sim.profiles import DeviceDefaults

# The simulated deployment, as `sim serve` and `sim run` both take it, and its default.
SIM_GPU, SIM_MODEL, SIM_PRECISION, SIM_ENGINE = "B200", "llama-3.3-70b", "fp8", "vllm"
SIM_DEFAULTS = (SIM_GPU, SIM_MODEL, SIM_PRECISION, SIM_ENGINE)
SOURCE_COLUMN_WIDTH = 100  # `sim gpus`: the fitted parameters' sources wrap at this width
SimGpuOpt = Annotated[
    str | None,
    typer.Option("--gpu", help=f"GPU profile or alias (see `sim gpus`); default {SIM_GPU}"),
]
SimModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", help=f"model profile (see `sim models`) or config.json; default {SIM_MODEL}"
    ),
]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision", help=f"bf16, fp8, fp4 (nvfp4), mxfp4, fp32; default {SIM_PRECISION}"
    ),
]
TpOpt = Annotated[int, typer.Option("--tp", help="tensor-parallel degree (= GPUs)")]
ParallelOpt = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        help="parallelism instead of --tp: tp8, dep8 (attention DP + expert parallel), tep8",
    ),
]
EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="serving engine whose scheduler defaults, memory arithmetic and efficiency to "
        f"use: vllm, sglang, trtllm; default {SIM_ENGINE}",
    ),
]
# The engine knobs (None = the engine's own default, bench/sim/profiles/engines.yaml); limits
# are per engine instance (per data-parallel rank), as the engines take them. The defaults in
# the help are read from the profile files, never typed here.
_ENGINES = ("vllm", "sglang", "trtllm")


def _defaults(attr: str) -> str:
    """Each engine's default for a knob, with what it picks on other devices where it picks by
    device (vLLM: "vllm 256 (128 on a CPU, 1024 on GPUs of 70 GiB or more but A100)")."""
    from bench.sim.profiles import engine_defaults

    out = []
    for e in _ENGINES:
        d = engine_defaults(e)
        where = [
            f"{getattr(r, attr)} on {_device_text(r)}"
            for r in d.by_device
            if getattr(r, attr, None) not in (None, getattr(d, attr))
        ]
        out.append(f"{e} {getattr(d, attr)}" + (f" ({', '.join(where)})" if where else ""))
    return ", ".join(out)


def _device_text(rule: DeviceDefaults) -> str:
    """A device rule of engines.yaml in words: "a CPU", "GPUs of 70 GiB or more but A100"."""
    if rule.vendor == "cpu":
        return "a CPU"
    but = f" but {', '.join(x.upper() for x in rule.except_names)}" if rule.except_names else ""
    return f"GPUs of {rule.min_memory_gib:g} GiB or more{but}"


def _mtp_acceptance_default() -> float:
    from bench.sim.profiles import resolve_efficiency

    return resolve_efficiency({})["mtp_acceptance"]


MaxNumSeqsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-seqs",
        min=1,
        help="sequences one engine instance runs at once (vLLM --max-num-seqs, SGLang "
        f"--max-running-requests, TensorRT-LLM max_batch_size); default {_defaults('max_num_seqs')}",
    ),
]
MaxBatchedTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-batched-tokens",
        min=1,
        help="tokens per step, prefill chunks included (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size, TensorRT-LLM max_num_tokens); default "
        f"{_defaults('max_num_batched_tokens')}",
    ),
]
KvPrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--kv-precision",
        help="KV-cache precision: bf16 or fp8 (default: FP8 with FP8/FP4 weights, as "
        "InferenceX's scripts set --kv-cache-dtype fp8; BF16 with BF16 weights)",
    ),
]
MtpOpt = Annotated[
    int | None,
    typer.Option(
        "--mtp",
        min=0,
        help="draft tokens per step (multi-token prediction / speculative decoding; the "
        "model's MTP module, else a one-layer EAGLE-style draft); default 0 (off)",
    ),
]
MtpAcceptanceOpt = Annotated[
    float | None,
    typer.Option(
        "--mtp-acceptance",
        min=0.0,
        max=1.0,
        help="one acceptance for every draft: each accepted with probability a once the one "
        "before it is (the i-th: a^i); default: the model's published per-draft curve where it "
        "has one (DeepSeek-R1's TensorRT-LLM measurement), else "
        f"{_mtp_acceptance_default():g} (DeepSeek-V3's MTP)",
    ),
]
MtpAcceptanceLengthOpt = Annotated[
    float | None,
    typer.Option(
        "--mtp-acceptance-length",
        min=1.0,
        help="mean tokens a verify step yields per sequence with --mtp N drafts, 1 to N+1 "
        "(vLLM's 'Mean acceptance length', SGLang's accept length, InferenceX's golden AL); "
        "instead of --mtp-acceptance",
    ),
]
ApiServerCountOpt = Annotated[
    int | None,
    typer.Option(
        "--api-server-count",
        min=1,
        help="front-end processes detokenising and streaming the tokens (vLLM "
        "--api-server-count): vLLM's front end paces a step once the tokens it emits take it "
        "longer than the GPU (efficiency.yaml t_fe_tok_s); default one per data-parallel rank, "
        "as vLLM's",
    ),
]
MemoryFractionOpt = Annotated[
    float | None,
    typer.Option(
        "--memory-fraction",
        min=0.0,
        max=1.0,
        help="the engine's memory fraction: vLLM --gpu-memory-utilization (of total), SGLang "
        "--mem-fraction-static (of total; none = derived from capacity), TensorRT-LLM "
        f"free_gpu_memory_fraction (of memory left after weights); default "
        f"{_defaults('memory_fraction')}",
    ),
]


PrefixCacheOpt = Annotated[
    str | None,
    typer.Option(
        "--prefix-cache",
        help="the simulated prefix cache: lru (vLLM), radix (SGLang, TensorRT-LLM), slots "
        "(llama.cpp's per-slot prompts) or off; default: the engine's own "
        "(bench/sim/profiles/prefix_cache.yaml)",
    ),
]


DisaggOpt = Annotated[
    str | None,
    typer.Option(
        "--disagg",
        help="disaggregated prefill/decode as xPyD (InferenceX's and Dynamo's name): x prefill "
        "and y decode instances, each of --parallel (or --prefill-parallel / "
        "--decode-parallel), the prompt's KV moved between them (--kv-link); GPUs = both "
        "pools'. Default: colocated (one pool does both)",
    ),
]
PrefillParallelOpt = Annotated[
    str | None,
    typer.Option(
        "--prefill-parallel",
        help="each prefill instance's parallelism (tp4, dep8); default --parallel",
    ),
]
DecodeParallelOpt = Annotated[
    str | None,
    typer.Option(
        "--decode-parallel",
        help="each decode instance's parallelism (tp4, dep8); default --parallel",
    ),
]
KvLinkOpt = Annotated[
    str | None,
    typer.Option(
        "--kv-link",
        help="what the KV crosses from prefill to decode: nvlink (the GPU's scale-up link), "
        "network (its NIC, bench/hardware/gpus.yaml scale_out) or auto (NVLink when both "
        "pools fit in one scale-up domain); default auto",
    ),
]


def serve_options(
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    kv_precision: str | None,
    mtp: int | None,
    mtp_acceptance: float | None,
    memory_fraction: float | None,
    prefix_cache: str | None = None,
    disagg: str | None = None,
    prefill_parallel: str | None = None,
    decode_parallel: str | None = None,
    kv_link: str | None = None,
    mtp_acceptance_length: float | None = None,
    api_server_count: int | None = None,
):
    """The engine knobs as the library takes them (bench.sim.engine.ServeOptions)."""
    from bench.sim.engine import ServeOptions

    return ServeOptions(
        max_num_seqs, max_num_batched_tokens, kv_precision, mtp, mtp_acceptance,
        memory_fraction, prefix_cache, disagg, prefill_parallel, decode_parallel, kv_link,
        mtp_acceptance_length, api_server_count,
    )  # fmt: skip


def serve(
    gpu: SimGpuOpt = None,
    model: SimModelOpt = None,
    precision: PrecisionOpt = None,
    tp: TpOpt = 1,
    parallel: ParallelOpt = None,
    engine_name: EngineOpt = None,
    profile: ProfileOpt = None,
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8100, help="port to bind"),
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: MaxBatchedTokensOpt = None,
    kv_precision: KvPrecisionOpt = None,
    mtp: MtpOpt = None,
    mtp_acceptance: MtpAcceptanceOpt = None,
    mtp_acceptance_length: MtpAcceptanceLengthOpt = None,
    api_server_count: ApiServerCountOpt = None,
    memory_fraction: MemoryFractionOpt = None,
    prefix_cache: PrefixCacheOpt = None,
    disagg: DisaggOpt = None,
    prefill_parallel: PrefillParallelOpt = None,
    decode_parallel: DecodeParallelOpt = None,
    kv_link: KvLinkOpt = None,
    default_max_tokens: int = typer.Option(
        256, help="output length of chat requests without max_tokens"
    ),
) -> None:
    """Run an OpenAI-compatible server that emits tokens at their simulated times."""
    from bench.sim.profiles import ProfileError
    from bench.sim.server import run_server
    from bench.sim.virtual import VirtualExecutor

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prof, d = apply_profile(
        profile, gpu, model, precision, engine_name, max_num_seqs, max_num_batched_tokens,
        SIM_DEFAULTS,
    )  # fmt: skip
    from bench.sim.error_bars import calibration_record

    calibration = calibration_record(prof) if prof is not None else None
    options = serve_options(
        d["max_num_seqs"], d["max_num_batched_tokens"], kv_precision, mtp, mtp_acceptance,
        memory_fraction, prefix_cache, disagg, prefill_parallel, decode_parallel, kv_link,
        mtp_acceptance_length, api_server_count,
    )  # fmt: skip
    try:  # the engine `sim run` and the validation build, from the same options
        engine = VirtualExecutor(
            d["gpu"], d["model"], d["precision"], tp, parallel=parallel, engine=d["engine"],
            options=options,
        ).build()  # fmt: skip
    except (ProfileError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    if options.mtp:
        console.print(mtp_note(engine.dep, mtp_acceptance, mtp_acceptance_length))
    dep = engine.dep

    def banner(bound: int) -> None:
        console.print(
            f"[bold]SIMULATED[/bold] {engine.label}{_split(engine)}: KV cache "
            f"{engine.capacity_tokens:,} tokens, "
            f"prefix cache {engine.prefix_policy} "
            f"({engine.memory_plan().describe()}), "
            f"batch-1 decode step {dep.step_time(1, 1, 0, 0) * 1e3:.1f} ms{_front_end(dep)}; "
            f"http://{host}:{bound}/v1  (Ctrl-C to stop)"
        )

    try:
        run_server(engine, dep.model.name, host, port, default_max_tokens, ready=banner,
                   calibration=calibration)  # fmt: skip
    except OSError as exc:
        err_console.print(
            f"[red]error:[/red] cannot listen on {host}:{port}: {exc.strerror or exc}"
            + ("; is another server on that port? Pick another with --port" if port else ""),
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    console.print("stopped")


def _front_end(dep) -> str:
    """What the engine's front end streams at most (nothing where it is never the pace)."""
    if not dep.eff.t_fe_tok_s:
        return ""
    return f", front end {dep.front_ends} x {1 / dep.eff.t_fe_tok_s:,.0f} output tok/s (--api-server-count)"


def _split(engine) -> str:
    """How a disaggregated engine's GPUs divide (nothing for a colocated one)."""
    k = engine.knobs()
    if "disagg" not in k:
        return ""
    return f", KV moved over {k['kv_link']} ({k['kv_link_gbps']:g} GB/s per GPU); decode pool"


def run(
    gpu: SimGpuOpt = None,
    model: SimModelOpt = None,
    precision: PrecisionOpt = None,
    tp: TpOpt = 1,
    parallel: ParallelOpt = None,
    engine_name: EngineOpt = None,
    profile: ProfileOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: MaxBatchedTokensOpt = None,
    kv_precision: KvPrecisionOpt = None,
    mtp: MtpOpt = None,
    mtp_acceptance: MtpAcceptanceOpt = None,
    mtp_acceptance_length: MtpAcceptanceLengthOpt = None,
    api_server_count: ApiServerCountOpt = None,
    memory_fraction: MemoryFractionOpt = None,
    prefix_cache: PrefixCacheOpt = None,
    disagg: DisaggOpt = None,
    prefill_parallel: PrefillParallelOpt = None,
    decode_parallel: DecodeParallelOpt = None,
    kv_link: KvLinkOpt = None,
    scenario: ScenarioOpt = None,
    request_rates: RequestRatesOpt = None,
    concurrency: ConcurrencyPointsOpt = None,
    auto: AutoOpt = None,
    slo: SloOpt = None,
    slo_iterations: SloIterationsOpt = None,
    slo_draws: SloDrawsOpt = None,
    label: LabelOpt = None,
    num_prompts: NumPromptsOpt = None,
    point_duration: PointDurationOpt = None,
    warmup: WarmupOpt = 0.0,
    cooldown: CooldownOpt = 0.0,
    max_error_rate: MaxErrorRateOpt = None,
    random_input_len: InputLenOpt = None,
    random_output_len: OutputLenOpt = None,
    seed: SeedOpt = None,
    summary_json: SummaryJsonOpt = None,
    fail_on: SweepFailOnOpt = None,
    db: DbOption = None,
    num_warmups: NumWarmupsOpt = None,
    ramp_up_strategy: RampUpStrategyOpt = None,
    ramp_up_start_rps: RampUpStartRpsOpt = None,
    ramp_up_end_rps: RampUpEndRpsOpt = None,
) -> None:
    """Run a scenario in virtual time (no HTTP, far faster than real time), stored as
    simulated: one point (the scenario's load), or a sweep with the flags of `sweep`."""
    from bench.cli.sweep import conclude_sweep, measure_sweep, print_sweep_result, sweep_plan
    from bench.cost import load_catalogue
    from bench.drive import choose_executor
    from bench.scenario import own_rate
    from bench.sim.profiles import ProfileError
    from bench.sweep import PointSpec

    if len([m for m in (request_rates, concurrency, auto) if m is not None]) > 1:
        raise fail("give at most one of --request-rates, --concurrency or --auto N")
    overrides = flag_overrides(
        num_prompts=num_prompts, random_input_len=random_input_len,
        random_output_len=random_output_len, seed=seed, label=label,
        num_warmups=num_warmups, ramp_up_strategy=ramp_up_strategy,
        ramp_up_start_rps=ramp_up_start_rps, ramp_up_end_rps=ramp_up_end_rps,
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, "run", rate_default=4)
    prof, d = apply_profile(
        profile, gpu, model, precision, engine_name, max_num_seqs, max_num_batched_tokens,
        SIM_DEFAULTS,
    )  # fmt: skip
    options = serve_options(
        d["max_num_seqs"], d["max_num_batched_tokens"], kv_precision, mtp, mtp_acceptance,
        memory_fraction, prefix_cache, disagg, prefill_parallel, decode_parallel, kv_link,
        mtp_acceptance_length, api_server_count,
    )  # fmt: skip
    deployment = dict(
        gpu=d["gpu"], model=d["model"], precision=d["precision"], tp=tp, parallel=parallel
    )
    calibration = None
    if prof is not None:
        from bench.sim.error_bars import calibration_record

        calibration = calibration_record(prof)
    virtual = choose_executor(
        virtual={
            **deployment,
            "engine": d["engine"],
            "options": options,
            "calibration": calibration,
        }
    )
    try:
        sc = virtual.adopt(sc)
    except (ProfileError, ValueError) as exc:
        raise fail(str(exc)) from None
    if options.mtp:
        console.print(mtp_note(virtual.build().dep, mtp_acceptance, mtp_acceptance_length))
    plan, gates = sweep_plan(
        sc, request_rates, concurrency, auto, slo, slo_iterations, point_duration, warmup,
        cooldown, max_error_rate, fail_on, slo_draws=slo_draws,
    )  # fmt: skip
    if not plan.specs and plan.auto is None:  # one point: the scenario's own load
        if sc.load.shape == "closed":
            plan.specs = [PointSpec("concurrency", sc.load.concurrency or 1)]
        else:
            try:  # a replayed trace: at its own timestamps' rate, so they are kept as they are
                rate = own_rate(sc, scenario.parent if scenario else None)
            except (ValueError, OSError) as exc:
                raise fail(str(exc)) from None
            plan.specs = [PointSpec("rate", rate or sc.load.request_rate)]
    started = time.monotonic()
    result = measure_sweep(
        sc, plan, executor=virtual, db=db,
        base_dir=scenario.parent if scenario else None,
    )  # fmt: skip
    print_sweep_result(
        result, sc, load_catalogue(), 1.0,
        title=f"SIMULATED (virtual time): run {result.run_id}", served="simulated",
    )  # fmt: skip
    requests = sum(p.summary.completed + p.summary.failed for p in result.points)
    console.print(f"{requests:,} requests simulated in {time.monotonic() - started:.1f} s. "
                  f"`tokenbench show {(result.run_id or '')[:8]}`")  # fmt: skip
    sim_error = print_error_bars(result, virtual, prof, db)
    conclude_sweep(result, sc, db, gates, summary_json, sim_error)


def mtp_note(dep, acceptance: float | None, length: float | None) -> str:
    """What the simulated drafts yield, and from what: the user's figure or the model's."""
    per = ", ".join(f"{p:.2f}" for p in dep.mtp_positions)
    if acceptance is not None or length is not None:
        origin = "as stated"
    elif dep.model.mtp_acceptance_lengths:
        origin = (
            f"{dep.model.name}'s published curve on real prompts; state your engine's with "
            "--mtp-acceptance-length"
        )
    else:
        origin = (
            f"each draft {dep.eff.mtp_acceptance:g} once the one before it is accepted, the "
            "default; state your engine's with --mtp-acceptance-length"
        )
    return (
        f"MTP: {int(dep.eff.mtp_tokens)} drafts a step, mean acceptance length "
        f"{dep.mtp_gain:.2f} (accepted per draft position: {per}; {origin})"
    )


def print_error_bars(result, virtual, profile, db: str | None = None) -> dict:
    """Each simulated point's figures with their expected error and its utilisation of the
    deployment's saturation rate (bench.sim.error_bars), the rate kept with the stored run
    (the dashboard and the exports flag the same points); returns what the JSON carries."""
    from bench.console import error_bars_table, near_saturation_note
    from bench.curves import load_saturation
    from bench.sim.error_bars import (
        NEAR_SATURATION,
        expected_errors,
        mean_lengths,
        point_error_bars,
        saturation_rate,
    )

    engine = virtual.build()
    dep, split = engine.dep, "disagg" in engine.knobs()
    errors, basis = expected_errors(
        dep.gpu.name, dep.model.name, profile, disagg=split, mtp=bool(dep.eff.mtp_tokens),
        engine=dep.engine,
    )  # fmt: skip
    if result.run_id:  # drive.measure kept it with the stored run
        sat = load_saturation(result.run_id, db)
    else:
        lengths = mean_lengths(result.points)
        sat = saturation_rate(virtual.build(), *lengths) if lengths else None
    points, rows = {}, []
    for p in result.points:
        offered = p.spec.value if p.spec.kind == "rate" else None
        bars = point_error_bars(p.summary, errors, sat, offered)
        points[p.index] = bars
        rows.append((str(p.index + 1), p.spec.title, bars))
    console.print(error_bars_table(basis, errors, rows))
    if any(b["near_saturation"] for b in points.values()):
        console.print(near_saturation_note(sat))
    return {"basis": basis, "expected_error": errors, "saturation_requests_per_s": sat,
            "near_saturation_at": NEAR_SATURATION, "points": points}  # fmt: skip


def gpus() -> None:
    """List the GPU profiles (bench/hardware/gpus.yaml) and the fitted efficiency parameters."""
    from bench.hardware import interconnects, load_gpus
    from bench.sim.profiles import fitted_parameters

    table = Table(title="GPU profiles (bench/hardware/gpus.yaml)")
    for col in [
        "name",
        "aliases",
        "HBM GB",
        "reported MiB",
        "TB/s",
        "BF16",
        "FP8",
        "FP4",
        "TDP W",
        "scale-up GB/s",
        "network GB/s",
    ]:
        table.add_column(col)
    links = interconnects()
    for g in load_gpus().values():
        nic = links.get(g.scale_out)
        tf = [f"{g.tflops.get(p):,.0f}" if g.tflops.get(p) else "-" for p in ("bf16", "fp8", "fp4")]
        table.add_row(
            g.name,
            ", ".join(g.aliases),
            f"{g.hbm_gb:g}",
            f"{g.memory_mib:,.0f}" if g.memory_mib else "-",
            f"{g.hbm_bw_tbs:g}",
            *tf,
            f"{g.tdp_w:,.0f}",
            f"{g.scale_up_gbps:g}",
            f"{nic.gbps:g} ({nic.name})" if nic else "-",  # a disaggregated KV transfer's
        )
    console.print(table)
    eff = Table(title="Fitted efficiency parameters (bench/sim/profiles/efficiency.yaml)")
    for col in ("parameter", "value", "physical range"):
        eff.add_column(col)
    # the sources are paragraphs: wrapped in their cell, so a piped table (printed at its
    # natural width, bench.console) stays readable instead of 1,200 columns wide
    eff.add_column("where the range comes from", max_width=SOURCE_COLUMN_WIDTH)
    for name, value, (lo, hi), source in fitted_parameters():
        eff.add_row(name, f"{value:.4g}", f"{lo:g} - {hi:g}", source)
    console.print(eff)


def models() -> None:
    """List the model profiles (models.yaml) with derived weight and KV sizes."""
    from bench.sim.profiles import load_models
    from bench.sim.roofline import Deployment

    table = Table(title="Model profiles (bench/sim/profiles/models.yaml)")
    for col in [
        "name",
        "arch",
        "params B",
        "active B",
        "layers",
        "KV/token FP8",
        "FP8 weights GB",
        "1xB200 FP8 KV tokens",
    ]:
        table.add_column(col)
    for m in load_models().values():
        try:
            kv = f"{Deployment.build('B200', m, 'fp8').kv_capacity_tokens():,}"
        except ValueError:
            kv = "does not fit"
        table.add_row(
            m.name,
            m.arch,
            f"{m.params_b:g}",
            f"{m.active_params_b:g}",
            str(m.layers),
            f"{m.kv_bytes_per_token('fp8') / 1024:.1f} KiB",
            f"{m.weight_bytes('fp8') / 1e9:.1f}",
            kv,
        )
    console.print(table)
