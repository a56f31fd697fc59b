"""Rich renderings of summaries for the terminal: one place, used by run, show and sweep."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich import table as rich_table
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement

if TYPE_CHECKING:
    from bench.executor import Progress
    from bench.metrics import Summary


class Table(rich_table.Table):
    """rich's Table, except that a row must have one cell per column.

    rich pads a short row with empty cells, which shifted a row's values one column left
    under the wrong headers ("TTFT from schedule" showed p99.9 under p99). Every console
    table in tokenbench is this one (tests/test_console_tables.py checks the imports), so a
    row that does not fit its header is an error in any test that prints it.
    """

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        if len(renderables) != len(self.columns):
            raise ValueError(
                f"table {self.title!r}: a row of {len(renderables)} cells under "
                f"{len(self.columns)} columns ({[c.header for c in self.columns]})"
            )
        super().add_row(*renderables, **kwargs)


class PipeSafeConsole(Console):
    """A Console whose tables are never cut when the output is not a terminal.

    Rich lays out piped output at 80 columns and squeezes wide tables with "…", which cut
    numbers and run ids. Piped, a table is printed at its natural width instead, and a line
    of text stays one line (a terminal still gets both fitted, and wrapped, to its width).
    """

    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [o for o in objects if isinstance(o, rich_table.Table)]
        if not self.is_terminal and not tables:
            kwargs.setdefault("soft_wrap", True)  # a line stays one line: ids are never split
        if self.is_terminal or not tables or "width" in kwargs:
            for table in tables:  # too narrow a terminal wraps a cell, never cuts it to "…"
                for column in table.columns:
                    if column.overflow == "ellipsis":
                        column.overflow = "fold"
            super().print(*objects, **kwargs)
            return
        wide = self.options.update_width(100_000)
        natural = max(Measurement.get(self, wide, t).maximum for t in tables)
        saved = self._width
        self.width = max(self.width, natural)
        try:
            super().print(*objects, **kwargs)
        finally:
            self._width = saved


console = PipeSafeConsole(stderr=False, highlight=False)
err_console = PipeSafeConsole(stderr=True, highlight=False)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _fmt_expected(curve, name: str, value: float | None, digits: int) -> str:
    """A figure, and on a simulated run its expected range beside it: "771.6 (686-867)"."""
    from bench.curves import with_range

    return with_range(value, curve.expected_span(name, value), lambda v: _fmt(v, digits))


def summary_tables(
    summary: Summary, *, title: str = "Results", metrics: tuple[str, ...] | None = None
) -> list[Table]:
    """The results table (counts, throughput) and the latency table (ms)."""
    from bench.metrics import LATENCY_LABELS, LATENCY_METRICS

    metrics = metrics or LATENCY_METRICS
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column("what")
    head.add_column("value", justify="right")
    head.add_row("Completed requests", f"{summary.completed:,}")
    head.add_row("Failed requests", f"{summary.failed:,}")
    if summary.cancelled:
        head.add_row("Cancelled requests", f"{summary.cancelled:,}")
    for kind, count in sorted(summary.errors.items()):
        head.add_row(f"  {kind}", f"{count:,}")
    head.add_row("Duration (s)", _fmt(summary.duration_s))
    head.add_row("Request throughput (req/s)", _fmt(summary.requests_per_s))
    head.add_row("Output token throughput (tok/s)", _fmt(summary.output_tokens_per_s, 1))
    head.add_row("Total token throughput (tok/s)", _fmt(summary.total_tokens_per_s, 1))
    if summary.goodput_requests_per_s is not None:
        head.add_row("Goodput (req/s)", _fmt(summary.goodput_requests_per_s))
    lag = summary.send_lag_ms
    head.add_row(
        "Send lag p50 / p99 / max (ms)",
        f"{_fmt(lag['p50'])} / {_fmt(lag['p99'])} / {_fmt(lag['max'])}",
    )
    wait = summary.slot_wait_ms
    if wait.get("max") is not None:
        head.add_row(
            "Wait for a concurrency slot p50 / p99 / max (ms)",
            f"{_fmt(wait['p50'])} / {_fmt(wait['p99'])} / {_fmt(wait['max'])}",
        )
    intended = summary.prompt_cache.get("intended")
    if intended and intended.get("share") is not None:
        head.add_row(
            "Prompt tokens the trace reuses (intended, infinite cache)", f"{intended['share']:.1%}"
        )
    usage = summary.prompt_cache.get("usage")
    if usage and usage.get("share") is not None:
        head.add_row("Prompt tokens served from cache (usage)", f"{usage['share']:.1%}")
    server = summary.prompt_cache.get("server")
    if server and server.get("share") is not None:
        head.add_row("Prompt tokens served from cache (server)", f"{server['share']:.1%}")
    for label, value in spec_decode_rows(summary.spec_decode):
        head.add_row(label, value)

    lat = Table(
        title="Latency (ms)",
        title_justify="left",
        caption="\\[brackets]: 95% interval of the percentile (order statistics); "
        "open = too few samples to bound it",
        caption_justify="left",
    )
    lat.add_column("metric")
    lat.add_column("n", justify="right")
    lat.add_column("mean", justify="right")
    lat.add_column("std", justify="right")
    keys = list(summary.metrics["ttft"].percentiles)
    for key in keys:
        lat.add_column(key, justify="right")
    thin: list[str] = []
    for m in metrics:
        stats = summary.metrics[m]
        conf = stats.confidence()
        lat.add_row(
            LATENCY_LABELS[m],
            f"{stats.count:,}",
            _fmt(stats.mean),
            _fmt(stats.std),
            *(percentile_cell(stats.percentiles.get(k), conf.get(k)) for k in keys),
        )
        thin += thin_tails(LATENCY_LABELS[m], conf, keys)
    if thin:
        lat.caption += f"\nthin tail (at or beyond the slowest request): {'; '.join(thin)}"
    queued = summary.ttft_from_intended
    lat.add_row(
        "TTFT from schedule",
        f"{queued.count:,}",
        _fmt(queued.mean),
        _fmt(queued.std),
        *(_fmt(queued.percentiles.get(k)) for k in keys),
    )
    return [head, lat]


def spec_decode_rows(spec: dict) -> list[tuple[str, str]]:
    """Speculative decoding as the server counted it (bench.telemetry.spec_decode), and the
    simulator's modelled figures beside it when the endpoint was simulated."""
    if not spec:
        return []
    sim = spec.get("simulated") or {}

    def beside(key: str, fmt: str) -> str:
        return f" (simulated model: {format(sim[key], fmt)})" if key in sim else ""

    rows = []
    if spec.get("acceptance_rate") is not None:
        rows.append(
            ("Draft acceptance rate (server counters)",
             f"{spec['acceptance_rate']:.1%}{beside('acceptance_rate', '.1%')}")
        )  # fmt: skip
    if spec.get("mean_acceptance_length") is not None:
        rows.append(
            ("Mean acceptance length (tokens per verify step)",
             f"{spec['mean_acceptance_length']:.2f}{beside('mean_acceptance_length', '.2f')}")
        )  # fmt: skip
    if spec.get("per_position"):
        shown = " / ".join(f"{x:.0%}" for x in spec["per_position"])
        if sim.get("per_position"):
            shown += f" (simulated model: {' / '.join(f'{x:.0%}' for x in sim['per_position'])})"
        rows.append(("Accepted per draft position", shown))
    return rows


