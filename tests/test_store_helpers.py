"""Shared helpers for the store tests (no tests here): synthetic records, a PostgreSQL db."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from bench.records import FAILED, OK, RequestRecord

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def make_records(n: int, seed: int = 0, load_points: int = 1) -> list[RequestRecord]:
    """Realistic-looking records: a few failures, one-token outputs, empty streams, big gaps."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        sent = int(i * 7_000_000 + rng.integers(0, 1000))
        state = FAILED if i % 17 == 5 else OK
        chunks = int(rng.integers(0, 40)) if state == OK else int(rng.integers(0, 3))
        first = sent + int(rng.integers(5_000_000, 400_000_000))
        gaps = rng.integers(1_000, 60_000_000, max(chunks - 1, 0))
        if i == 3 and chunks > 2:
            gaps[0] = 5_000_000_000  # a 5 s stall: does not fit int32 ns
        times = (
            (first + np.concatenate([[0], np.cumsum(gaps)])).astype(np.int64)
            if chunks
            else np.zeros(0, np.int64)
        )
        records.append(
            RequestRecord(
                index=i,
                load_point=i * load_points // n,  # sequential, as a sweep runs them
                turn=i % 3,
                intended_ns=sent - int(rng.integers(0, 2_000_000)),
                sent_ns=sent,
                first_byte_ns=first - 1000 if chunks else None,
                first_token_ns=first if chunks else None,
                end_ns=int(times[-1]) + 500
                if chunks
                else (sent + 9_000_000 if state == FAILED else None),
                chunk_times_ns=times,
                prompt_tokens=int(rng.integers(10, 2000)),
                output_tokens=chunks if state == OK else None,
                token_count_source="usage" if i % 2 else "chunks",
                http_status=200 if state == OK else 503,
                state=state,
                error_kind=None if state == OK else "http_5xx",
                error_message=None if state == OK else f"HTTP 503 on request {i}",
                expected_input_len=100,
                expected_output_len=None if i % 4 else 64,
            )
        )
    return records


def assert_same_records(a: list[RequestRecord], b: list[RequestRecord]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for name in RequestRecord.__slots__:
            vx, vy = getattr(x, name), getattr(y, name)
            if name == "chunk_times_ns":
                assert np.array_equal(vx, vy), (x.index, name)
            else:
                assert vx == vy, (x.index, name, vx, vy)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A throwaway PostgreSQL database, dropped afterwards; skips loudly without a server."""
    from sqlalchemy import create_engine, text

    admin = create_engine(
        PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    name = f"tokenbench_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        admin.dispose()
        pytest.skip(
            f"NO POSTGRESQL SERVER at 127.0.0.1:5432 ({type(exc).__name__}): PostgreSQL tests skipped"
        )
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        yield url
    finally:
        from bench.store.engine import dispose_all

        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
