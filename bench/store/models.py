"""SQLAlchemy 2 typed models: runs, load_points, requests, request_batches, run_artifacts.

`requests` holds one row per RequestRecord so the data stays queryable with plain SQL.
`request_batches` holds the same requests column-wise, one blob per writer commit and load
point (see codec.py): turning a million SQL rows into Python objects takes seconds, while
decoding a thousand column blobs takes milliseconds. Both are written in one transaction, so
they always agree; token gaps live only in the batch blobs (4 bytes per token, not a row).

Times of requests are integer nanoseconds since the run's start (as in RequestRecord);
wall-clock times of runs are timezone-aware UTC datetimes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Integer primary keys that grow past 2**31 on PostgreSQL; SQLite needs INTEGER for rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")

RUNNING = "running"
COMPLETED = "completed"
INTERRUPTED = "interrupted"
FAILED = "failed"
RUN_STATUSES = (RUNNING, COMPLETED, INTERRUPTED, FAILED)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    name: Mapped[str | None] = mapped_column(String(200))
    label: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16), default=RUNNING)
    scenario_text: Mapped[str | None] = mapped_column(Text)
    endpoint: Mapped[str | None] = mapped_column(String(500))  # credentials stripped
    backend: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    gpu_count: Mapped[int | None]
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    imported_from: Mapped[str | None] = mapped_column(String(32))  # vllm, guidellm, aiperf
    tool_version: Mapped[str | None] = mapped_column(String(32))
    hostname: Mapped[str | None] = mapped_column(String(200))
    cpu_count: Mapped[int | None]
    python_version: Mapped[str | None] = mapped_column(String(32))
    platform: Mapped[str | None] = mapped_column(String(200))
    request_count: Mapped[int] = mapped_column(BigInteger, default=0)
    summary_json: Mapped[dict[str, Any] | None]
    extra_json: Mapped[dict[str, Any] | None]

    __table_args__ = (
        Index("ix_runs_gpu_type", "gpu_type"),
        Index("ix_runs_model", "model"),
        Index("ix_runs_label", "label"),
        Index("ix_runs_created_at", "created_at"),
        Index("ix_runs_name", "name"),
    )


class LoadPoint(Base):
    """One load level of a run (a sweep has many): what was offered and when."""

    __tablename__ = "load_points"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    load_point: Mapped[int]  # the number RequestRecord.load_point holds
    label: Mapped[str | None] = mapped_column(String(200))
    mode: Mapped[str | None] = mapped_column(String(32))  # rate, concurrency, poisson, ...
    target_rate: Mapped[float | None] = mapped_column(Float)  # requests/s
    concurrency: Mapped[int | None]
    started_ns: Mapped[int | None] = mapped_column(BigInteger)  # since the run's start
    ended_ns: Mapped[int | None] = mapped_column(BigInteger)
    warmup_s: Mapped[float | None] = mapped_column(Float)
    cooldown_s: Mapped[float | None] = mapped_column(Float)
    params_json: Mapped[dict[str, Any] | None]
    summary_json: Mapped[dict[str, Any] | None]

    __table_args__ = (
        UniqueConstraint("run_id", "load_point", name="uq_load_points_run_load_point"),
    )


class Request(Base):
    """One RequestRecord as a SQL row (token gaps are in request_batches)."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    load_point: Mapped[int] = mapped_column(Integer, default=0)
    request_index: Mapped[int] = mapped_column(BigInteger)
    turn: Mapped[int] = mapped_column(Integer, default=0)
    intended_ns: Mapped[int] = mapped_column(BigInteger)
    sent_ns: Mapped[int] = mapped_column(BigInteger)
    first_byte_ns: Mapped[int | None] = mapped_column(BigInteger)
    first_token_ns: Mapped[int | None] = mapped_column(BigInteger)
    end_ns: Mapped[int | None] = mapped_column(BigInteger)
    n_chunks: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int | None]
    output_tokens: Mapped[int | None]
    token_count_source: Mapped[str | None] = mapped_column(String(16))
    http_status: Mapped[int | None]
    state: Mapped[str] = mapped_column(String(16))
    error_kind: Mapped[str | None] = mapped_column(String(32))
    error_message: Mapped[str | None] = mapped_column(Text)
    expected_input_len: Mapped[int | None]
    expected_output_len: Mapped[int | None]
    # schema 0002: prompt tokens the server said it served from its prefix cache, and the
    # wait for a --max-concurrency slot (not send lag)
    cached_prompt_tokens: Mapped[int | None]
    slot_wait_ns: Mapped[int | None] = mapped_column(BigInteger)
    # schema 0003: the request's traffic class (a scenario's `classes:`); NULL otherwise
    traffic_class: Mapped[str | None] = mapped_column(String(40))

    __table_args__ = (Index("ix_requests_run_load_point", "run_id", "load_point"),)


class RequestBatch(Base):
    """The requests of one writer commit and load point, column-wise (codec.py format)."""

    __tablename__ = "request_batches"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    load_point: Mapped[int] = mapped_column(Integer, default=0)
    n_requests: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_request_batches_run_load_point", "run_id", "load_point"),)


class RunArtifact(Base):
    """Anything else a run wants to keep (time series, plots, the raw imported file)."""

    __tablename__ = "run_artifacts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    media_type: Mapped[str] = mapped_column(String(100), default="application/json")
    created_at: Mapped[datetime]
    data: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (UniqueConstraint("run_id", "name", name="uq_run_artifacts_run_name"),)
