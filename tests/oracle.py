"""Independent oracles: recompute a view with plain pyarrow + Python over the
source at a given version, and count UDF calls recorded by worker processes.

Nothing here uses mv_assets or Lance SQL: filters and projections are given as
Python callables over Arrow tables.
"""

import math
import os
from fractions import Fraction
from typing import Callable

import lance
import pyarrow as pa


def source_rows(uri: str, version: int) -> dict[int, dict]:
    """Rows of a Lance dataset at ``version``, keyed by stable row id."""
    t = lance.dataset(uri, version=version).to_table(with_row_id=True)
    ids = t.column("_rowid").to_pylist()
    rows = t.drop_columns(["_rowid"]).to_pylist()
    return dict(zip(ids, rows, strict=True))


def expected_view(
    uri: str,
    version: int,
    keep: Callable[[dict], bool],
    project: Callable[[dict], dict],
) -> dict[int, dict]:
    """The view as ``{source row id: output row}`` computed row by row."""
    return {rid: project(r) for rid, r in source_rows(uri, version).items() if keep(r)}


def actual_view(table, key: str = "__source_row_id") -> dict[int, dict]:
    t = table.to_arrow(with_internal=True) if not isinstance(table, pa.Table) else table
    t = t.select([n for n in t.column_names if not n.startswith(("__computed__", "__source_computed__"))])
    rows = t.to_pylist()
    out = {}
    for r in rows:
        r.pop("__source_row_version", None)  # bookkeeping, not view content
        k = r.pop(key)
        assert k not in out, f"duplicate view key {k}"
        out[k] = r
    return out


def changed_rows(uri: str, v0: int | None, v1: int, keep: Callable[[dict], bool]) -> set[int]:
    """Row ids passing ``keep`` at v1 that are new since v0 or whose values differ."""
    after = source_rows(uri, v1)
    before = source_rows(uri, v0) if v0 is not None else {}
    return {rid for rid, r in after.items() if keep(r) and before.get(rid) != r}


def count_calls(call_dir: str, tag: str) -> int:
    """Calls recorded by UDFs in every worker process (one line per call)."""
    n = 0
    for name in os.listdir(call_dir):
        if name.startswith(tag + "."):
            with open(os.path.join(call_dir, name)) as fh:
                n += sum(1 for _ in fh)
    return n


def record_call(call_dir: str, tag: str, value) -> None:
    with open(os.path.join(call_dir, f"{tag}.{os.getpid()}.log"), "a") as fh:
        fh.write(f"{value}\n")


def shuffle_key(row_id: int, seed: int) -> int:
    """The documented shuffle key, splitmix64(row id + seed * golden ratio),
    written out in plain Python (the engine computes it with numpy)."""
    m = (1 << 64) - 1
    z = (row_id + seed * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


# SQL's float rules for aggregates (PostgreSQL, DuckDB), written out in plain Python
def sql_sum(values: list):
    """sum of non-NULL values: NaN if any is NaN or both infinities are there,
    else the infinity there, else the exact sum (``math.fsum``; ints: ``sum``)."""
    floats = [v for v in values if isinstance(v, float)]
    if any(v != v for v in floats) or (float("inf") in floats and float("-inf") in floats):
        return float("nan")
    if float("inf") in floats or float("-inf") in floats:
        return float("inf") if float("inf") in floats else float("-inf")
    if not floats:
        return sum(values)
    exact = sum(Fraction(v) for v in values)  # (math.fsum raises where partial sums overflow)
    try:
        return float(exact)
    except OverflowError:  # finite values whose sum is beyond the float range
        return float("inf") if exact > 0 else float("-inf")


def sql_max(values: list):
    """max of non-NULL values, NaN ordered above every number (infinity included)."""
    if any(isinstance(v, float) and v != v for v in values):
        return float("nan")
    return max(values)


def sql_min(values: list):
    """min of non-NULL values, NaN ordered above every number: NaN only when every value is."""
    numbers = [v for v in values if not (isinstance(v, float) and v != v)]
    return min(numbers) if numbers else float("nan")


def sql_count_distinct(values: list) -> int:
    """count(distinct) of non-NULL values: every NaN is one value, 0.0 and -0.0 are one."""
    nans = [v for v in values if isinstance(v, float) and v != v]
    return len({v for v in values if not (isinstance(v, float) and v != v)}) + (1 if nans else 0)


def same_number(a, b, rel: float = 1e-9) -> bool:
    """Equal as aggregate outputs: NaN equals NaN, infinities exactly, finite floats within ``rel``."""
    if isinstance(a, float) and isinstance(b, float):
        if a != a or b != b:
            return a != a and b != b
        if math.isinf(a) or math.isinf(b):
            return a == b
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel)
    return a == b
