"""`tokenbench sim calibrate`, `sim check` and `sim device`: fit the simulator to a user's own
measured runs, predict other measured runs with the fit to check it, and measure this host's
CPU as a device to simulate.

Thin shells over bench.sim.user_calibration and bench.sim.device_profile; `sim run --profile`
and `sim serve --profile` (bench/cli/sim.py) read what `calibrate` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bench.cli.common import fail
from bench.cli.options import DbOption
from bench.console import Table, console

DeviceOpt = Annotated[
    Path | None,
    typer.Option(
        "--device",
        help="device file in the hardware catalogue's layout (e.g. from `tokenbench sim "
        "device`: this host's CPU); with several devices in it, --gpu picks one",
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        help="calibration profile from `tokenbench sim calibrate`: its device and fitted "
        "efficiency; model, precision, engine and limits default to what it was fitted on",
    ),
]


def resolve_device(gpu: str | None, device: Path | None, fallback: str | None = None):
    """The device: --device FILE (its entry --gpu, or its only one), else catalogue --gpu,
    else `fallback` (a stored run's GPU)."""
    from bench.sim.device_profile import load_device
    from bench.sim.profiles import get_gpu

    if device is not None:
        return load_device(device, gpu)
    name = gpu or fallback
    if not name:
        raise ValueError("the run does not say which device it ran on: give --gpu or --device")
    return get_gpu(name)


def calibrate_command(
    runs: Annotated[list[str], typer.Argument(help="stored runs or sweeps (id or prefix)")],
    out: Annotated[Path, typer.Option("--out", help="the profile file to write (YAML)")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="catalogue GPU (see `sim gpus`)")] = None,
    device: DeviceOpt = None,
    model: Annotated[
        str | None, typer.Option("--model", help="model profile or config.json path")
    ] = None,
    precision: Annotated[
        str | None, typer.Option("--precision", help="bf16, fp8, fp4, fp32 (a CPU's F32 GGUF)")
    ] = None,
    engine: Annotated[
        str | None, typer.Option("--engine", help="scheduler model: vllm, sglang, trtllm")
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", help="tensor-parallel degree it ran with")
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        typer.Option("--max-num-seqs", help="sequences at once (llama-server --parallel)"),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option("--max-num-batched-tokens", help="tokens per step (llama-server -b)"),
    ] = None,
    held_out: Annotated[
        bool,
        typer.Option(
            "--held-out",
            help="also predict each load point from a fit without it (one more fit per point): "
            "the error on loads the fit did not see, which the profile then states",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Fit the simulator's free efficiency parameters (bandwidth and compute efficiency,
    per-step and per-token overheads, each within its physical range) to measured runs,
    replaying their requests in virtual time; print the residuals and the parameters the
    data could not pin down, and write the profile `sim run --profile` uses."""
    from bench.sim.profiles import ProfileError
    from bench.sim.user_calibration import (
        Settings,
        calibrate,
        leave_one_point_out,
        load_profile,
        observed_points,
        settings_from_run,
        write_profile,
    )
    from bench.store import StoreError

    points, stored, infos = [], {}, []
    try:
        for ref in runs:
            pts, info = observed_points(ref, db)
            if not pts:
                raise fail(f"run {ref}: no load point with completed requests to calibrate on")
            points += pts
            infos.append(info)
            for k, v in settings_from_run(info).items():
                stored.setdefault(k, v)
    except (StoreError, KeyError, ValueError) as exc:
        raise fail(str(exc)) from None
    given = dict(model=model, precision=precision, engine=engine, tp=tp,
                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)  # fmt: skip
    chosen = {**stored, **{k: v for k, v in given.items() if v is not None}}
    if not chosen.get("model"):
        raise fail("the runs do not say which model they served: give --model (a profile name "
                   "or a Hugging Face config.json)")  # fmt: skip
    try:
        dev = resolve_device(gpu, device, infos[0].gpu_type)
        settings = Settings(**chosen)
        run_meta = [
            {"id": i.id, "label": i.label or i.name, "endpoint": i.endpoint,
             "points": len(i.load_points)}
            for i in infos
        ]  # fmt: skip
        console.print(
            f"calibrating {dev.name} ({dev.vendor}) {settings.model} {settings.precision} "
            f"{settings.engine} on {len(points)} load points of {len(infos)} run(s) ..."
        )
        prof = calibrate(points, dev, settings, run_meta)
        if held_out:
            console.print(f"predicting each of the {len(points)} points from a fit without it ...")
            leave_one_point_out(prof, points)
    except (ProfileError, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        write_profile(prof, out)
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror or exc}") from None
    # what the file holds (figures to 4 significant digits), so the error printed here is the
    # one every later `sim run --profile` states
    print_profile(load_profile(out))
    console.print(f"wrote {out}: use it with `tokenbench sim run --profile {out}`")


def check_command(
    runs: Annotated[list[str], typer.Argument(help="stored runs or sweeps (id or prefix)")],
    profile: Annotated[
        Path, typer.Option("--profile", help="calibration profile from `tokenbench sim calibrate`")
    ],
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            "--max-num-seqs",
            help="sequences at once the runs' server had (llama-server --parallel), if not "
            "what the profile was fitted on",
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", help="tokens per step, if other")
    ] = None,
    summary_json: Annotated[
        Path | None,
        typer.Option("--summary-json", help="also write the check as JSON (for scripts and CI)"),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="keep these predictions in the profile as held-out points, so the error it "
            "states (every prediction's error bars) covers what they missed",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Predict measured runs with a calibration profile and print the error per load point and
    quantity: the check after measure, calibrate, predict, on runs the profile was not fitted
    on (other loads, another batch limit). Says whether each error is within the one the
    profile states, and flags points near the simulated saturation, where it cannot be.
    With --record the points away from saturation join the profile's held-out points, so
    the error it states from then on is at least what this check measured."""
    from bench.cli.summary_json import write_json
    from bench.sim.profiles import ProfileError
    from bench.sim.user_calibration import (
        Settings,
        check_profile,
        load_profile,
        observed_points,
        settings_from_run,
    )
    from bench.store import StoreError

    try:
        prof = load_profile(profile)
    except ProfileError as exc:
        raise fail(str(exc)) from None
    given = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
    checked = []
    try:
        for ref in runs:
            pts, info = observed_points(ref, db)
            if not pts:
                raise fail(f"run {ref}: no load point with completed requests to check")
            own = {k: v for k, v in settings_from_run(info).items() if k in given}
            chosen = {**prof.settings.as_dict(), **own}
            chosen.update({k: v for k, v in given.items() if v is not None})
            checked += check_profile(prof, pts, Settings(**chosen))
    except (StoreError, KeyError, ValueError) as exc:
        raise fail(str(exc)) from None
    doc = check_document(prof, checked, profile)
    print_check(doc)
    if summary_json:
        write_json(summary_json, doc)
    if record:
        _record(prof, checked, profile)


def _record(prof: Any, checked: list, path: Path) -> None:
    """Add the checked points away from saturation to the profile's held-out points (a point
    checked again replaces its earlier entry) and rewrite the file."""
    from bench.sim.user_calibration import write_profile

    kept = [c.residual for c in checked if not c.near_saturation]
    new = {(r.run_id, r.load_point) for r in kept}
    prof.held_out = [r for r in prof.held_out if (r.run_id, r.load_point) not in new] + kept
    try:
        write_profile(prof, path)
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    stated = ", ".join(f"{q} {e:.1%}" for q, e in prof.expected_error().items())
    console.print(
        f"recorded {len(kept)} point(s) in {path} as held out ({len(prof.held_out)} in all); "
        f"the error it states is now: {stated}",
        highlight=False,
    )


def check_document(prof: Any, checked: list, path: Path) -> dict:
    """What `sim check` prints and writes: per point its figures, prediction, error and the
    field's error; per quantity the worst error away from saturation against the profile's,
    each as the error a range around the simulated figure needs to hold the measured one
    (accuracy.range_error: what the profile's stated error is too)."""
    import numpy as np

    from bench.sim.profiles.accuracy import range_error
    from bench.sim.user_calibration import QUANTITY_NAMES

    expected = prof.expected_error()
    points, worst = [], {}
    for c in checked:
        r = c.residual
        errors = {q: e for q in QUANTITY_NAMES if (e := r.error(q)) is not None}
        points.append({
            "run_id": r.run_id, "load_point": r.load_point, "load": r.load,
            "utilisation": c.utilisation, "near_saturation": c.near_saturation,
            "measured": r.measured, "simulated": r.simulated, "error": errors,
            "field_error": c.field.get("median"),
        })  # fmt: skip
        if not c.near_saturation:
            for q, e in errors.items():
                worst[q] = max(worst.get(q, 0.0), range_error(float(e)))
    fields = [p["field_error"] for p in points if p["field_error"] is not None]
    return {
        "profile": str(path),
        "expected_error": expected,
        "points": points,
        "worst_below_saturation": worst,
        # a profile keeps measured and simulated figures to 4 significant digits, so an
        # error it recorded is known to within 1e-3 of 1 + error (each end rounded by 5e-4)
        "within_expected": {
            q: bool(worst[q] <= expected[q] + 1e-3 * (1 + expected[q]))
            for q in worst
            if q in expected
        },
        "field_error_median": float(np.median(fields)) if fields else None,
    }


def print_check(doc: dict) -> None:
    from bench.sim.profiles.accuracy import NEAR_SATURATION
    from bench.sim.user_calibration import QUANTITY_NAMES

    table = Table(title="Predicted with the profile: simulated / measured - 1")
    for col in ("run", "load", "utilisation", *QUANTITY_NAMES, "field"):
        table.add_column(col)
    for p in doc["points"]:
        util = p["utilisation"]
        flag = " near saturation" if p["near_saturation"] else ""
        cells = [
            f"{e:+.1%}" if (e := p["error"].get(q)) is not None else "-" for q in QUANTITY_NAMES
        ]
        field = p["field_error"]
        table.add_row(
            p["run_id"][:8], p["load"], ("-" if util is None else f"{util:.0%}") + flag, *cells,
            "-" if field is None else f"{field:.1%}",
        )  # fmt: skip
    console.print(table)
    exp, worst = doc["expected_error"], doc["worst_below_saturation"]
    for q in QUANTITY_NAMES:
        if q not in worst:
            continue
        verdict = "within" if doc["within_expected"].get(q) else "beyond"
        console.print(
            f"{q}: worst {worst[q]:.1%} below {NEAR_SATURATION:.0%} utilisation (the range "
            f"x/÷ {1 + worst[q]:.3g} around the simulated figure holds the measured one), "
            f"{verdict} the profile's stated {exp.get(q, float('nan')):.1%}",
            highlight=False,
        )
    if not worst:
        console.print("every point ran near the simulated saturation: nothing to hold to the "
                      "profile's stated error")  # fmt: skip
    if doc["field_error_median"] is not None:
        console.print(
            "per-request error in the field's terms (median over points of the median "
            f"|error| of TTFT, ITL and E2E mean/p90/p99): {doc['field_error_median']:.1%}",
            highlight=False,
        )


def print_profile(prof: Any) -> None:
    """The fitted values, how well each is pinned, and the residual per point and quantity."""
    par = Table(title=f"Fitted parameters of {prof.device.name}")
    for col in ("parameter", "value", "physical range", "x/÷ (1 s.e.)", "pinned down"):
        par.add_column(col)
    for p in prof.params:
        spread = f"{p.spread:.3g}" if p.spread < p.high / p.low else "whole range"
        par.add_row(
            p.name, f"{p.value:.4g}", f"{p.low:g} - {p.high:g}", spread,
            "yes" if p.pinned else f"no: {p.why_not_pinned()}",
        )  # fmt: skip
    console.print(par)
    if prof.step_shape:
        from bench.sim.user_calibration import SHAPE_RANGE

        shape = ", ".join(
            f"{b}{' + prefill' if shared else ''}: x{f:.3g}"
            + (" (at its bound: the fit's step is off by more)" if f in SHAPE_RANGE else "")
            for b, shared, f in prof.step_shape
        )
        console.print(
            f"step time by decoding sequences, measured over the model's: {shape}",
            highlight=False,
        )
    _residual_table("Residuals: simulated / measured - 1", prof.residuals)
    if prof.held_out:
        _residual_table("Held out: each point predicted by a fit without it", prof.held_out)
    _print_stated_error(prof)
    loose = prof.unpinned()
    if loose:
        names = ", ".join(f"{p.name} ({p.why_not_pinned()})" for p in loose)
        console.print(f"[yellow]not pinned down by these runs:[/yellow] {names}")
    for f in prof.flat:
        console.print(f"[yellow]flat direction:[/yellow] {f} trade off against each other")
    if not loose and not prof.flat:
        console.print("every parameter is pinned down by these runs")


def _print_stated_error(prof: Any) -> None:
    """What a prediction on the profile states, and how far the engine was from itself."""
    if prof.repeat:
        moved = ", ".join(f"{q} {v:.1%}" for q, v in prof.repeat.items())
        console.print(
            f"measured twice ({'; '.join(prof.repeated_loads)}), the engine moved by: {moved}",
            highlight=False,
        )
    else:
        console.print(
            "no load was measured twice: a run repeating one of these loads (e.g. the first, "
            "last) lets the profile state how far the engine moves from itself",
            highlight=False,
        )
    stated = ", ".join(f"{q} {e:.1%}" for q, e in prof.expected_error().items())
    console.print(f"a prediction on this profile states an error of: {stated}", highlight=False)


def _residual_table(title: str, residuals: list) -> None:
    from bench.sim.user_calibration import QUANTITY_NAMES, mean_errors

    res = Table(title=title)
    res.add_column("run")
    res.add_column("load")
    for q in QUANTITY_NAMES:
        res.add_column(q)
    for r in residuals:
        cells = [f"{e:+.1%}" if (e := r.error(q)) is not None else "-" for q in QUANTITY_NAMES]
        res.add_row(r.run_id[:8], r.load, *cells)
    mean = mean_errors(residuals)  # each residual as the error a range must state to hold it
    res.add_row(
        "mean range error", "", *[f"{mean[q]:.1%}" if q in mean else "-" for q in QUANTITY_NAMES]
    )
    console.print(res)


def device_command(
    out: Annotated[Path, typer.Option("--out", help="device file to write (YAML)")],
    name: Annotated[str, typer.Option("--name", help="the device's name")] = "host-cpu",
    threads: Annotated[
        int, typer.Option("--threads", min=1, help="threads the engine uses (llama --threads)")
    ] = 1,
    bandwidth_gbs: Annotated[
        float | None, typer.Option("--bandwidth-gbs", help="memory bandwidth, instead of measuring")
    ] = None,
    gflops: Annotated[
        float | None, typer.Option("--gflops", help="FP32 GFLOP/s, instead of measuring")
    ] = None,
) -> None:
    """Measure this host's CPU (memory bandwidth, FP32 matmul rate at --threads) and write it
    as a device the simulator can run a CPU engine such as llama-server on."""
    from bench.sim.device_profile import host_device, write_device
    from bench.sim.profiles import ProfileError

    try:
        entry = host_device(name, threads, bandwidth_gbs, gflops)
        write_device(out, name, entry)
    except (RuntimeError, ProfileError, OSError) as exc:
        raise fail(str(exc)) from None
    console.print(f"{name}: {entry['source']}")
    # Said in words, not as a command: a printed `tokenbench ...` is one the user can run as is
    # (tests run every one), and this one needs the user's own run ids.
    console.print(
        f"wrote {out}: give it to sim calibrate as --device {out}, with the ids of the runs "
        "you measured on this host and --out for the profile it writes"
    )


def apply_profile(
    profile: Path | None,
    gpu: str | None,
    model: str | None,
    precision: str | None,
    engine: str | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    defaults: tuple[str, str, str, str],
) -> tuple[Any, dict[str, Any]]:
    """(the loaded profile or None, the deployment `sim run`/`sim serve` simulate): with a
    profile, its calibrated device, and what it was fitted on for anything not given; without
    one, the flags and then `defaults` (gpu, model, precision, engine)."""
    if profile is None:
        gpu_d, model_d, prec_d, eng_d = defaults
        return None, dict(
            gpu=gpu or gpu_d, model=model or model_d, precision=precision or prec_d,
            engine=engine or eng_d, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )  # fmt: skip
    from bench.sim.profiles import ProfileError
    from bench.sim.user_calibration import load_profile

    if gpu is not None:
        raise fail("give --profile or --gpu, not both: the profile is the device it describes")
    try:
        prof = load_profile(profile)
    except ProfileError as exc:
        raise fail(str(exc)) from None
    on = prof.settings
    return prof, dict(
        gpu=prof.calibrated_device(), model=model or on.model,
        precision=precision or on.precision, engine=engine or on.engine,
        max_num_seqs=max_num_seqs or on.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens or on.max_num_batched_tokens,
    )  # fmt: skip
