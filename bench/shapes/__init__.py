"""Load shapes: how a scenario's `load.shape` becomes intended send offsets.

Each shape is a kind of SHAPES (bench.registry): renewal processes at one rate (poisson,
constant, gamma), rate functions (on_off, ramp, steps), a replayed trace, and the closed
loop of users. The arithmetic lives in bench.arrivals; a shape here says which scenario
fields it needs, how it draws its offsets, its mean rate, and how a sweep scales it. A new
shape is one new module in this package that calls `SHAPES.register(...)`; the scenario's
validation, the sweep, the API's schema and the README's list follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.registry import Registry

# (scenario, rng, base_dir) -> offsets in seconds, or None for a closed loop
Offsets = Callable[[Any, np.random.Generator, Path | None], np.ndarray | None]


@dataclass(frozen=True)
class LoadShape:
    """One load shape. `scenario` arguments are bench.scenario.Scenario objects."""

    offsets: Offsets
    needs: tuple[str, ...] = ()  # load fields the shape cannot go without
    # The mean offered rate in req/s (None: none, as for a closed loop).
    mean_rate: Callable[[Any], float | None] = lambda load: None
    # Multiply every rate of `load` by a factor, so a sweep point keeps the shape; None:
    # the shape cannot be scaled and a rate sweep runs it as poisson at the point's rate.
    scale: Callable[[Any, float], None] | None = None
    # One rate that a sweep sets directly (load.request_rate), as `vllm bench serve` does.
    rate_shape: bool = False
    # Set the shape to a mean rate where its own mean is not known without reading a file
    # (a replayed trace scales its timestamps); a sweep's rate point calls it.
    at_rate: Callable[[Any, float], None] | None = None
    # (input lengths, output lengths) per session, read from the shape's source (a trace);
    # None where the shape has none. Called as (scenario, base_dir).
    session_lengths: Callable[[Any, Path | None], tuple | None] | None = None


SHAPES: Registry[LoadShape] = Registry("load shape", package=__name__, where="load.shape")
