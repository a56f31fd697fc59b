"""`tokenbench sim ...`: serve a simulated endpoint, list the GPU and model profiles.

Each command is a thin shell over the library (bench.sim.server, bench.sim.profiles);
bench/cli/__init__.py registers them on the `sim` group.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer

from bench.cli.common import fail, flag_overrides, resolve_scenario
from bench.cli.options import (
    AutoOpt,
    ConcurrencyPointsOpt,
    CooldownOpt,
    DbOption,
    InputLenOpt,
    MaxErrorRateOpt,
    NumPromptsOpt,
    OutputLenOpt,
    PointDurationOpt,
    RequestRatesOpt,
    ScenarioOpt,
    SeedOpt,
    SloIterationsOpt,
    SloOpt,
    SummaryJsonOpt,
    SweepFailOnOpt,
    WarmupOpt,
)
from bench.console import Table, console, err_console

# The simulated deployment, as `sim serve` and `sim run` both take it, and its default.
SIM_GPU, SIM_MODEL, SIM_PRECISION, SIM_ENGINE = "B200", "llama-3.3-70b", "fp8", "vllm"
SimGpuOpt = Annotated[str, typer.Option("--gpu", help="GPU profile or alias (see `sim gpus`)")]
SimModelOpt = Annotated[str, typer.Option("--model", help="model profile (see `sim models`)")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="bf16, fp8, fp4 (nvfp4), mxfp4")]
TpOpt = Annotated[int, typer.Option("--tp", help="tensor-parallel degree (= GPUs)")]
ParallelOpt = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        help="parallelism instead of --tp: tp8, dep8 (attention DP + expert parallel), tep8",
    ),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine", help="serving engine whose efficiency profile to use: vllm, sglang, trtllm"
    ),
]


def serve(
    gpu: SimGpuOpt = SIM_GPU,
    model: SimModelOpt = SIM_MODEL,
    precision: PrecisionOpt = SIM_PRECISION,
    tp: TpOpt = 1,
    parallel: ParallelOpt = None,
    engine_name: EngineOpt = SIM_ENGINE,
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8100, help="port to bind"),
    max_num_seqs: int | None = typer.Option(None, help="vLLM --max-num-seqs (default 256)"),
    max_num_batched_tokens: int | None = typer.Option(
        None, help="vLLM --max-num-batched-tokens (default 8192)"
    ),
    default_max_tokens: int = typer.Option(
        256, help="output length of chat requests without max_tokens"
    ),
) -> None:
    """Run an OpenAI-compatible server that emits tokens at their simulated times."""
    from bench.sim.profiles import ProfileError
    from bench.sim.server import run_server
    from bench.sim.virtual import build_engine

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine = build_engine(
            gpu, model, precision, tp, max_num_seqs, max_num_batched_tokens,
            parallel=parallel, engine=engine_name,
        )  # fmt: skip
    except (ProfileError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    dep = engine.dep

    def banner(bound: int) -> None:
        console.print(
            f"[bold]SIMULATED[/bold] {dep.label}: KV cache {engine.capacity_tokens:,} tokens, "
            f"batch-1 decode step {dep.step_time(1, 1, 0, 0) * 1e3:.1f} ms; "
            f"http://{host}:{bound}/v1  (Ctrl-C to stop)"
        )

    try:
        run_server(engine, dep.model.name, host, port, default_max_tokens, ready=banner)
    except OSError as exc:
        err_console.print(
            f"[red]error:[/red] cannot listen on {host}:{port}: {exc.strerror or exc}"
            + ("; is another server on that port? Pick another with --port" if port else ""),
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    console.print("stopped")


def run(
    gpu: SimGpuOpt = SIM_GPU,
    model: SimModelOpt = SIM_MODEL,
    precision: PrecisionOpt = SIM_PRECISION,
    tp: TpOpt = 1,
    parallel: ParallelOpt = None,
    engine_name: EngineOpt = SIM_ENGINE,
    scenario: ScenarioOpt = None,
    request_rates: RequestRatesOpt = None,
    concurrency: ConcurrencyPointsOpt = None,
    auto: AutoOpt = None,
    slo: SloOpt = None,
    slo_iterations: SloIterationsOpt = 4,
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
) -> None:
    """Run a scenario in virtual time (no HTTP, far faster than real time), stored as
    simulated: one point (the scenario's load), or a sweep with the flags of `sweep`."""
    from bench.cli.sweep import conclude_sweep, measure_sweep, print_sweep_result, sweep_plan
    from bench.cost import load_catalogue
    from bench.sim.profiles import ProfileError
    from bench.sim.virtual import VirtualExecutor
    from bench.sweep import PointSpec, mean_rate

    if len([m for m in (request_rates, concurrency, auto) if m is not None]) > 1:
        raise fail("give at most one of --request-rates, --concurrency or --auto N")
    overrides = flag_overrides(
        num_prompts=num_prompts, random_input_len=random_input_len,
        random_output_len=random_output_len, seed=seed,
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, "run", {"load": {"request_rate": 4}})
    virtual = VirtualExecutor(gpu, model, precision, tp, parallel=parallel, engine=engine_name)
    try:
        sc = virtual.adopt(sc)
    except (ProfileError, ValueError) as exc:
        raise fail(str(exc)) from None
    plan, gates = sweep_plan(
        sc, request_rates, concurrency, auto, slo, slo_iterations, point_duration, warmup,
        cooldown, max_error_rate, fail_on,
    )  # fmt: skip
    if not plan.specs and plan.auto is None:  # one point: the scenario's own load
        if sc.load.shape == "closed":
            plan.specs = [PointSpec("concurrency", sc.load.concurrency or 1)]
        else:
            plan.specs = [PointSpec("rate", mean_rate(sc) or sc.load.request_rate)]
    started = time.monotonic()
    result = measure_sweep(
        sc, plan, executor=virtual, db=db, show_progress=False,
        base_dir=scenario.parent if scenario else None,
    )  # fmt: skip
    print_sweep_result(
        result, sc, load_catalogue(), 1.0, title=f"SIMULATED (virtual time): run {result.run_id}"
    )
    requests = sum(p.summary.completed + p.summary.failed for p in result.points)
    console.print(f"{requests:,} requests simulated in {time.monotonic() - started:.1f} s. "
                  f"`tokenbench show {(result.run_id or '')[:8]}`")  # fmt: skip
    conclude_sweep(result, sc, db, gates, summary_json)


def gpus() -> None:
    """List the GPU profiles (gpus.yaml) and the efficiency parameters with their sources."""
    from bench.sim.profiles import efficiency_sources, load_gpus

    table = Table(title="GPU profiles (bench/sim/profiles/gpus.yaml)")
    for col in [
        "name",
        "aliases",
        "HBM GB",
        "TB/s",
        "BF16",
        "FP8",
        "FP4",
        "TDP W",
        "scale-up GB/s",
    ]:
        table.add_column(col)
    for g in load_gpus().values():
        tf = [f"{g.tflops.get(p):,.0f}" if g.tflops.get(p) else "-" for p in ("bf16", "fp8", "fp4")]
        table.add_row(
            g.name,
            ", ".join(g.aliases),
            f"{g.hbm_gb:g}",
            f"{g.hbm_bw_tbs:g}",
            *tf,
            f"{g.tdp_w:,.0f}",
            f"{g.scale_up_gbps:g}",
        )
    console.print(table)
    eff = Table(title="Roofline efficiency parameters")
    eff.add_column("parameter")
    eff.add_column("source")
    for k, v in efficiency_sources().items():
        eff.add_row(k, v)
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