def percentile_cell(value: float | None, interval) -> str:
    """'123.40' with its 95% interval below it: '[110.20, open]' (None ends are open)."""
    if not interval or value is None:
        return _fmt(value)
    lo, hi = ("open" if v is None else _fmt(v) for v in interval)
    return f"{_fmt(value)}\n[dim]\\[{lo}, {hi}][/dim]"


def thin_tails(name: str, confidence: dict, keys) -> list[str]:
    """'TTFT p99, p99.9 (n=80)': the percentiles with less than one sample above them."""
    from bench.metrics import is_thin

    n = confidence.get("count")
    if n is None:
        return []
    thin = [k for k in keys if k.startswith("p") and is_thin(n, float(k[1:]))]
    return [f"{name} {', '.join(thin)} (n={n})"] if thin else []


def classes_table(classes: dict[str, dict], slo=(), *, title: str = "Per traffic class") -> Table:
    """One row per traffic class from Summary.to_json()'s `classes`: its requests,
    throughput, P99s and, given the SLO (CLASS:NAME thresholds), whether it meets its own."""
    from bench.curves import class_verdict, point_from_summary

    t = Table(title=title, title_justify="left")
    cached = any(class_cache_cells(doc) != ("—",) * 3 for doc in classes.values())
    cols = ("class", "completed", "failed", "req/s", "out tok/s", "p50 TTFT ms", "p99 TTFT ms",
            "p99 TPOT ms", "own SLO")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "class" else "right")
    if cached:
        t.add_column("prompt cache hit\nintended / served / server", justify="right")
        t.caption = (
            "prompt cache hit: share of prompt tokens; intended = what the class's prompts "
            "imply with a cache that keeps every block; served = usage cached_tokens (the "
            "simulator's cache on a simulated run); server = its counters, only when one "
            "class alone sent the point's requests"
        )
        t.caption_justify = "left"
    whole = point_from_summary({"classes": classes}, load_point=0, title="", offered=None, gpus=1)
    for name, doc in classes.items():
        point = whole.classes[name]
        meets = class_verdict(whole, name, slo)
        verdict = "" if meets is None else "[green]meets[/]" if meets else "[red]breaks[/]"
        t.add_row(
            name,
            f"{point.completed:,}",
            f"{point.failed:,}",
            _fmt(point.requests_per_s),
            _fmt(point.output_tps, 1),
            _fmt(point.value("p50_ttft_ms"), 0),
            _fmt(point.value("p99_ttft_ms"), 0),
            _fmt(point.value("p99_tpot_ms"), 1),
            verdict,
            *([" / ".join(class_cache_cells(doc))] if cached else []),
        )
    return t


