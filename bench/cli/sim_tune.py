"""`tokenbench sim tune`: the cheapest simulated configuration per GPU type and pricing tier at
an SLO (bench.sim_tune does the search; this shell parses flags and lays out the answer)."""

from __future__ import annotations

from typing import Annotated

import typer

from bench.cli.common import _catalogue, fail, flag_overrides, resolve_scenario
from bench.cli.options import DbOpt, NumPromptsOpt, PriceOpt, PricesFileOpt, ScenarioOpt, SeedOpt
from bench.cli.sim import SIM_ENGINE, SIM_MODEL, EngineOpt, SimModelOpt
from bench.cli.sim_calibrate import ProfileOpt
from bench.console import Table, console, err_console


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise fail(
            f"{flag} {text!r}: give whole numbers separated by commas, e.g. 32,128,512"
        ) from None
    if not values or any(v < 0 for v in values):
        raise fail(f"{flag} {text!r}: give one or more whole numbers >= 0")
    return values


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _splits(text: str) -> list[str]:
    """--disagg's xPyD splits, each checked ('none': no split searched)."""
    from bench.sim.disagg import parse_disagg

    names = _names(text)
    if [n.lower() for n in names] == ["none"]:
        return []
    out = []
    for n in names:
        try:
            x, y = parse_disagg(n)
        except ValueError as exc:
            raise fail(f"{exc}; or 'none'") from None
        out.append(f"{x}P{y}D")
    return out


