"""One stored benchmark run: an executor's records stored, summarised and annotated.

`tokenbench run` is a session of one load point, a sweep is a session of many; every caller
starts it through bench.drive.measure, so a run is stored and summarised the same way
whoever started it. The session only measures: what it shows goes to the Display its caller
gives it (the terminal's, or a service job's relay), and what the endpoint is (a simulator?)
is found by the caller. If the database fails mid-run the measuring goes on (records are
also kept in memory) and at the end every record is written to a JSON-lines file whose name
the error gives: nothing measured is lost.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

from bench.executor import Executor, Progress, RunPlan, RunResult, warmup_plan
from bench.metrics import Columns, Summary, parse_goodput, summarize
from bench.records import RequestRecord
from bench.runner import LocalExecutor
from bench.store import StoreError
from bench.telemetry import (
    Recording,
    TelemetryConfig,
    digest,
    prompt_cache,
    recording_frame,
    save_recording,
    spec_decode,
    start_scraper,
)
from bench.workload import MixedWorkload

TickFn = Callable[[Progress], None]  # sees a point's live counters a few times a second
log = logging.getLogger("tokenbench.telemetry")


class Display(Protocol):
    """What a session shows while it measures, given to it by whoever started the run (the
    CLI's terminal, a service job's relay): the session itself only measures and stores."""

    def point(self, title: str, total: int) -> AbstractContextManager[TickFn | None]:
        """Around one load point of `total` requests: the callback that sees its live
        counters a few times a second (None: nobody watches)."""
        ...

    def warn(self, message: str) -> None:
        """A problem that does not stop the run (telemetry that cannot be read)."""
        ...

    def say(self, line: str) -> None:
        """A line worth reading after a point (its telemetry digest)."""
        ...


class Headless:
    """A Display with no terminal: live counters go to `on_tick` (a service job relays
    them), warnings to the tokenbench.telemetry logger, lines nowhere."""

    def __init__(self, on_tick: TickFn | None = None) -> None:
        self.on_tick = on_tick

    def point(self, title: str, total: int) -> AbstractContextManager[TickFn | None]:
        return nullcontext(self.on_tick)

    def warn(self, message: str) -> None:
        log.warning(message)

    def say(self, line: str) -> None:
        pass


def window_summary(
    result: RunResult, scenario, *, warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> Summary:
    """Summary of one load point with warm-up and cool-down (by intended send time) left out."""
    cols = Columns.from_records(result.records).measured(warmup_s, cooldown_s)
    return summarize(
        cols,
        percentiles=scenario.percentiles,
        goodput=parse_goodput(scenario.goodput),
        loop_lag_p99_ms=result.loop_lag_p99_ms,
        loop_cpu_share=result.loop_cpu_share,
        loop_cpu_wait_share=result.loop_cpu_wait_share,
        late_read_share=result.late_read_share,
        merged_token_share=result.merged_token_share,
        interrupted=result.interrupted,
        closed_loop=scenario.load.shape == "closed",
    )


def prompts_info(scenario, plan: RunPlan, exact: bool = False) -> dict:
    """What the stored run keeps about its prompts: the seed actually used (so a run with
    fresh prompts can be replayed with --seed), and whether their lengths were exact."""
    workload = plan.workload
    return {
        "seed": scenario.run_seed(),
        "seed_fixed": scenario.seed_fixed,
        "fresh_per_load_point": not scenario.seed_fixed,
        "tokenizer": getattr(workload, "tokenizer_path", None),
        "lengths": prompt_lengths(plan, exact),
    }


def prompt_lengths(plan: RunPlan, exact: bool = False) -> str:
    """'exact' (rendered with a tokenizer, or token ids, or simulated as token counts),
    'dataset', or 'approximate'."""
    workload = plan.workload
    if workload.dataset is not None:
        return "dataset"
    if (
        exact
        or workload.prompt_format == "token_ids"
        or getattr(workload, "tokenizer", None) is not None
    ):
        return "exact"
    return "approximate"


def with_simulated_mtp(spec: dict, sim: dict | None) -> dict:
    """The measured spec-decode figures, and for a simulated endpoint with MTP on what its
    model assumed for d draft tokens: per-position acceptance p_i (stored with the run; a^i for
    a run stored with one acceptance a), acceptance rate (p_1 + ... + p_d) / d and mean
    acceptance length 1 + p_1 + ... + p_d, so the counters can be checked against the model
    that produced them."""
    d = int((sim or {}).get("mtp_tokens") or 0)
    a = (sim or {}).get("mtp_acceptance")
    if not d or a is None:
        return spec
    per_position = (sim or {}).get("mtp_per_position") or [a ** (i + 1) for i in range(d)]
    gained = sum(per_position)
    return {
        **spec,
        "simulated": {
            "mtp_tokens": d,
            "mtp_acceptance": a,
            "per_position": list(per_position),
            "acceptance_rate": gained / d,
            "mean_acceptance_length": 1.0 + gained,
        },
    }


def annotate(
    summary: Summary, scenario, plan: RunPlan, server_cache: dict | None, exact: bool = False
) -> None:
    """Add what the reader must know to read this point's figures right: the server's own
    prompt-cache counters, a fixed seed, approximate prompt lengths."""
    if server_cache is not None:
        summary.prompt_cache["server"] = server_cache
        if len(summary.classes) == 1:  # the server's counters are one class's only then
            next(iter(summary.classes.values())).prompt_cache["server"] = server_cache
    blocks = getattr(plan.workload, "blocks", None)
    if blocks is not None:  # a block-hashed trace: the reuse it implies, beside the above
        summary.prompt_cache["intended"] = blocks.intended_reuse(len(plan.specs))
    elif isinstance(plan.workload, MixedWorkload) and summary.classes:
        # a mix of traffic classes: the reuse its prompts imply, for it and for each class
        chat = plan.endpoint.endswith("chat/completions")
        intended = plan.workload.intended_reuse(plan.specs, chat)
        if "" in intended:
            summary.prompt_cache["intended"] = intended.pop("")
        for name, part in intended.items():
            if name in summary.classes:
                summary.classes[name].prompt_cache["intended"] = part
    if scenario.seed_fixed:
        summary.notes.append(
            f"--seed {scenario.seed} is fixed: this run sends the same prompts as every run "
            "with that seed (and every load point of a sweep the same ones), which a server's "
            "prefix cache can answer; leave --seed out for fresh prompts"
        )
    if prompt_lengths(plan, exact) == "approximate" and summary.completed:
        mean = summary.total_input_tokens / summary.completed
        told = f" (the server counted {mean:,.1f} prompt tokens per request)" if mean else ""
        summary.notes.append(
            "prompt lengths are approximate: without --tokenizer, synthetic prompts are common "
            f"words of about one token each{told}; give --tokenizer PATH for exact lengths"
        )


class RunSession:
    """A run in the database (or not, with store=False) that load points are added to.

    Each point's records come from `executor` (bench.executor: local by default, or
    distributed, or virtual time); everything else is done here, the same for each.
    What it shows goes to `display` (Headless by default); `hardware` is what the caller
    found the endpoint to be (bench.sim.detect: a simulator's GPUs, stored as simulated on
    them), the session probes nothing itself. `stop_event` stops the current point like
    Ctrl-C does (the service's jobs set it from another thread).
    `telemetry` scrapes the server's /metrics (and GPU power) around each point
    (bench.telemetry); None scrapes nothing. `run_id` names the stored run in advance (the
    service's jobs: a run being written can then never be deleted); `extra` is stored with
    the run (where it was measured). The caller's scenario is never changed: `scenario`
    is the session's own copy, saying what was run (the simulated GPUs, when they are).
    """

    def __init__(
        self,
        scenario,
        plan: RunPlan,
        *,
        executor: Executor | None = None,
        db_url: str | None = None,
        store: bool = True,
        simulated: bool = False,
        hardware: dict | None = None,
        display: Display | None = None,
        extra: dict | None = None,
        stop_event: threading.Event | None = None,
        telemetry: TelemetryConfig | None = None,
        run_id: str | None = None,
    ) -> None:
        self.executor = executor or LocalExecutor()
        where = self.executor.stored_as()
        # the run's seed is drawn (plan_from_scenario did) before this copy, which keeps it
        scenario = scenario.model_copy(deep=True)
        self.scenario = scenario
        self.telemetry = telemetry if where.scrapes else None
        self.telemetry_warnings: list[str] = []
        self.display = display or Headless()
        self.stop_event = stop_event
        self.errors: list[StoreError] = []
        self.kept: list[RequestRecord] = []
        self.load_points: list[dict] = []  # what the fallback file needs to rebuild the run
        self.exact_lengths = where.exact_lengths
        extra = {
            **(extra or {}),
            **where.extra,
            "prompts": prompts_info(scenario, plan, where.exact_lengths),
        }
        hw = where.sim or hardware
        if hw is not None:  # stored simulated, on its GPUs
            simulated = True
            extra["sim"] = hw
            # whoever prices and labels from the session's scenario reads what was run
            scenario.gpu.type = hw.get("gpu") or scenario.gpu.type
            scenario.gpu.count = hw.get("gpu_count") or scenario.gpu.count
        self.simulated = simulated
        self.meta = {
            "name": scenario.name,
            "label": scenario.label,
            "scenario": scenario.model_dump(mode="json"),
            "endpoint": where.endpoint or plan.base_url,
            "backend": where.backend or plan.dialect.name,
            "model": plan.model or (hw or {}).get("model") or "",
            "gpu_type": scenario.gpu.type,
            "gpu_count": scenario.gpu.count,
            "simulated": simulated,
            "extra": extra,
        }
        self.secrets = [plan.api_key]
        self.writer = None
        if store:
            from bench.store import RunWriter

            self.writer = RunWriter(
                db_url or None, **self.meta, secrets=self.secrets, run_id=run_id
            )

    @property
    def run_id(self) -> str | None:
        return self.writer.run_id if self.writer else None

    def _sink(self, rec: RequestRecord) -> None:
        self.kept.append(rec)
        if self.errors or self.writer is None:
            return
        try:
            self.writer.submit(rec)
        except StoreError as exc:
            self.errors.append(exc)

    def point(
        self,
        plan: RunPlan,
        *,
        title: str | None = None,
        mode: str | None = None,
        target_rate: float | None = None,
        concurrency: int | None = None,
        warmup_s: float = 0.0,
        cooldown_s: float = 0.0,
        params: dict | None = None,
    ) -> tuple[RunResult, Summary]:
        """Run one load point to its end, store it, and summarise its measured window."""
        point = dict(label=title, mode=mode, target_rate=target_rate, concurrency=concurrency,
                     warmup_s=warmup_s, cooldown_s=cooldown_s, params=params)  # fmt: skip
        point_meta = {"load_point": plan.load_point, **point}
        self.load_points.append(point_meta)  # what the fallback file needs
        if self.writer is not None:
            self.writer.start_load_point(plan.load_point, **point)
        warmups = self._warm_up(plan)
        recording = None
        if warmups is not None and (warmups.interrupted or self._stopped()):
            result = RunResult([], 0.0, 0.0, 0.0, interrupted=True, t0_ns=0)  # nothing measured
        else:
            scraper = None
            if self.telemetry is not None:  # scraped on the records' clock, around the point
                scraper = start_scraper(self.telemetry, plan.base_url, self._telemetry_warning)
            try:
                result = self._execute(plan, title or self.scenario.name)
            finally:
                recording = scraper.stop() if scraper is not None else None
        summary = window_summary(result, self.scenario, warmup_s=warmup_s, cooldown_s=cooldown_s)
        if warmups is not None:
            summary.warmups = warmup_counts(warmups)
        server_cache = None
        point_meta["ended_ns"] = int(result.duration_s * 1e9)
        if recording is not None:
            if recording.scrapes:  # (a frame costs pandas' import: none without samples)
                frame = recording_frame(recording, result.t0_ns)
                server_cache = prompt_cache(frame)
                spec = spec_decode(frame)
                if spec is not None:
                    summary.spec_decode = with_simulated_mtp(spec, self.meta["extra"].get("sim"))
            self.keep_telemetry(plan.load_point, recording, result.t0_ns, result.duration_s)
        annotate(summary, self.scenario, plan, server_cache, self.exact_lengths)
        if self.writer is not None:
            self.writer.end_load_point(
                plan.load_point,
                ended_ns=int(result.duration_s * 1e9),
                summary_json={**summary.to_json(), **result.detail_json()},
            )
        return result, summary

    def _stopped(self) -> bool:
        return self.stop_event is not None and self.stop_event.is_set()

    def _warm_up(self, plan: RunPlan) -> RunResult | None:
        """vLLM's --num-warmups: requests sent before the point and waited for, through the
        point's own executor (so they are simulated, or dealt to the workers, as the point
        is), and then forgotten: no record of them is stored or summarised."""
        warm = warmup_plan(plan)
        if warm is None:
            return None
        result = self.executor.run(warm, _discard, self.stop_event, None)
        counts = warmup_counts(result)
        self.display.say(
            f"Warm-up: {counts['sent']} requests sent before the point, {counts['completed']} "
            "completed; left out of every figure and not stored"
        )
        return result

    def _execute(self, plan: RunPlan, title: str) -> RunResult:
        """The executor's run, its live counters shown by the display. Each record gets its
        request's traffic class here, once for every executor, before it is stored."""
        classes = {s.index: s.traffic_class for s in plan.specs if s.traffic_class is not None}
        sink = self._sink
        if classes:

            def sink(rec: RequestRecord) -> None:
                rec.traffic_class = classes.get(rec.index)
                self._sink(rec)

        with self.display.point(title, len(plan.specs)) as tick:
            result = self.executor.run(plan, sink, self.stop_event, tick)
        for rec in result.records if classes else ():  # the executor's own copies, if any
            rec.traffic_class = classes.get(rec.index)
        return result

    def _telemetry_warning(self, message: str) -> None:
        """Each distinct telemetry problem is said once per session, never fails the run."""
        if message in self.telemetry_warnings:
            return
        self.telemetry_warnings.append(message)
        self.display.warn(message)

    def keep_telemetry(
        self, load_point: int, recording: Recording, t0_ns: int, duration_s: float
    ) -> None:
        """Store the point's samples (and why some are missing) and show a one-line digest.

        `t0_ns` is the point's start on the records' perf_counter clock (RunResult.t0_ns).
        """
        if self.writer is not None and (recording.scrapes or recording.warnings):
            try:
                save_recording(recording, self.writer.run_id, load_point, t0_ns, self.writer.engine)
            except Exception as exc:  # noqa: BLE001 - telemetry never fails a run
                self._telemetry_warning(f"telemetry of load point {load_point} not stored: {exc}")
        line = digest(recording, t0_ns, duration_s)
        if line:
            self.display.say(line)

    def finish(
        self, status: str, summary: Summary | None = None, extra: dict | None = None
    ) -> None:
        """Flush and close the run; raise StoreError naming the fallback file if data could
        not be written to the database."""
        if self.writer is not None:
            payload = summary.to_json() if summary is not None else None
            if payload is not None and extra:
                payload = {**payload, **extra}
            try:
                self.writer.finish(status, payload)
            except StoreError as exc:
                self.errors.append(exc)
        if self.errors:
            path = save_fallback(self, status)
            written = self.writer.written if self.writer is not None else 0
            missing = len(self.kept) - written
            raise StoreError(
                f"{getattr(self.errors[0], 'reason', self.errors[0])}; {missing} of the {len(self.kept)} "
                f"records measured are not in the database. Every one was saved to {path}: "
                f"`tokenbench import {path}` loads them into a database that works"
            )


def _discard(_record: RequestRecord) -> None:
    """The sink of warm-up requests: nothing of them is kept."""


def warmup_counts(result: RunResult) -> dict[str, int]:
    """What a point keeps of its warm-up: how many were sent and how many completed."""
    return {"sent": len(result.records), "completed": sum(1 for r in result.records if r.ok)}


FALLBACK_HEADER = "tokenbench_unsaved"


def save_fallback(session: RunSession, status: str) -> str:
    """Write the run's records as JSON lines when the database cannot take them.

    The first line describes the run (scenario, target, load points, status) so that
    `tokenbench import FILE` rebuilds it; secrets are scrubbed as the store would.
    """
    from bench.store import Redactor, strip_url

    redact = Redactor(session.secrets)
    run_id = session.run_id or "unstored"
    meta = dict(session.meta)
    meta["scenario"] = redact.structure(meta["scenario"])
    meta["endpoint"] = strip_url(meta["endpoint"])
    header = {
        FALLBACK_HEADER: 1,
        "run_id": run_id,
        "status": status,
        "run": meta,
        "load_points": session.load_points,
    }
    out = Path(tempfile.gettempdir()) / f"tokenbench-unsaved-{run_id}.jsonl"
    with out.open("w") as f:
        f.write(json.dumps(header, default=str) + "\n")
        for r in session.kept:
            row = {k: getattr(r, k) for k in r.__slots__ if k != "chunk_times_ns"}
            if row.get("error_message"):
                row["error_message"] = redact(str(row["error_message"]))
            row["chunk_times_ns"] = r.chunk_times_ns.tolist()
            f.write(json.dumps(row, default=int) + "\n")
    return str(out)
