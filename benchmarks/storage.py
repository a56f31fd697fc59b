"""Storage benchmark: insert rate, 1M requests into pandas, summary of a 1M-request run.

    python benchmarks/storage.py [--pg URL] [--rows 1000000] [--repeat 5]

Targets (issue 3, on a 2-core machine): >= 100,000 rows/s into SQLite, 1M requests into a
DataFrame in < 2 s, summary of a 1M-request run in < 1 s. PostgreSQL figures beside them
(skipped when no server answers). Each request has 16 content chunks (15 ITL gaps), so the
1M-request summary computes percentiles over 15M ITL samples. Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.metrics import summarize  # noqa: E402
from bench.records import RequestRecord  # noqa: E402
from bench.store import RunWriter, dispose_all, load_columns, requests_dataframe  # noqa: E402

CHUNKS = 16
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def records(n: int, seed: int = 0) -> Iterator[RequestRecord]:
    rng = np.random.default_rng(seed)
    gaps = rng.integers(5_000_000, 40_000_000, (1024, CHUNKS - 1))
    offsets = np.concatenate([np.zeros((1024, 1), np.int64), np.cumsum(gaps, axis=1)], axis=1)
    for i in range(n):
        sent = i * 1_000_000
        first = sent + 50_000_000 + (i % 997) * 100_000
        times = first + offsets[i % 1024]
        yield RequestRecord(
            index=i,
            intended_ns=sent,
            sent_ns=sent + 20_000,
            first_byte_ns=first - 1000,
            first_token_ns=first,
            end_ns=int(times[-1]),
            chunk_times_ns=times,
            prompt_tokens=512,
            output_tokens=CHUNKS,
            token_count_source="usage",
            http_status=200,
        )


def write(db: str, recs: Iterator[RequestRecord] | list[RequestRecord]) -> tuple[str, float]:
    writer = RunWriter(db, name="bench-storage")
    writer.start_load_point(0)
    t0 = time.perf_counter()
    n = 0
    for r in recs:
        writer.submit(r)
        n += 1
    writer.finish()
    return writer.run_id, n / (time.perf_counter() - t0)


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(db: str, rows: int, insert_rows: int, repeat: int) -> dict[str, float]:
    batch = list(records(insert_rows, seed=1))
    rates = [write(db, batch)[1] for _ in range(min(repeat, 3))]
    run_id, _ = write(db, records(rows))
    return {
        "insert_rows_per_s": statistics.median(rates),
        "dataframe_s": median_time(lambda: requests_dataframe(run_id, db=db), repeat),
        "summary_s": median_time(lambda: summarize(load_columns(run_id, db=db)), repeat),
        "load_columns_s": median_time(lambda: load_columns(run_id, db=db), repeat),
    }


def pg_database() -> tuple[str, Callable[[], None]] | None:
    try:
        from sqlalchemy import create_engine, text

        admin = create_engine(
            PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        name = f"tokenbench_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        print(f"PostgreSQL skipped: {exc.__class__.__name__}", file=sys.stderr)
        return None

    def drop() -> None:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return PG_ADMIN.rsplit("/", 1)[0] + f"/{name}", drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--insert-rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["SQLite"] = measure(
            str(Path(tmp) / "bench.db"), args.rows, args.insert_rows, args.repeat
        )
        dispose_all()
    pg = None if args.no_pg else pg_database()
    if pg is not None:
        url, drop = pg
        try:
            results["PostgreSQL"] = measure(url, args.rows, args.insert_rows, args.repeat)
        finally:
            drop()
    names = list(results)
    print(f"\n{'figure (median)':<40}" + "".join(f"{n:>14}" for n in names) + f"{'target':>14}")
    rows = [
        ("insert rows/s (RunWriter)", "insert_rows_per_s", "{:,.0f}", ">= 100,000"),
        (f"{args.rows:,} requests -> DataFrame (s)", "dataframe_s", "{:.3f}", "< 2"),
        (f"summary of {args.rows:,} requests (s)", "summary_s", "{:.3f}", "< 1"),
        ("  of which load_columns (s)", "load_columns_s", "{:.3f}", ""),
    ]
    for label, key, fmt, target in rows:
        print(
            f"{label:<40}"
            + "".join(f"{fmt.format(results[n][key]):>14}" for n in names)
            + f"{target:>14}"
        )
    print("(the rest of the summary time is metrics.summarize itself, as for records in memory)")


if __name__ == "__main__":
    main()
