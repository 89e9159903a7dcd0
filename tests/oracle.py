"""Independent oracles: recompute a view with plain pyarrow + Python over the
source at a given version, and count UDF calls recorded by worker processes.

Nothing here uses mv_assets or Lance SQL: filters and projections are given as
Python callables over Arrow tables.
"""

import os
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
