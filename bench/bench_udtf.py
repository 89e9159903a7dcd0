"""Table-function views: a refresh after rows are appended to one partition
recomputes that partition only. Prints, side by side in one run, the time of a
full recompute (the first refresh, and ``mode="full"`` again) and of the
refresh after an append to one of ``--partitions`` partitions, with the UDTF
calls each made, for two UDTFs: a cheap one (an aggregate in Arrow) and a
model-like one (near-duplicate detection: Python over every row of the
partition, ~10 us per row). Every refresh is checked against a plain pyarrow
oracle over the source at the version the view reflects.

Usage: .venv/bin/python bench/bench_udtf.py [--rows 1000000] [--partitions 100] [--append 1000]
"""

import argparse
import os
import shutil
import tempfile
import time
import zlib

os.environ.setdefault("LANCE_LOG", "error")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import mv_assets as mv  # noqa: E402

OUT_CHEAP = pa.schema([("g", pa.int64()), ("rows", pa.int64()), ("total", pa.float64())])
OUT_DEDUP = pa.schema([("g", pa.int64()), ("id", pa.int64()), ("dupes", pa.int64())])


def cheap(t: pa.Table) -> pa.Table:
    """Per partition: its row count and the sum of x."""
    return pa.table({"g": [t.column("g")[0].as_py()], "rows": [t.num_rows], "total": [pc.sum(t.column("x")).as_py()]},
                    schema=OUT_CHEAP)


def dedup(t: pa.Table) -> pa.Table:
    """Per partition: one row per group of near-duplicate texts (same shingle
    signature), with its first id and how many it stands for."""
    first: dict[int, int] = {}
    count: dict[int, int] = {}
    for i, text in zip(t.column("id").to_pylist(), t.column("text").to_pylist(), strict=True):
        words = text.split()
        sig = min(zlib.crc32(" ".join(words[k:k + 2]).encode()) for k in range(max(1, len(words) - 1)))
        first.setdefault(sig, i)
        count[sig] = count.get(sig, 0) + 1
    g = t.column("g")[0].as_py()
    return pa.table({"g": [g] * len(first), "id": list(first.values()), "dupes": [count[s] for s in first]},
                    schema=OUT_DEDUP)


def rows(start: int, n: int, partitions: int, only: int | None = None) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    g = np.full(n, only, dtype=np.int64) if only is not None else ids % partitions
    vocab = np.array([f"w{k}" for k in range(50)])
    text = [" ".join(vocab[rng.integers(0, 50, 6)]) for _ in range(n)]
    return pa.table({"id": ids, "g": g, "x": rng.random(n), "text": text})


def oracle(src_uri: str, version: int, fn) -> list:
    import lance

    t = lance.dataset(src_uri, version=version).to_table(columns=["id", "g", "x", "text"])
    out = []
    for g in pc.unique(t.column("g")).to_pylist():
        part = t.filter(pc.equal(t.column("g"), g))
        out += fn(part).to_pylist()
    return sorted(_rounded(r) for r in out)


def _rounded(row: dict) -> tuple:
    """A row with floats rounded: a sum's last bits depend on the rows' order."""
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row.values())


def actual(view, schema: pa.Schema) -> list:
    t = view.to_arrow().select(schema.names)
    return sorted(_rounded(r) for r in t.to_pylist())


def run(name: str, fn, schema: pa.Schema, inputs: list[str], args) -> dict:
    root = tempfile.mkdtemp(prefix="bench_udtf_")
    try:
        db = mv.connect(root, runner=mv.InlineRunner())
        src = db.create_table("src", rows(0, args.rows, args.partitions), primary_key="id")
        udtf = mv.udtf(fn, output_schema=schema, input_columns=inputs, partition_by="g")
        view = db.create_udtf_view("v", src.search(None), udtf)
        out = {}
        t0 = time.perf_counter()
        r = view.refresh()
        out["first refresh (full)"] = (time.perf_counter() - t0, r.udf_rows_computed.get(udtf.name, 0))
        assert actual(view, schema) == oracle(src.uri, view.source_version, fn), "first refresh"
        t0 = time.perf_counter()
        r = view.refresh(mode="full")
        out["full recompute again"] = (time.perf_counter() - t0, r.udf_rows_computed.get(udtf.name, 0))
        best = None
        for k in range(args.repeat):
            src.add(rows(args.rows + k * args.append, args.append, args.partitions, only=k % args.partitions))
            t0 = time.perf_counter()
            r = view.refresh()
            s = time.perf_counter() - t0
            if best is None or s < best[0]:
                best = (s, r.udf_rows_computed.get(udtf.name, 0))
            assert actual(view, schema) == oracle(src.uri, view.source_version, fn), "after an append"
        out[f"append {args.append} rows to one partition"] = best
        t0 = time.perf_counter()
        r = view.refresh()
        out["no change"] = (time.perf_counter() - t0, r.udf_rows_computed.get(udtf.name, 0))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--append", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"table-function view over {args.rows:,} rows in {args.partitions} partitions (partition_by g), inline, "
          f"best of {args.repeat} appends; every refresh checked against a pyarrow oracle\n")
    for name, fn, schema, inputs in (("cheap (Arrow aggregate)", cheap, OUT_CHEAP, ["g", "x"]),
                                     ("model-like (near-dup detection)", dedup, OUT_DEDUP, ["id", "g", "text"])):
        res = run(name, fn, schema, inputs, args)
        full = res["full recompute again"][0]
        print(f"UDTF: {name}")
        print(f"  {'step':<36} | {'seconds':>8} | {'UDTF calls':>10} | of a full recompute")
        for step, (s, calls) in res.items():
            print(f"  {step:<36} | {s:8.3f} | {calls:>10} | {s / full:8.3f}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