CACHE_SOURCES = ("intended", "usage", "server")  # Summary.prompt_cache's, in shown order


def class_cache_cells(doc: dict) -> tuple[str, ...]:
    """A summary JSON's prompt-cache hit rates, intended / served (usage) / server, as
    percentages ('—' where unknown)."""
    parts = doc.get("prompt_cache") or {}
    shares = ((parts.get(k) or {}).get("share") for k in CACHE_SOURCES)
    return tuple("—" if v is None else f"{v:.1%}" for v in shares)


def print_summary(summary: Summary, *, title: str = "Results", metrics=None, slo=()) -> None:
    for table in summary_tables(summary, title=title, metrics=metrics):
        console.print(table)
    if summary.classes:
        console.print(classes_table(summary.to_json()["classes"], slo))
    if summary.interrupted:
        console.print("[bold yellow]Interrupted: these figures cover only what ran.[/]")
    if summary.client_limited:
        console.print(
            "[bold red]CLIENT-LIMITED: the load generator itself limited this result.[/] "
            + escape("; ".join(summary.client_limited_reasons))
            + ". Lower the load, use --workers, or move the client to a bigger machine."
        )
    elif summary.self_check.startswith("not judged"):
        console.print(f"Self-check {escape(summary.self_check)}.")
    if summary.largely_cached:
        console.print(
            f"[bold yellow]CACHED PROMPTS: {summary.cached_share:.0%} of prompt tokens were "
            "answered from the server's prefix cache[/], so TTFT is a cached prefill's, not a "
            "full one's. Fresh prompts: leave --seed out (each run and load point then draws "
            "its own)."
        )
    for note in summary.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