def sim_tune(
    slo: Annotated[
        str,
        typer.Option("--slo", help="the SLO to hold, e.g. 'p99_ttft_ms<=2000,p99_tpot_ms<=50'"),
    ],
    model: SimModelOpt = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPU types to compare, e.g. B200,H100 (see `sim gpus`); default B200,H100, "
            "or with --profile the profile's device alone",
        ),
    ] = None,
    profile: ProfileOpt = None,
    scenario: ScenarioOpt = None,
    engine_name: EngineOpt = None,
    precisions: Annotated[
        str,
        typer.Option(
            "--precisions", help="weight precisions to try (those a GPU lacks are skipped)"
        ),
    ] = "fp8,fp4,bf16",
    parallel: Annotated[
        str | None,
        typer.Option(
            "--parallel",
            help="parallelisms to try, e.g. tp2,tp4,dep8 (default: "
            "TP over 1, 2, 4, 8 GPUs; DEP and TEP too for MoE models)",
        ),
    ] = None,  # fmt: skip
    max_gpus: Annotated[
        int, typer.Option("--max-gpus", min=1, help="most GPUs in one deployment")
    ] = 8,
    mtp: Annotated[
        str, typer.Option("--mtp", help="MTP draft tokens per step to try (0 = off)")
    ] = "0,2",
    max_num_seqs: Annotated[
        str,
        typer.Option("--max-num-seqs", help="coarse max-num-seqs values, refined around the best"),
    ] = "32,128,512",
    max_num_batched_tokens: Annotated[
        str | None,
        typer.Option(
            "--max-num-batched-tokens",
            help="max-num-batched-tokens values to try "
            "(default: the engine's, then halved and doubled around the best)",
        ),
    ] = None,  # fmt: skip
    refine: Annotated[
        bool, typer.Option("--refine/--no-refine", help="refine the batch limits around the best")
    ] = True,
    disagg: Annotated[
        str,
        typer.Option(
            "--disagg",
            help="disaggregated prefill/decode splits (xPyD) tried around each GPU type's best, "
            "over each TP degree within --max-gpus; 'none' for colocated only",
        ),
    ] = "1P1D,1P2D,1P3D,2P1D",
    top: Annotated[int, typer.Option("--top", min=1, help="configurations kept per GPU type")] = 3,
    slo_iterations: Annotated[
        int, typer.Option("--slo-iterations", min=1, help="SLO-search points per configuration")
    ] = 6,
    slo_draws: Annotated[
        int, typer.Option("--slo-draws", min=0, help="fresh draws at the bracketing loads")
    ] = 1,
    name: Annotated[
        str | None, typer.Option("--name", help="experiment name the runs are stored under")
    ] = None,
    num_prompts: NumPromptsOpt = None,
    seed: SeedOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
    prices_file: PricesFileOpt = None,
    price: PriceOpt = None,
    db: DbOpt = None,
) -> None:
    """Search simulated configurations (GPU type and count, TP/EP, precision, MTP, batch
    limits, disaggregated prefill/decode split) for the cheapest way to hold an SLO on a
    workload, in virtual time; each searched configuration is stored as a simulated run. With
    --profile, the profile's GPU type runs on its calibrated device (model and engine default to
    what it was fitted on) and its ranges widen by the profile's own error; the profile's device
    must be among --gpus."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bench.metrics import parse_thresholds
    from bench.sim_tune import Space, dumps, search
    from bench.store import StoreError

    try:
        thresholds = parse_thresholds(slo, flag="--slo")
    except ValueError as exc:
        raise fail(str(exc)) from None
    prof = None
    if profile is not None:
        from bench.sim.profiles import ProfileError
        from bench.sim.user_calibration import load_profile

        try:
            prof = load_profile(profile)
        except ProfileError as exc:
            raise fail(str(exc)) from None
    model = model or (prof.settings.model if prof else SIM_MODEL)
    engine_name = engine_name or (prof.settings.engine if prof else None) or SIM_ENGINE
    if gpus is None:
        gpus = prof.device.name if prof else "B200,H100"
    tokens = (
        [None]
        if max_num_batched_tokens is None
        else _ints(max_num_batched_tokens, "--max-num-batched-tokens")
    )
    space = Space(
        gpus=_names(gpus), precisions=_names(precisions), mtp=_ints(mtp, "--mtp"),
        max_num_seqs=_ints(max_num_seqs, "--max-num-seqs"), max_num_batched_tokens=tokens,
        parallels=_names(parallel) if parallel else None, max_gpus=max_gpus, refine=refine,
        disagg=_splits(disagg),
    )  # fmt: skip
    if not space.gpus:
        raise fail("--gpus is empty: name one or more GPU types, e.g. --gpus B200,H100")
    overrides = flag_overrides(num_prompts=num_prompts, seed=seed)
    sc = resolve_scenario(scenario, overrides, "run", rate_default=4)
    catalogue = _catalogue(prices_file, price)
    bar = Progress(
        TextColumn("[bold]sim tune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console, transient=True,
    )  # fmt: skip
    task = bar.add_task("", total=None)
    try:
        with bar:
            result = search(
                sc, model, space, thresholds, catalogue, engine=engine_name, db=db, top=top,
                slo_iterations=slo_iterations, slo_draws=slo_draws, experiment=name,
                on_progress=lambda done, total, what: bar.update(
                    task, completed=done, total=total, description=what
                ), profile=prof,
            )  # fmt: skip
    except (ValueError, KeyError, StoreError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(dumps(result))
    else:
        print_tune(result)
    if not result.searched():
        err_console.print(
            "[bold red]No configuration met the SLO[/] at any load tested: loosen --slo, allow "
            "more GPUs per deployment (--max-gpus) or try other GPUs and precisions.",
            highlight=False,
        )
        raise typer.Exit(1)


def _usd(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f}"


def print_tune(result) -> None:
    """The answer as tables: best per GPU type, cheapest per tier, what mattered most."""
    from bench.metrics import slo_text

    counts = result.to_json()["counts"]
    console.print(
        f"[bold]SIMULATED[/bold] (virtual time) sim tune of {result.model} on "
        f"{', '.join(result.gpus())}, workload {result.scenario}, SLO {slo_text(result.slo)}: "
        f"{len(result.outcomes)} configurations, {counts['searched']} searched, "
        f"{counts['pruned']} pruned, {counts['unfit'] + counts['failed']} cannot run; "
        f"{result.simulated_requests:,} requests simulated in {result.elapsed_s:.0f} s",
        highlight=False,
    )
    best = Table(
        title=f"Best configurations per GPU type: capacity per GPU at {slo_text(result.slo)}"
    )
    for col in ("GPU", "#", "configuration", "GPUs", "output tok/s per GPU (range)",
                "req/s per replica", "cheapest tier", "$/Mtok output", "run"):  # fmt: skip
        best.add_column(col)
    for gpu in result.gpus():
        for i, o in enumerate(result.best(gpu), 1):
            cap = o.capacity
            priced = [r for r in o.cost_rows if r.output_usd_per_mtok is not None]
            cheap = min(priced, key=lambda r: r.output_usd_per_mtok) if priced else None
            best.add_row(
                gpu, str(i), o.config.text(), str(o.config.gpus), cap.text("tok/s"),
                f"{cap.point.requests_per_s:.2f}" if cap.point else "-",
                cheap.tier if cheap else "-", _usd(cheap.output_usd_per_mtok if cheap else None),
                (o.run_id or "")[:8],
            )  # fmt: skip
        if not result.best(gpu):
            best.add_row(gpu, "-", "no configuration met the SLO", "", "", "", "", "", "")
    console.print(best)
    for gpu in result.gpus():
        if any(o.capacity.kind == "at_least" for o in result.best(gpu)):
            console.print(
                f"[yellow]caution[/] ({gpu}): a capacity is a lower bound (every load tested met "
                "the SLO): give more requests per point (--num-prompts) so the queue can build",
                highlight=False,
            )
    if not result.searched():
        return
    tiers = Table(title="Cheapest configuration per GPU type on each pricing tier ($/Mtok output)")
    for col in ("tier", "GPU", "configuration", "$/GPU-h", "$/Mtok output", "range"):
        tiers.add_column(col)
    verdicts = []
    for t in result.tiers():
        for e in t["by_gpu"]:
            tiers.add_row(
                t["tier"], e["gpu"], e["config"], f"{e['usd_per_gpu_hour']:g}",
                _usd(e["output_usd_per_mtok"]),
                f"{_usd(e['output_usd_per_mtok_low'])}-{_usd(e['output_usd_per_mtok_high'])}",
            )  # fmt: skip
        verdicts.append(f"{t['tier']}: {t['verdict']}")
    console.print(tiers)
    for line in verdicts:
        console.print(f"  {line}", highlight=False)
    sens = Table(title="Which settings changed the answer most (best capacity per GPU with the "
                       "setting fixed, the others re-tuned)")  # fmt: skip
    for col in ("GPU", "setting", "best", "worst", "capacity lost", "each value"):
        sens.add_column(col)
    for s in result.sensitivity():
        loss = f"{'at least ' if s['loss_is_bound'] else ''}{s['loss']:.0%}"
        sens.add_row(
            s["gpu"], s["setting"], _val(s["best_value"], s["setting"]),
            _val(s["worst_value"], s["setting"]), loss,
            ", ".join(_each(e, s["setting"]) for e in s["values"]),
        )  # fmt: skip
    console.print(sens)
    for gpu in result.gpus():
        per, basis = result.expected_errors(gpu)
        lo, hi = min(per.values()), max(per.values())
        span = f"±{hi:.0%}" if lo == hi else f"±{lo:.0%} to ±{hi:.0%} by quantity"
        best = result.best(gpu)[:1]
        cap = best[0].capacity if best else None
        widened = (
            f" (the best one's ±{cap.sim_error:.0%})" if cap and cap.sim_error is not None else ""
        )
        console.print(
            f"Expected error of simulated figures on {gpu}: {span} ({basis}); every capacity "
            f"range above includes the error of the figures that could decide it{widened}.",
            highlight=False,
        )
    tops = [o.run_id[:8] for gpu in result.gpus() for o in result.best(gpu)[:1] if o.run_id]
    if len(tops) >= 2:
        console.print(f"Side by side: `tokenbench compare {' '.join(tops)}`", highlight=False)


def _val(v, setting: str = "") -> str:
    if v is None:
        return "colocated" if setting == "disagg" else "default"
    return str(v)


def _each(e: dict, setting: str = "") -> str:
    v = _val(e["value"], setting)
    if not e["runs"]:
        return f"{v}: cannot run"
    if e["at_most"] is not None:
        return f"{v}: at most {e['at_most']:,.0f}"
    return f"{v}: {e['capacity'] or 0:,.0f}"
