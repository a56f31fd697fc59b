"""A run's requests as files: JSON (full fidelity), CSV (spreadsheets), Parquet (analysis).

All times are integer nanoseconds since the run's start, as stored. Token gaps come as
`chunk_gaps_ns`: a list in JSON and Parquet, space-separated integers in CSV.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy.engine import Engine

from bench.formulas import csv_text
from bench.store.read import get_run, requests_dataframe

FORMATS = ("json", "csv", "parquet")


def _json_default(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _text_columns(frame: pd.DataFrame) -> list[str]:
    """Columns that may hold text: object columns, string columns (pandas 3's "str", which
    select_dtypes(include="object") matches only with a deprecation warning) and
    categorical ones of text (the stored error messages and kinds come back categorical,
    which select_dtypes(include="object") never matched, so their formulas went out as is)."""

    def text(dtype) -> bool:
        if isinstance(dtype, pd.CategoricalDtype):
            return text(dtype.categories.dtype)
        return pd.api.types.is_object_dtype(dtype) or isinstance(dtype, pd.StringDtype)

    return [name for name, dtype in frame.dtypes.items() if text(dtype)]


def export_raw(
    run: str,
    fmt: str,
    out: str | Path,
    *,
    load_point: int | None = None,
    db: str | Engine | None = None,
) -> Path:
    """Write the run's requests to `out` in fmt (json, csv or parquet); returns the path."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        from bench.extras import require

        require("pyarrow", "Parquet export")
    info = get_run(run, db)
    frame = requests_dataframe(info.id, load_point, db, gaps=True)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        frame = frame.astype(object).where(frame.notna(), None)
        doc = {"run": asdict(info), "requests": frame.to_dict(orient="records")}
        out.write_text(json.dumps(doc, default=_json_default, indent=None))
    elif fmt == "csv":
        frame["chunk_gaps_ns"] = [" ".join(map(str, g.tolist())) for g in frame["chunk_gaps_ns"]]
        for name in _text_columns(frame):  # server text: never a formula
            frame[name] = frame[name].map(csv_text)
        frame.to_csv(out, index=False)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        gaps = frame.pop("chunk_gaps_ns")
        table = pa.Table.from_pandas(frame, preserve_index=False)
        offsets = np.concatenate([[0], np.cumsum([len(g) for g in gaps])]).astype(np.int64)
        values = np.concatenate(list(gaps)) if len(gaps) else np.zeros(0, np.int64)
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))
        table = table.append_column("chunk_gaps_ns", lists)
        meta = {b"tokenbench.run": json.dumps(asdict(info), default=_json_default).encode()}
        pq.write_table(
            table.replace_schema_metadata({**(table.schema.metadata or {}), **meta}), out
        )
    return out


def frame_from_parquet(path: str | Path) -> pd.DataFrame:
    """Read an export-raw Parquet file back (tests, notebooks)."""
    return pd.read_parquet(path)