def sweep_table(points, *, gpus: int = 1, title: str = "Sweep") -> Table:
    """One row per load point: offered load, achieved throughput per GPU and the P99s."""
    t = Table(title=title, title_justify="left")
    spec = any(p.summary.spec_decode for p in points)  # draft acceptance beside TPOT
    for col in ("#", "load", "role", "req/s", "out tok/s/GPU", "p99 TTFT ms", "p99 TPOT ms",
                *(("draft acc.", "accept len") if spec else ()),
                "p99 E2E ms", "tok/s/user", "errors", "SLO"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("load", "role") else "right")
    for p in points:
        s = p.summary
        tpot50 = s.metrics["tpot"].percentiles.get("p50")
        sd = s.spec_decode
        rate, length = sd.get("acceptance_rate"), sd.get("mean_acceptance_length")
        extra = (f"{rate:.1%}" if rate is not None else "—", _fmt(length)) if spec else ()
        t.add_row(
            str(p.index + 1),
            p.spec.title,
            p.role,
            _fmt(s.requests_per_s),
            _fmt(s.output_tokens_per_s / max(1, gpus), 0),
            _fmt(s.value("p99_ttft_ms"), 0),
            _fmt(s.value("p99_tpot_ms"), 1),
            *extra,
            _fmt(s.value("p99_e2el_ms"), 0),
            _fmt(1000 / tpot50 if tpot50 else None, 1),
            f"{s.failed:,}" if s.failed else "0",
            "[yellow]partial[/]"
            if s.interrupted
            else {True: "[green]meets[/]", False: "[red]breaks[/]", None: ""}[p.meets_slo],
        )
    return t


class TerminalDisplay:
    """A session's display (bench.session.Display) on the terminal: a progress bar per
    load point, warnings on stderr, each point's telemetry digest on stdout."""

    @contextmanager
    def point(self, title: str, total: int) -> Iterator[Callable[[Progress], None]]:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        bar = Bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}  in flight {task.fields[in_flight]}"),
            TextColumn("live p99 TTFT {task.fields[p99]}"),
            TimeElapsedColumn(),
        )
        task = bar.add_task(title, total=total, failed=0, in_flight=0, p99="—")

        def tick(p: Progress) -> None:
            p99 = p.live_p99_ttft_ms()
            bar.update(
                task,
                completed=p.completed + p.failed,
                failed=p.failed,
                in_flight=p.in_flight,
                p99="—" if p99 is None else f"{p99:,.0f} ms",
            )

        with bar:
            yield tick

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)

    def say(self, line: str) -> None:
        console.print(line, highlight=False)


def sweep_progress(point, remaining) -> None:
    """One console line per finished point: what was measured and what is left."""
    s = point.summary
    left = "" if remaining is None else f"  ({remaining} planned points left)"
    if s.interrupted:
        left += "  [bold yellow]interrupted: partial point, not used for the capacity or knee[/]"
    console.print(
        f"[bold]point {point.index + 1}[/] {point.spec.title}: {s.requests_per_s:.2f} req/s, "
        f"{s.output_tokens_per_s:,.0f} out tok/s, p99 TTFT {s.value('p99_ttft_ms') or 0:,.0f} ms, "
        f"p99 TPOT {s.value('p99_tpot_ms') or 0:,.1f} ms, failed {s.failed}{left}"
        + (f"  [yellow]CACHED PROMPTS {s.cached_share:.0%}[/]" if s.largely_cached else "")
    )


def cost_rows_table(rows, *, title: str) -> Table:
    """$/Mtok per pricing tier (output and total tokens) at one throughput; a price shows
    the decimals it has (bench.cost.price_decimals: $1.5456, not $1.55)."""
    from bench.cost import price_decimals

    t = Table(title=title, title_justify="left")
    for col in ("tier", "kind", "$/GPU-h", "$/Mtok output", "$/Mtok total"):
        t.add_column(col, justify="left" if col in ("tier", "kind") else "right")
    utilised = any(r.utilisation < 1 for r in rows)
    if utilised:
        t.add_column(f"$/Mtok output at {rows[0].utilisation:.0%} use", justify="right")
    for r in rows:
        price = r.price_usd_per_gpu_hr
        cells = [r.tier, r.kind, _fmt(price, price_decimals(price)), _fmt(r.output_usd_per_mtok, 3),
                 _fmt(r.total_usd_per_mtok, 3)]  # fmt: skip
        if utilised:
            cells.append(_fmt(r.output_usd_per_mtok_at_utilisation, 3))
        t.add_row(*cells)
    return t


