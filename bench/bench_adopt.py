"""What bringing in a table without stable row ids costs (Connection.enable_stable_row_ids).

Writes a table the way lancedb / lance.write_dataset do by default (no stable
row ids; int64 id, float64 x, a ~100-byte string, a 128-d float32 vector, so
about 0.6 KiB a row) with a BTree index on id, then adopts it. Prints the
adoption's time next to a plain pylance full read (to_table) and a plain
rewrite with stable row ids into a new directory: the ratio to the plain
rewrite is the engine's overhead (goal ~1.0).

Usage: python bench/bench_adopt.py [--rows 1000000] [--dim 128] [--repeat 3]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402


def _table(rows: int, dim: int) -> pa.Table:
    rng = np.random.default_rng(0)
    text = pa.array([f"document {i:012d} " + "x" * 80 for i in range(rows)])
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * dim, dtype=np.float32)), dim)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "text": text, "vec": vec})


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3, help="best of N, the two measured alternately")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench_adopt_")
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
        uri = db.table_uri("t")
        original = os.path.join(root, "original.lance")
        lance.write_dataset(_table(args.rows, args.dim), original)
        lance.dataset(original).create_scalar_index("id", "BTREE")
        size = _size(original)

        t0 = time.perf_counter()
        lance.dataset(original).to_table()
        read_s = time.perf_counter() - t0

        plain_s, adopt_s = [], []
        for _ in range(args.repeat):
            plain, copy = os.path.join(root, "plain.lance"), os.path.join(root, "copy.lance")
            for path in (plain, copy):
                shutil.rmtree(path, ignore_errors=True)
            shutil.copytree(original, copy)  # as for the adoption: a fresh copy is read
            t0 = time.perf_counter()
            lance.write_dataset(lance.dataset(copy).scanner().to_reader(), plain, enable_stable_row_ids=True)
            lance.dataset(plain).create_scalar_index("id", "BTREE")
            plain_s.append(time.perf_counter() - t0)

            shutil.rmtree(uri, ignore_errors=True)
            shutil.copytree(original, uri)
            t0 = time.perf_counter()
            result = db.enable_stable_row_ids("t")
            adopt_s.append(time.perf_counter() - t0)
            assert result.rewritten and lance.dataset(uri).has_stable_row_ids and result.rows == args.rows

        best_plain, best_adopt = min(plain_s), min(adopt_s)
        print(f"rows {args.rows:,}, {size / 2**20:.0f} MiB on disk, {os.cpu_count()} cores, best of {args.repeat}")
        print(f"plain pylance full read (to_table)             {read_s:7.2f} s")
        print(f"plain rewrite with stable row ids + BTree      {best_plain:7.2f} s   all: "
              + " ".join(f"{x:.2f}" for x in plain_s))
        print(f"db.enable_stable_row_ids (mv-assets adopt)     {best_adopt:7.2f} s   all: "
              + " ".join(f"{x:.2f}" for x in adopt_s))
        print(f"  ratio to the plain rewrite {best_adopt / best_plain:.2f}; {size / 2**20 / best_adopt:.0f} MiB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
