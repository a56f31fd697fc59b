"""Length distributions: how each request's input and output token counts are drawn.

Each is a kind of LENGTHS (bench.registry): a function `(dist, n, rng) -> n floats` over
the parameters of bench.workload.LengthDist (mean, range_ratio, std, sigma); the workload
rounds and clips what it returns to [min, max]. A new distribution is one module in this
package; `workload.input.dist` and `workload.output.dist` accept its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.registry import Registry

# (LengthDist, n, numpy Generator) -> array of n lengths, before rounding and clipping
Sample = Callable[[Any, int, Any], Any]

LENGTHS: Registry[Sample] = Registry(
    "length distribution", package=__name__, where="workload.input.dist / workload.output.dist"
)
