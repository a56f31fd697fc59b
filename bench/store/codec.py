"""Column-wise encoding of a batch of RequestRecords: the `request_batches.data` blob.

Why: reading a million rows through a DB driver creates ~15 million Python objects (seconds
on a small machine); a thousand column blobs decode with np.frombuffer in milliseconds, so a
1M-request run loads into pandas or a metrics.Columns well under the issue's targets.

Format v1 (all little-endian):
    b"TBB1" | uint32 header length | header (UTF-8 JSON) | column bytes, in header order
header = {"n": rows, "cols": [[name, numpy dtype str, nbytes], ...], "vocab": {name: [...]}}
- integer fields: int64, NULL stored as INT64_MIN;
- text fields (state, error kind, ...): int32 codes into the header's vocab list, -1 = NULL;
- `first_chunk_ns`: arrival of each request's first content chunk (NULL without chunks);
- `gaps`: every request's chunk-arrival gaps (np.diff of chunk_times_ns), concatenated in
  row order; request i owns max(n_chunks[i] - 1, 0) of them. int32 nanoseconds (4 bytes a
  token, exact, up to 2.1 s per gap) unless a gap in the batch does not fit, then int64.
  ITL statistics need exactly these gaps, so they come out with one frombuffer and a mask.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from bench.records import RequestRecord

MAGIC = b"TBB1"
NULL = np.iinfo(np.int64).min
INT32 = np.iinfo(np.int32)

# (column name, RequestRecord attribute); request fields stored as int64.
INT_FIELDS: tuple[tuple[str, str], ...] = (
    ("request_index", "index"),
    ("turn", "turn"),
    ("intended_ns", "intended_ns"),
    ("sent_ns", "sent_ns"),
    ("first_byte_ns", "first_byte_ns"),
    ("first_token_ns", "first_token_ns"),
    ("end_ns", "end_ns"),
    ("prompt_tokens", "prompt_tokens"),
    ("output_tokens", "output_tokens"),
    ("http_status", "http_status"),
    ("expected_input_len", "expected_input_len"),
    ("expected_output_len", "expected_output_len"),
    ("retries", "retries"),
    ("cached_prompt_tokens", "cached_prompt_tokens"),  # added in schema 0002; NULL before
    ("slot_wait_ns", "slot_wait_ns"),  # added in schema 0002; NULL (no wait known) before
    # the server's usage when it was not believed (issue 28); in the blob only, not a SQL
    # column of `requests` (no schema change): NULL before, and when usage was believed
    ("claimed_output_tokens", "claimed_output_tokens"),
)
# Columns added after format v1 was first written, and the value older batches mean by
# their absence (a batch stored before `retries` existed had no retries; one stored before
# schema 0002 does not say what was cached or how long a request waited for a slot).
LATER_INTS: dict[str, int] = {
    "retries": 0,
    "cached_prompt_tokens": NULL,
    "slot_wait_ns": NULL,
    "claimed_output_tokens": NULL,
}
STR_FIELDS: tuple[str, ...] = (
    "state",
    "error_kind",
    "token_count_source",
    "error_message",
    "traffic_class",  # added in schema 0003; NULL in batches stored before
)

# Column order of a `requests` SQL row, after run_id and load_point.
SQL_COLUMNS: tuple[str, ...] = (
    "request_index",
    "turn",
    "intended_ns",
    "sent_ns",
    "first_byte_ns",
    "first_token_ns",
    "end_ns",
    "n_chunks",
    "prompt_tokens",
    "output_tokens",
    "token_count_source",
    "http_status",
    "state",
    "error_kind",
    "error_message",
    "expected_input_len",
    "expected_output_len",
    "cached_prompt_tokens",
    "slot_wait_ns",
    "traffic_class",
)


def _int_column(records: Sequence[RequestRecord], attr: str) -> np.ndarray:
    try:
        return np.fromiter(
            (NULL if (v := getattr(r, attr)) is None else v for r in records),
            np.int64,
            len(records),
        )
    except (OverflowError, TypeError, ValueError):
        # A value that is no int64 (a server's usage of 1e30 or "16" that got this far):
        # store NULL for it rather than lose the batch (one bad response never fails a run).
        return np.fromiter((_int64_or_null(getattr(r, attr)) for r in records), np.int64)


def _int64_or_null(value) -> int:
    if type(value) is bool or not isinstance(value, (int, np.integer)):
        return NULL
    return int(value) if NULL < value <= np.iinfo(np.int64).max else NULL


def _chunks(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_chunks, first_chunk_ns, gaps) of a batch, without a Python loop over tokens."""
    n = len(records)
    times = [np.asarray(r.chunk_times_ns, dtype=np.int64) for r in records]
    counts = np.fromiter(map(len, times), np.int64, n)
    all_t = np.concatenate(times) if n else np.zeros(0, np.int64)
    starts = np.cumsum(counts) - counts
    first = np.full(n, NULL, np.int64)
    has = counts > 0
    first[has] = all_t[starts[has]]
    gaps = np.diff(all_t)
    keep = np.ones(gaps.size, dtype=bool)
    boundary = starts[1:] - 1  # gap from one request's last chunk to the next one's first
    keep[boundary[(boundary >= 0) & (boundary < gaps.size)]] = False
    return counts, first, gaps[keep]


