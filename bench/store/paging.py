"""A run's stored request rows one page at a time, for the service's /requests listing.

Keyset paging on the (run_id, load_point) index with the row id as tie-break: a page costs
the same at the millionth request as at the first, where OFFSET would read and skip every
row before it. The caller passes `next_after` back as `after` to get the next page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Engine

from bench.store.engine import get_engine
from bench.store.models import Request


@dataclass
class RequestPage:
    """Rows of the `requests` table (column name -> value) and where the next page starts
    (None on the last page)."""

    rows: list[dict[str, Any]]
    next_after: int | None


def request_page(
    run_id: str,
    db: str | Engine | None = None,
    *,
    load_point: int | None = None,
    state: str | None = None,
    after: int = 0,
    limit: int = 500,
) -> RequestPage:
    """Up to `limit` requests of a run, by load point then stored order, after row `after`.

    `run_id` is a full id (resolve a reference with resolve_run first); `load_point` and
    `state` ("ok", "failed", "cancelled") narrow the rows; an `after` that names no row
    starts from the beginning.
    """
    engine = get_engine(db)
    after_point = -1
    with engine.connect() as conn:
        if after:
            found = conn.execute(
                select(Request.load_point).where(Request.id == after)
            ).scalar_one_or_none()
            after_point = found if found is not None else -1
        key = tuple_(Request.load_point, Request.id)
        query = (
            select(*Request.__table__.c)
            .where(Request.run_id == run_id, key > tuple_(after_point, after))
            .order_by(Request.load_point, Request.id)
            .limit(limit + 1)
        )
        if load_point is not None:
            query = query.where(Request.load_point == load_point)
        if state is not None:
            query = query.where(Request.state == state)
        rows = [dict(r._mapping) for r in conn.execute(query)]
    more = len(rows) > limit
    rows = rows[:limit]
    return RequestPage(rows, rows[-1]["id"] if more else None)