def error_bars_table(basis: str, errors: dict[str, float], rows: list[tuple[str, str, dict]]):
    """Simulated points' figures with their expected error and their utilisation of the
    simulated saturation rate: `sim run` prints it after running, `show` for a stored run.
    rows: (number, load title, bench.sim.profiles.accuracy.point_error_bars)."""
    from bench.sim.profiles.accuracy import FIGURES

    table = Table(title=f"Expected error of the simulated figures ({basis})")
    table.add_column("#")
    table.add_column("load")
    for label, _, q in FIGURES:
        table.add_column(f"{label} ±{errors[q]:.0%}" if q in errors else label)
    table.add_column("utilisation")
    for number, title, bars in rows:
        cells = [f"{bars[q]['value']:,.1f}" if q in bars else "-" for _, _, q in FIGURES]
        util = bars.get("utilisation")
        flag = " [yellow]near saturation[/yellow]" if bars.get("near_saturation") else ""
        table.add_row(number, title, *cells, f"{util:.0%}{flag}" if util is not None else "-")
    return table


def near_saturation_note(sat: float | None) -> str:
    """What a "near saturation" flag means, under the error-bars table."""
    from bench.sim.profiles.accuracy import NEAR_SATURATION

    top = f" of {sat:.3g} req/s" if sat else ""
    return (
        f"[yellow]near saturation[/yellow] (at {NEAR_SATURATION:.0%} or more of the simulated "
        f"maximum{top}): latency there moves by far more than the stated error for a few per "
        "cent of load"
    )


def comparison_tables(comparisons, utilisation: float = 1.0) -> list[Table]:
    """`tokenbench compare`: capacity, P99s at matched load, and $/Mtok per tier; a simulated
    run's figures carry their expected range (RunCurve.expected_span)."""
    from bench.cost import cost_error_name

    head = Table(title="Comparison", title_justify="left")
    head.add_column("")
    for c in comparisons:
        head.add_column(c.curve.legend, justify="right")

    def row(name, fn):
        head.add_row(name, *(fn(c) for c in comparisons))

    row("run", lambda c: c.curve.run_id[:8])
    row("GPU", lambda c: f"{c.curve.gpu_type or '?'} x{c.curve.gpu_count}")
    row("model", lambda c: c.curve.model or "?")
    row(
        "measured or simulated",
        lambda c: (
            "simulated"
            if c.curve.simulated
            else (f"imported ({c.curve.imported_from})" if c.curve.imported_from else "measured")
        ),
    )
    row("load points", lambda c: str(len(c.curve.points)))
    row("basis", lambda c: c.basis + ("" if c.capacity else ": none met"))
    row("capacity", lambda c: c.at_slo.text("tok/s/GPU") if c.at_slo else "—")
    row(
        "bracket (last pass / first fail)",
        lambda c: " / ".join(
            "—" if p is None else p.title
            for p in ((c.at_slo.last_pass, c.at_slo.first_fail) if c.at_slo else (None, None))
        ),
    )
    row("decided by", lambda c: (c.at_slo.deciding or "—") if c.at_slo else "—")
    row(
        "capacity req/s per GPU",
        lambda c: _fmt(c.capacity.requests_per_s / c.curve.gpu_count if c.capacity else None),
    )
    row(
        "capacity out tok/s per GPU",
        lambda c: _fmt(c.capacity.output_tps_per_gpu if c.capacity else None, 0),
    )
    for metric in ("ttft", "tpot", "e2el"):
        row(
            f"p99 {metric.upper()} ms at capacity",
            lambda c, m=metric: _fmt_expected(
                c.curve, f"p99_{m}_ms", c.capacity.latency(m) if c.capacity else None, 1
            ),
        )
    row(
        "matched load (out tok/s per GPU)",
        lambda c: _fmt(c.at_matched_load.output_tps_per_gpu if c.at_matched_load else None, 0),
    )
    for metric in ("ttft", "tpot"):
        row(
            f"p99 {metric.upper()} ms at matched load",
            lambda c, m=metric: _fmt_expected(
                c.curve,
                f"p99_{m}_ms",
                c.at_matched_load.latency(m) if c.at_matched_load else None,
                1,
            ),
        )
    tables = [head]

    simulated = any(c.curve.simulated for c in comparisons)
    cost = Table(
        title=f"$/Mtok output tokens at the basis point ({utilisation:.0%} utilisation)"
        + ("; a simulated run's range is its throughput's expected error" if simulated else ""),
        title_justify="left",
    )
    cost.add_column("tier")
    for c in comparisons:
        cost.add_column(c.curve.legend, justify="right")
    tiers: list[str] = []
    for c in comparisons:
        tiers += [r.tier for r in c.cost_rows if r.tier not in tiers]
    for tier in tiers:
        cells = []
        for c in comparisons:
            match = next((r for r in c.cost_rows if r.tier == tier), None)
            usd = match.output_usd_per_mtok_at_utilisation if match else None
            cells.append(_fmt_expected(c.curve, cost_error_name("output"), usd, 3))
        cost.add_row(tier, *cells)
    if tiers:
        tables.append(cost)
    return tables


