"""The runner's timers (think times, ramp-up steps, open-loop sends) never fire early.

uvloop rounds timers to whole milliseconds from a clock read at the top of a loop iteration,
so a bare call_later or asyncio.sleep ends up to ~1.3 ms before it was due: a request sent
before its intended time reads as a negative send lag, a think time shorter than asked."""

from __future__ import annotations

import asyncio
import random
from time import perf_counter_ns

import numpy as np

from bench.runner import call_after, execute, new_event_loop
from tests.helpers import plan


def test_call_after_never_runs_a_callback_before_it_is_due():
    rng = random.Random(7)
    early_ns: list[int] = []
    fired: list[int] = []

    async def main() -> None:
        done = asyncio.Event()

        def due_now(due_ns: int) -> None:
            early_ns.append(due_ns - perf_counter_ns())
            fired.append(1)
            if len(fired) == 200:
                done.set()

        for _ in range(200):
            await asyncio.sleep(rng.uniform(0.0, 0.002))  # arm from different loop iterations
            due_ns = perf_counter_ns() + int(rng.uniform(0.0002, 0.02) * 1e9)
            call_after(due_ns, due_now, due_ns)
        await asyncio.wait_for(done.wait(), 30)

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(early_ns) == 200
    assert max(early_ns) <= 0, f"{sum(e > 0 for e in early_ns)} of 200 ran early"


def test_open_loop_sends_nothing_before_its_intended_time(fake_server):
    # Offsets at fractions of a millisecond, where a rounded timer would wake early.
    p = plan(fake_server.url, 60, out_len=2)
    p.offsets_s = np.cumsum(np.full(60, 0.0037))
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(execute(p))
    finally:
        loop.close()
    assert len(result.records) == 60
    assert min(r.sent_ns - r.intended_ns for r in result.records) >= 0
