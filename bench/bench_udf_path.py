"""The scalar UDF path against a plain Python loop (issue 48): prints, side by
side in one run, alternated, medians of --repeat runs:

1. per batch, at --rows rows (goal: fast path / plain loop <= 1.2):
   (a) a plain loop: the function called on values from ``to_pylist()``
       (``[f(n, x) for n, x in zip(names, xs)]``) and the output ``pa.array``;
   (b) ``UDF.apply`` of the same ``@udf``: its fast path;
   (c) the general path (``_apply_scalar(fast=False)``: each row checked
       on its own, as ``apply`` did before);
   and the ratios b/a and c/a (the values of (b) and (c) checked equal to (a)'s).
2. a whole ``refresh()`` of a view of --rows rows with that UDF on
   ``mv.InlineRunner()`` (a fresh view each time), against a plain loop over
   the same rows read with pylance (read, loop, write a Lance dataset).
3. a scalar chunker (words of a text, 0-3 per parent) over --rows / 5
   parents: ``Chunker.apply`` against a plain loop building the same children.

Usage: python bench/bench_udf_path.py [--rows 1000000] [--repeat 5] [--no-refresh]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Iterator, NamedTuple

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402


def length_plus(name: str, x: float) -> float:
    return len(name) + x


scalar = mv.udf(length_plus)


def make_rows(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({
        "id": np.arange(n, dtype=np.int64),
        "name": pa.array([f"name-{i % 1000}" for i in range(n)]),
        "x": rng.random(n),
    })


def plain_loop(batch: pa.RecordBatch) -> pa.Array:
    names, xs = batch.column("name").to_pylist(), batch.column("x").to_pylist()
    return pa.array([length_plus(n, x) for n, x in zip(names, xs, strict=True)], pa.float64())


def fast_path(batch: pa.RecordBatch) -> pa.Array:
    return scalar.apply(batch)[0]


def general_path(batch: pa.RecordBatch) -> pa.Array:
    return scalar._apply_scalar(batch, [], fast=False)[0]


def timed(fn, *args) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def per_batch(rows: pa.Table, repeat: int) -> None:
    batch = rows.select(["name", "x"]).combine_chunks().to_batches()[0]
    expected = plain_loop(batch)
    sides = {"(a) plain loop": plain_loop, "(b) UDF.apply fast path": fast_path, "(c) general path": general_path}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):  # alternated: a, b, c, a, b, c, ...
        for label, fn in sides.items():
            secs, out = timed(fn, batch)
            assert out.equals(expected), label
            times[label].append(secs)
    med = {k: statistics.median(v) for k, v in times.items()}
    a = med["(a) plain loop"]
    print(f"\n1. scalar UDF over one batch of {batch.num_rows:,} rows, median of {repeat} (alternated)")
    for label, secs in med.items():
        print(f"   {label:26s} {secs:.3f} s  ({secs / batch.num_rows * 1e9:.0f} ns/row)")
    print(f"   ratio b/a (fast path / plain loop, goal <= 1.2): {med['(b) UDF.apply fast path'] / a:.2f}")
    print(f"   ratio c/a (general path / plain loop):         {med['(c) general path'] / a:.2f}")


def pylance_loop(src_uri: str, out_uri: str) -> float:
    """The plain loop over the rows read with pylance, its result written (with the ids) as Lance."""
    t0 = time.perf_counter()
    t = lance.dataset(src_uri).to_table(columns=["id", "name", "x"])
    names, xs = t.column("name").to_pylist(), t.column("x").to_pylist()
    y = pa.array([length_plus(n, x) for n, x in zip(names, xs, strict=True)], pa.float64())
    lance.write_dataset(pa.table({"id": t.column("id"), "y": y}), out_uri, mode="overwrite")
    return time.perf_counter() - t0


def whole_refresh(rows: pa.Table, repeat: int, root: str) -> None:
    db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
    src = db.create_table("src", rows, primary_key="id")
    query = src.search(None).select({"id": "id", "y": scalar})
    warm = db.create_materialized_view("warm", src.search(None).limit(1000).select({"id": "id", "y": scalar}))
    warm.refresh()  # imports and first-call costs out of the measurements
    refresh_s, plain_s = [], []
    for i in range(repeat):  # alternated: refresh, plain loop, refresh, ...
        view = db.create_materialized_view(f"v{i}", query)
        secs, r = timed(view.refresh)
        assert view.count_rows() == rows.num_rows and r.udf_rows_computed.get("y") == rows.num_rows
        refresh_s.append(secs)
        db.drop_table(f"v{i}")
        plain_s.append(pylance_loop(src.uri, os.path.join(root, f"plain{i}.lance")))
        shutil.rmtree(os.path.join(root, f"plain{i}.lance"), ignore_errors=True)
    r_med, p_med = statistics.median(refresh_s), statistics.median(plain_s)
    print(f"\n2. whole refresh() of a {rows.num_rows:,}-row view with that UDF on InlineRunner, median of {repeat}")
    print(f"   refresh (fresh view each time)                   {r_med:.3f} s")
    print(f"   pylance read + plain loop + write (same rows)    {p_med:.3f} s")
    print(f"   ratio refresh / plain loop: {r_med / p_med:.2f}")


class Word(NamedTuple):
    pos: int
    word: str


def split_words(text: str) -> Iterator[Word]:
    for i, w in enumerate(text.split()):
        yield Word(i, w)


words = mv.chunker(split_words)


def plain_chunks(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
    rows, parent = [], []
    for i, text in enumerate(batch.column("text").to_pylist()):
        for child in split_words(text):
            rows.append(child)
            parent.append(i)
    schema = words.output_schema
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema), pa.array(parent, pa.int64())


def per_chunk_batch(parents: int, repeat: int) -> None:
    batch = pa.record_batch({"text": [" ".join(f"w{j}" for j in range(i % 4)) for i in range(parents)]})
    want = plain_chunks(batch)
    sides = {"(a) plain loop": plain_chunks, "(b) Chunker.apply": lambda b: words.apply(b)[:2]}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):
        for label, fn in sides.items():
            secs, out = timed(fn, batch)
            assert out[0].equals(want[0]) and out[1].equals(want[1]), label
            times[label].append(secs)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n3. scalar chunker over {parents:,} parents ({want[0].num_rows:,} children), median of {repeat}")
    for label, secs in med.items():
        print(f"   {label:26s} {secs:.3f} s  ({secs / parents * 1e9:.0f} ns/parent)")
    print(f"   ratio b/a: {med['(b) Chunker.apply'] / med['(a) plain loop']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-refresh", action="store_true", help="leave part 2 out")
    args = ap.parse_args()
    rows = make_rows(args.rows)
    per_batch(rows, args.repeat)
    if not args.no_refresh:
        root = tempfile.mkdtemp(prefix="mv_bench_udf_path_")
        try:
            whole_refresh(rows, args.repeat, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    per_chunk_batch(max(args.rows // 5, 1), args.repeat)


if __name__ == "__main__":
    main()
