"""Helpers shared by tests (and benchmarks): no fixtures here, plain functions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class CpuPressure:
    """Share of wall time during a block in which some task waited for a CPU (Linux PSI).

    A timing test on a shared 2-core machine may find the machine starved: then the client
    really was late (and should say so), and the kernel itself may stamp packets late. Tests
    use this to tell "our timing is wrong" from "the machine was too busy to time anything".
    `share` stays None where the kernel has no /proc/pressure/cpu.
    """

    STARVED = 0.5

    def __init__(self) -> None:
        self.share: float | None = None

    @property
    def starved(self) -> bool:
        return self.share is not None and self.share > self.STARVED


def _cpu_wait() -> tuple[int, int] | None:
    """(monotonic us, PSI total us some task waited for a CPU), where the kernel has PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            return time.monotonic_ns() // 1000, int(f.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


@contextmanager
def cpu_pressure() -> Iterator[CpuPressure]:
    """Measure CPU pressure over the `with` block."""
    result = CpuPressure()
    before = _cpu_wait()
    yield result
    after = _cpu_wait()
    if before and after:
        result.share = (after[1] - before[1]) / max(1, after[0] - before[0])
