"""Datasets: where a workload's prompts come from (`workload.dataset`, `--dataset-name`).

Each is a kind of DATASETS (bench.registry): synthetic prompts of the scenario's lengths
(random; trace, whose lengths come from the replayed trace), or prompts read from a file
(sharegpt, jsonl). A new format is one new module in this package that registers a
`Dataset` whose `load` reads the file; scenario files, --dataset-name and the API accept
it, and the README lists it. A dataset whose file is also a timed trace (mooncake) names
its trace format: the run replays the file's timestamps (load.shape trace) and renders
each request's prompt from the file's block hash ids (bench.blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.registry import Registry

# One prompt (text, or chat messages) and the output length it asks for (None: the
# scenario's output lengths decide).
Prompt = tuple[str | list[dict], int | None]


@dataclass(frozen=True)
class Dataset:
    """How one dataset kind gives prompts: `load(path)` reads `workload.dataset_path`;
    None means synthetic prompts of the scenario's lengths (no file).

    `trace_format`: the file is a block-hashed trace in this bench.traces format, replayed
    at its own timestamps with its own lengths, its prompts built block by block."""

    load: Callable[[Path], list[Prompt]] | None = None
    trace_format: str | None = None


DATASETS: Registry[Dataset] = Registry(
    "dataset", package=__name__, where="--dataset-name / workload.dataset"
)