def outcome(records, summary: Summary, model: str | None, served_models: list[str]) -> dict:
    """What went wrong, in words a user can act on: the first failure with the server's own
    message, and a model name the server did not answer with. Also kept in --summary-json
    and the stored run (issue 15)."""
    failed = [r for r in records if r.state == "failed"]
    first = min(failed, key=_ended, default=None)
    out: dict = {
        "served_models": list(served_models),
        "first_failure": None,
        # requests resent once after a kept-alive connection turned out closed (records'
        # `retries`): not failures, but a server that drops idle connections says so here
        "resent": sum(1 for r in records if r.retries),
    }
    if first is not None:
        ok = [r for r in records if r.state == "ok"]
        out["first_failure"] = {
            "error_kind": first.error_kind,
            "http_status": first.http_status,
            "message": (first.error_message or "")[:500],
            # how many requests had succeeded when it came, and whether any did after it:
            # none after is a server that went away mid-run, not a few bad requests
            "succeeded_before": sum(1 for r in ok if _ended(r) <= _ended(first)),
            "succeeded_after": sum(1 for r in ok if _ended(r) > _ended(first)),
        }
    if model and served_models and model not in served_models:
        out["model_warning"] = (
            f"asked for model {model!r}, the server answered as {', '.join(served_models)!r}"
        )
    return out


def _ended(record) -> float:
    """When a request ended (or, never answered, was sent), for ordering failures in time."""
    for t in (record.end_ns, record.sent_ns, record.intended_ns):
        if t is not None and t == t:  # not None, not NaN
            return float(t)
    return 0.0


def failure_line(first: dict, failed: int, total: int) -> str:
    """One line on a run's failures: how many succeeded before the first, and what it said.
    When none succeeded after it, the server stopped answering, and the line says so."""
    kind, before = first["error_kind"], first.get("succeeded_before", 0)
    said = f": {first['message']}" if first.get("message") else ""
    if failed and not first.get("succeeded_after") and before:
        return (
            f"The server stopped answering after {before:,} requests succeeded: {failed:,} "
            f"of {total:,} failed, the first ({kind}){said}"
        )
    return (
        f"First failure ({kind}; {failed:,} of {total:,} failed, after {before:,} succeeded){said}"
    )


def print_outcome(out: dict, summary: Summary) -> None:
    from rich.markup import escape

    first = out.get("first_failure")
    if first is not None:
        line = failure_line(first, summary.failed, summary.completed + summary.failed)
        err_console.print(f"[bold red]{escape(line)}[/]", soft_wrap=True, highlight=False)
    if out.get("resent"):
        err_console.print(
            f"note: {out['resent']:,} requests were resent once on a new connection: the "
            "server had closed the kept-alive one before they reached it (not failures)"
        )
    if out.get("model_warning"):
        err_console.print(f"[yellow]warning:[/] {escape(out['model_warning'])}")
    if summary.completed == 0 and summary.failed:
        err_console.print("[bold red]No request succeeded.[/]")