def encode_batch(
    records: Sequence[RequestRecord], scrub: Callable[[str], str] = lambda s: s
) -> tuple[bytes, list[tuple]]:
    """Encode records as a blob and as `requests` rows (without run_id/load_point).

    The SQL rows are built from the same arrays as the blob, so both always agree and hold
    plain Python ints even when a caller passed numpy integers. `scrub` cleans free text
    (error messages) of secrets before either is stored.
    """
    n = len(records)
    ints = {name: _int_column(records, attr) for name, attr in INT_FIELDS}
    n_chunks, first_chunk, gaps = _chunks(records)
    ints["first_chunk_ns"] = first_chunk
    ints["n_chunks"] = n_chunks
    fits32 = gaps.size == 0 or (gaps.min() >= INT32.min and gaps.max() <= INT32.max)
    gaps = gaps.astype("<i4" if fits32 else "<i8")

    strs: dict[str, np.ndarray] = {}
    vocabs: dict[str, list] = {}
    texts: dict[str, list] = {}
    for name in STR_FIELDS:
        values = [getattr(r, name) for r in records]
        if name == "error_message":
            values = [None if v is None else scrub(str(v)) for v in values]
        codes: dict[str, int] = {}
        strs[name] = np.fromiter(
            (-1 if v is None else codes.setdefault(v, len(codes)) for v in values), np.int32, n
        )
        vocabs[name] = list(codes)
        texts[name] = values

    arrays = [(k, v.astype("<i8")) for k, v in ints.items()]
    arrays += [(k, v.astype("<i4")) for k, v in strs.items()]
    arrays.append(("gaps", gaps))
    header = json.dumps(
        {"n": n, "cols": [[k, a.dtype.str, a.nbytes] for k, a in arrays], "vocab": vocabs},
        separators=(",", ":"),
    ).encode()
    blob = b"".join(
        [MAGIC, struct.pack("<I", len(header)), header, *(a.tobytes() for _, a in arrays)]
    )

    lists: dict[str, list] = {}
    for name, arr in ints.items():
        lists[name] = [None if v == NULL else v for v in arr.tolist()]
    lists.update(texts)
    rows = list(zip(*(lists[c] for c in SQL_COLUMNS), strict=True))
    return blob, rows


@dataclass
class Decoded:
    """Concatenated columns of many batches: int64 (NULL = INT64_MIN), coded text, gaps."""

    n: int
    load_point: np.ndarray
    ints: dict[str, np.ndarray]
    codes: dict[str, np.ndarray]  # int32, -1 = NULL
    vocab: dict[str, list]
    gaps: np.ndarray

    def text(self, name: str) -> np.ndarray:
        """An object array of the text column (None for NULL)."""
        table = np.array([*self.vocab[name], None], dtype=object)
        return table[self.codes[name]]

    def as_float(self, name: str) -> np.ndarray:
        """The int column as float64 with NaN for NULL (what metrics.Columns holds)."""
        col = self.ints[name]
        out = col.astype(np.float64)
        out[col == NULL] = np.nan
        return out


def _decode_one(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    if blob[:4] != MAGIC:
        raise ValueError("not a tokenbench request batch (bad magic)")
    (hlen,) = struct.unpack_from("<I", blob, 4)
    header = json.loads(blob[8 : 8 + hlen])
    offset = 8 + hlen
    cols = {}
    for name, dtype, nbytes in header["cols"]:
        cols[name] = np.frombuffer(
            blob, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize, offset=offset
        )
        offset += nbytes
    return header, cols


ALL_INTS: tuple[str, ...] = (*(name for name, _ in INT_FIELDS), "first_chunk_ns", "n_chunks")


def decode_batches(
    batches: Sequence[tuple[int, bytes]], only: Collection[str] | None = None
) -> Decoded:
    """Decode (load_point, blob) pairs, in order, into one set of columns.

    `only` limits decoding to the named columns (plus n_chunks, which gaps need): copying
    fewer megabytes is what makes a 1M-request summary fast.
    """
    wanted = set(only or (*ALL_INTS, *STR_FIELDS, "gaps")) | {"n_chunks"}
    ints: dict[str, list[np.ndarray]] = {name: [] for name in ALL_INTS if name in wanted}
    codes: dict[str, list[np.ndarray]] = {name: [] for name in STR_FIELDS if name in wanted}
    vocab: dict[str, dict[str, int]] = {name: {} for name in STR_FIELDS}
    gaps: list[np.ndarray] = []
    lps: list[np.ndarray] = []
    for load_point, blob in batches:
        header, cols = _decode_one(blob)
        lps.append(np.full(header["n"], load_point, dtype=np.int64))
        for name in ints:
            col = cols.get(name)
            if col is None:  # a batch written before this column existed
                col = np.full(header["n"], LATER_INTS.get(name, NULL), dtype=np.int64)
            ints[name].append(col)
        for name in codes:
            if name not in cols:  # a text column added after this batch was written: NULL
                codes[name].append(np.full(header["n"], -1, np.int32))
                continue
            table = vocab[name]
            remap = np.array(
                [table.setdefault(v, len(table)) for v in header["vocab"][name]] + [-1], np.int32
            )
            codes[name].append(remap[cols[name]])
        if "gaps" in wanted:
            gaps.append(cols["gaps"])

    def cat(parts: list[np.ndarray], dtype: str) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    lp = cat(lps, "<i8")
    return Decoded(
        n=int(lp.size),
        load_point=lp,
        ints={k: cat(v, "<i8") for k, v in ints.items()},
        codes={k: cat(v, "<i4") for k, v in codes.items()},
        vocab={k: list(vocab[k]) for k in codes},
        gaps=cat(gaps, "<i4"),
    )
