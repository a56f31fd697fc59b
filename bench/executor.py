"""The Executor seam: whatever turns a RunPlan into RequestRecords.

The local runner (bench.runner.LocalExecutor), the plan split over processes or Ray workers
(bench.distributed.DistributedExecutor) and the virtual-time simulator
(bench.sim.virtual.VirtualExecutor). RunSession and Sweep are written once over it, so each
gets warm-up, telemetry, the self-check, SLO search, stop rules, Ctrl-C and the fallback file
from the same code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bench.records import RequestRecord
    from bench.runner import Progress, RunPlan, RunResult


@dataclass
class StoredAs:
    """What a stored run says about where its records came from, beyond the plan."""

    extra: dict = field(default_factory=dict)  # kept in the run's `extra`
    # The simulated hardware (bench.sim.detect's {gpu, gpu_count, ...}): the run is stored
    # simulated, on these GPUs. None: ask the endpoint whether it is a simulator.
    sim: dict | None = None
    endpoint: str | None = None  # instead of the plan's base URL (virtual time has none)
    backend: str | None = None  # instead of the plan's dialect
    scrapes: bool = True  # there is a server whose /metrics telemetry can scrape
    exact_lengths: bool = False  # requests are token counts, not rendered text (virtual time)


class Executor(Protocol):
    """Runs one load point's plan to its end and returns what it measured.

    `sink` gets every record as it is finished (the session stores it); setting `stop`
    (from any thread) stops the point gently, keeping what was measured, as Ctrl-C does;
    `on_tick` sees live counters a few times a second.
    """

    def run(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None],
        stop: threading.Event | None = None,
        on_tick: Callable[[Progress], None] | None = None,
    ) -> RunResult: ...

    def stored_as(self) -> StoredAs: ...
