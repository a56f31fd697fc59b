"""The `tokenbench` command: each sub-command is a thin shell over a library call.

One module per command group (run, sweep, compare, plan, prices, store, export, sim, demo,
serve), with the helpers and options they share in common.py and options.py; this file is
the one place that builds `app` and registers every command on it.

Flag names follow `vllm bench serve` where one exists, so users can carry their commands over
(bench/vllm_compat.py: several values after one flag, vLLM flags we name differently).
Imports are lazy: `tokenbench --help` must not pay for numpy, pandas, SQLAlchemy or plotly,
so each command imports what it runs inside its function.

Layering (DESIGN.md): the CLI imports everything and nothing outside bench/cli imports it.
"""

from __future__ import annotations

import typer

from bench.cli import (
    compare,
    demo,
    export,
    kinds,
    plan,
    prices,
    run,
    serve,
    sim,
    sim_calibrate,
    sim_tune,
    store,
    sweep,
    synth,
    tune,
)
from bench.vllm_compat import VllmCommand

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "Benchmark LLM inference endpoints: TTFT, TPOT, ITL, P99 under bursty load, $/Mtok. "
        "Runs are stored in $TOKENBENCH_DB (a SQLAlchemy URL or SQLite path) when it is set, "
        "else in results/tokenbench.db under the current folder; --db overrides both."
    ),
    pretty_exceptions_enable=False,
    # Plain help: rich's tables cut flag names and URLs at 80 columns ("--random-input-l…").
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """tokenbench: measure what an LLM deployment costs and how it feels to its users."""


app.command("run", cls=VllmCommand, short_help="One load point (like vllm bench serve).")(
    run.run_command
)
app.command("sweep", cls=VllmCommand, short_help="Many load points: a latency curve.")(
    sweep.sweep_command
)
app.command("tune", short_help="Launch an engine per setting combination; rank them.")(
    tune.tune_command
)
app.command(
    "prices",
    help="List the GPU pricing catalogue ($/GPU-hour per tier, with sources).",
    short_help="GPU prices per tier, with sources.",
)(prices.prices_command)
app.command("compare", short_help="Runs side by side: capacity, P99s, $/Mtok.")(
    compare.compare_command
)
app.command(
    "plan",
    help="GPUs, nodes, $/month and $/Mtok per tier for a demand at the SLO.",
    short_help="GPUs and $/month to serve a demand at the SLO.",
)(plan.plan_command)

app.command("runs", help="List stored runs.")(store.runs_command)
app.command("show", help="Print a stored run's summary.")(store.show_command)
app.command("rm", help="Delete a stored run.")(store.rm_command)
app.command("export-raw", help="Write a run's requests as json, csv or parquet.")(
    store.export_raw_command
)
app.command("import", help="Import vLLM, guidellm or aiperf result files as runs.")(
    store.import_command
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
db_app.command("upgrade", help="Apply schema migrations.")(store.db_upgrade_command)
app.add_typer(db_app, name="db")

sim_app = typer.Typer(
    help="The simulated GPU endpoint (results are simulated).", no_args_is_help=True
)
sim_app.command("serve", short_help="An OpenAI-compatible simulated endpoint.")(sim.serve)
sim_app.command("run", short_help="A scenario in virtual time, stored.")(sim.run)
sim_app.command("tune", short_help="The cheapest simulated configuration at an SLO.")(
    sim_tune.sim_tune
)
sim_app.command("gpus", short_help="GPU profiles and efficiency sources.")(sim.gpus)
sim_app.command("models", short_help="Model profiles: weights and KV sizes.")(sim.models)
sim_app.command("calibrate", short_help="Fit the simulator to measured runs.")(
    sim_calibrate.calibrate_command
)
sim_app.command("check", short_help="Predict measured runs with a calibration profile.")(
    sim_calibrate.check_command
)
sim_app.command("device", short_help="Measure this host's CPU as a device.")(
    sim_calibrate.device_command
)
app.add_typer(sim_app, name="sim", help="The simulated GPU endpoint (no GPU needed).")

app.command("synth-trace", short_help="A synthetic multi-turn trace in Mooncake's format.")(
    synth.synth_trace_command
)
app.command("demo", short_help="B200 beside H100, simulated (about 40 s).")(demo.demo_command)
app.command("export", help=f"Export runs as {export.EXPORT_FORMATS.help()}.")(export.export_command)
app.command(
    "kinds",
    short_help="Load shapes, datasets, dialects, export formats, telemetry sources.",
)(kinds.kinds_command)
app.command("serve", help="Serve the REST API and the dashboard (B200 beside H100).")(
    serve.serve_command
)


def main() -> None:  # pragma: no cover - console entry point
    app()


__all__ = ["app", "main"]
