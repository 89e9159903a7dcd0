"""Memory of a view refresh reading a blob column (videos stored as Lance blobs), side by side.

A UDF reading a blob column gets its bytes; a scan batch holds every blob byte of its rows at
once. The engine sizes the scan batches of blob columns by the largest row's blob bytes
(``execution.blobs.scan_options``: at most ``SCAN_BYTES``, 32 MiB, a batch, and ``READ_AHEAD``
batches read ahead, not Lance's 16). This bench prints, in
one run, the peak resident memory of a process doing each of:

* plain loop: pylance ``scanner(blob_handling="all_binary")`` at its default batch size, the UDF
  over each batch, ``lance.write_dataset`` (what a user writes by hand);
* mv_assets, scans unbounded: the inline refresh with the budget lifted (as before the engine
  bounded them: 8,192 rows a batch, 16 read ahead);
* mv_assets: the inline refresh as it runs.

Each runs in a fresh process (``ru_maxrss`` of the child), over the same dataset: ``--rows``
videos of ``--mb`` MiB in ``--fragments`` fragments. The values are checked (the view's column
equals each video's length).

Usage: python bench/bench_blob_memory.py [--rows 96] [--mb 8] [--fragments 2] [--root DIR]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, resource, sys, time
import lance, pyarrow as pa
root, mode = sys.argv[1], sys.argv[2]
src_uri = os.path.join(root, "src.lance")
start = time.perf_counter()
if mode == "plain":
    ds = lance.dataset(src_uri)
    out = []
    for b in ds.scanner(columns=["id", "video"], blob_handling="all_binary").to_batches():
        sizes = pa.array([None if v is None else len(v) for v in b.column("video").to_pylist()], pa.int64())
        out.append(pa.RecordBatch.from_arrays([b.column("id"), sizes], names=["id", "n"]))
    lance.write_dataset(pa.Table.from_batches(out), os.path.join(root, "plain.lance"), mode="overwrite")
    got = {r["id"]: r["n"] for r in pa.Table.from_batches(out).to_pylist()}
else:
    import mv_assets as mv
    if mode == "unbounded":
        from mv_assets.execution import blobs
        blobs.SCAN_BYTES, blobs.READ_AHEAD = 1 << 62, 16
    from lance.blob import BlobFile

    @mv.udf(input_columns=["video"])
    def n(video: BlobFile) -> int:
        return len(video.read())

    db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
    src = db.open_table("src")
    name = f"v_{mode}"
    if name in db.table_names():
        db.drop_table(name)
    view = db.create_materialized_view(name, src.search(None).select({"id": "id", "n": n}))
    view.refresh()
    got = {r["id"]: r["n"] for r in view.to_arrow().to_pylist()}
seconds = time.perf_counter() - start
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": seconds,
                  "got": got}))
"""


def _make(root: str, rows: int, mb: int, fragments: int) -> dict[int, int]:
    import lance
    import pyarrow as pa

    import mv_assets as mv

    schema = pa.schema([pa.field("id", pa.int64()),
                        pa.field("video", pa.large_binary(), metadata={"lance-encoding:blob": "true"})])
    db = mv.connect(os.path.join(root, "catalog"))
    per = -(-rows // fragments)
    expected = {}
    table = None
    for lo in range(0, rows, per):
        ids = list(range(lo, min(rows, lo + per)))
        videos = [os.urandom(mb * 1024 * 1024 - i) for i in ids]  # sizes differ a little
        expected.update({i: len(v) for i, v in zip(ids, videos, strict=True)})
        data = pa.table({"id": ids, "video": videos}, schema=schema)
        if table is None:
            table = db.create_table("src", data, primary_key="id")
        else:
            table.add(data)
    os.symlink(os.path.join(root, "catalog", "src.lance"), os.path.join(root, "src.lance"))
    assert lance.dataset(os.path.join(root, "src.lance")).count_rows() == rows
    return expected


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--fragments", type=int, default=2)
    ap.add_argument("--root", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-blob-", dir=args.root)
    try:
        started = time.perf_counter()
        expected = _make(root, args.rows, args.mb, args.fragments)
        total_mb = sum(expected.values()) / 2**20
        print(f"blob column memory: {args.rows} videos of {args.mb} MiB ({total_mb:.0f} MiB) in {args.fragments} "
              f"fragments, written in {time.perf_counter() - started:.1f}s")
        print(f"  {'configuration':<34} {'peak RSS MiB':>12} {'x data':>7} {'seconds':>8}")
        for mode, label in (("plain", "plain pylance loop (default batch)"),
                            ("unbounded", "mv_assets, scans unbounded"), ("bounded", "mv_assets")):
            out = subprocess.run([sys.executable, "-c", CHILD, root, mode], capture_output=True, text=True,
                                 check=True, env={**os.environ, "LANCE_LOG": "error"})
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got = {int(k): v for k, v in r["got"].items()}
            assert got == expected, f"{mode}: values differ"
            print(f"  {label:<34} {r['peak_mb']:>12.0f} {r['peak_mb'] / total_mb:>7.2f} {r['seconds']:>8.2f}")
        print("  values: every row's length equals its video's (all three)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
