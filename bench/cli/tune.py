"""`tokenbench tune EXPERIMENT.yaml`: launch an engine at every combination of its settings,
measure each, store one run per combination, and name the best at the SLO (bench.tune)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.common import fail
from bench.cli.options import DbOpt
from bench.console import console, err_console, sweep_progress


def tune_command(
    experiment: Annotated[
        Path,
        typer.Argument(help="Experiment file: launch, health, params, sweep and scenario keys"),
    ],
    db: DbOpt = None,
    log_dir: Annotated[
        Path | None,
        typer.Option("--log-dir", help="Where each engine's log goes (default: results/tune-logs)"),
    ] = None,
    binary: Annotated[
        str | None, typer.Option("--binary", help="The engine's executable (launch.binary)")
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", help="NAME=VALUE: a fixed engine setting (launch.args), repeatable"),
    ] = None,
    rank_only: Annotated[
        bool, typer.Option("--rank-only", help="Launch nothing: rank what is stored")
    ] = False,
) -> None:
    """Tune the engine: measure every combination of its settings, resumably, and rank them."""
    from bench.console import TerminalDisplay
    from bench.runner import interrupted_exit_code, note_stop
    from bench.store import StoreError
    from bench.tune import ExperimentError, load_experiment, rank, run_experiment

    try:
        exp = load_experiment(experiment, binary=binary, args=_settings(arg or []))
    except ExperimentError as exc:
        raise fail(str(exc)) from None
    stop = threading.Event()

    def on_term(signum: int, _frame: object) -> None:  # stop like Ctrl-C: engine stopped
        note_stop(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    interrupted = False
    try:
        if not rank_only:
            outcome = run_experiment(
                exp, db=db, display=TerminalDisplay(), stop_event=stop,
                log_dir=log_dir or Path("results") / "tune-logs", on_point=sweep_progress,
            )  # fmt: skip
            interrupted = outcome.interrupted
            console.print(
                f"{len(outcome.measured)} measured, {len(outcome.skipped)} stored before, "
                f"{len(outcome.failed)} failed"
            )
        print_ranking(rank(exp, db))
    except KeyboardInterrupt:
        note_stop(int(signal.SIGINT))
        interrupted = True
        err_console.print("[bold yellow]interrupted[/]: the engine was stopped; rerun to resume")
    except (StoreError, ValueError) as exc:  # the database, or a scenario that cannot run
        raise fail(str(exc)) from None
    if interrupted:
        raise typer.Exit(interrupted_exit_code())


def _settings(pairs: list[str]) -> dict:
    """--arg NAME=VALUE pairs; each value read as YAML reads it (2 is a number, true a switch)."""
    import yaml

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise fail(f"--arg {pair!r}: give NAME=VALUE, e.g. --arg model=/models/m.gguf")
        out[name] = yaml.safe_load(value) if value else ""
    return out


def print_ranking(ranking) -> None:
    from bench.console import Table
    from bench.metrics import slo_text
    from bench.tune import settings_text

    basis = f"capacity at {slo_text(ranking.slo)}" if ranking.slo else "peak throughput (no SLO)"
    table = Table(title=f"Settings ranked by {basis}")
    for column in ("#", "settings", "output capacity", "run", "engine"):
        table.add_column(column)
    for i, r in enumerate(ranking.ranked, 1):
        table.add_row(
            str(i), settings_text(r.settings), r.capacity.text("tok/s per GPU"), r.run_id[:8],
            r.engine_version or "",
        )  # fmt: skip
    console.print(table)
    for settings, error in ranking.failed:
        console.print(f"[red]failed[/] {settings_text(settings)}: {error}", highlight=False)
    verdict = ranking.verdict()
    if verdict:
        console.print(f"[bold green]{verdict}[/]", highlight=False)
    if len(ranking.ranked) >= 2:
        top = " ".join(r.run_id[:8] for r in ranking.ranked[:2])
        console.print(f"Side by side: tokenbench compare {top}", highlight=False)
