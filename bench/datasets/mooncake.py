"""Mooncake's block-hashed trace as a dataset: `--dataset-name mooncake --dataset-path FILE`.

The file is read by the `mooncake` trace format (bench/traces/mooncake.py): requests are
sent at its timestamps with its lengths (load.shape trace), and each prompt is built from
its hash ids (bench.blocks), so equal ids are byte-identical blocks and a server's prefix
cache sees the reuse the trace had.
"""

from __future__ import annotations

from bench.datasets import DATASETS, Dataset

DATASETS.register(
    "mooncake",
    "Mooncake JSONL trace: its timestamps, lengths and hash_ids, equal ids identical "
    "blocks (workload.block_size)",
    Dataset(trace_format="mooncake"),
)
