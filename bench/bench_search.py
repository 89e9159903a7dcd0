"""Vector search on a view whose index the refreshes keep up to date, against
the same search right after a from-scratch index build, side by side in one run.

A view (``SELECT id, emb FROM docs``) over ``--rows`` source rows with a
``--dim``-d embedding (clustered, as real embeddings are), an IVF_PQ index on
it. Then ``--grow`` (1%) new source rows and one incremental refresh: the
refresh adds the new rows to the index (``optimize_indices``: assigned to the
trained partitions, no retraining). Measured on that view:

* recall@10 of ``--queries`` searches (nprobes ``--nprobes``, refine factor
  ``--refine``) against exact neighbours computed with numpy over the view's
  rows (an oracle independent of Lance), and the median search latency;
* the same after building the index again from scratch on the same rows;
* the refresh's time, and the part of it the index upkeep took.

Goals (issue: Geneva parity): recall within 0.01 of the from-scratch build,
latency within 1.2x; the upkeep's share of the refresh printed.

Usage: .venv/bin/python bench/bench_search.py [--rows 1000000] [--dim 384] [--queries 100]
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")
os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402

LATENT = 32  # embeddings of real text or images lie near a low-dimensional manifold


def embeddings(rng: np.random.Generator, basis: np.ndarray, n: int) -> np.ndarray:
    """Points of a ``LATENT``-d Gaussian mapped to ``basis.shape[1]`` dimensions plus a little
    noise, unit-normalised: clustered in a low-dimensional subspace, as embeddings are
    (uniform noise in 384-d would make every neighbour as near as any other)."""
    z = rng.standard_normal((n, basis.shape[0]), dtype=np.float32)
    v = z @ basis + 0.05 * rng.standard_normal((n, basis.shape[1]), dtype=np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def batch(start: int, v: np.ndarray) -> pa.Table:
    n, dim = v.shape
    return pa.table({"id": np.arange(start, start + n),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), dim)})


def exact_neighbours(ids: np.ndarray, vecs: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    """Top-k ids by L2 distance, by numpy (chunks of rows against all queries)."""
    best_d = np.full((len(queries), 0), np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), 0), dtype=np.int64)
    qn = (queries ** 2).sum(1)[:, None]
    for s in range(0, len(vecs), 200_000):
        chunk = vecs[s:s + 200_000]
        d = qn - 2 * queries @ chunk.T + (chunk ** 2).sum(1)[None, :]
        cand_d = np.concatenate([best_d, d], axis=1)
        cand_i = np.concatenate([best_i, np.broadcast_to(ids[s:s + 200_000], d.shape)], axis=1)
        top = np.argpartition(cand_d, k, axis=1)[:, :k]
        best_d = np.take_along_axis(cand_d, top, 1)
        best_i = np.take_along_axis(cand_i, top, 1)
    return [set(map(int, r)) for r in best_i]


def measure(view, queries: np.ndarray, truth: list[set[int]], k: int, nprobes: int, refine: int | None):
    for q in queries[:5]:  # warm the index cache
        view.search(q).nprobes(nprobes).limit(k).to_arrow()
    lat, hits = [], 0
    for q, t in zip(queries, truth, strict=True):
        s = view.search(q).nprobes(nprobes).select(["id"]).limit(k)
        if refine:
            s = s.refine_factor(refine)
        t0 = time.perf_counter()
        got = s.to_arrow()
        lat.append(time.perf_counter() - t0)
        hits += len(set(got.column("id").to_pylist()) & t)
    return hits / (k * len(queries)), statistics.median(lat)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--grow", type=float, default=0.01, help="share of new source rows before the refresh")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=None, help="IVF partitions (default: Lance's choice)")
    ap.add_argument("--nprobes", type=int, default=20)
    ap.add_argument("--refine", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((LATENT, args.dim), dtype=np.float32) / np.sqrt(LATENT)
    root = tempfile.mkdtemp(prefix="mv_bench_search_")
    db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
    src = db.create_table("docs", None, schema=batch(0, np.zeros((0, args.dim), np.float32)).schema, primary_key="id")
    for s in range(0, args.rows, 250_000):
        n = min(250_000, args.rows - s)
        src.add(batch(s, embeddings(rng, basis, n)))
    view = db.create_materialized_view("v", src.search(None).select(["id", "emb"]))
    t0 = time.perf_counter()
    db.refresh("v")
    first_refresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    view.create_index(metric="l2", num_partitions=args.partitions, num_sub_vectors=args.dim // 8,
                      vector_column_name="emb", index_type="IVF_PQ")
    build = time.perf_counter() - t0
    grow = int(args.rows * args.grow)
    src.add(batch(args.rows, embeddings(rng, basis, grow)))
    r = db.refresh("v")
    upkeep = r.timings.get("index_s", 0.0)
    (info,) = view.list_indices()
    assert info.num_unindexed_rows == 0, info
    segments = view.index_stats("emb_idx")["num_indices"]
    rows = view.to_arrow()
    ids = np.asarray(rows.column("id").to_numpy())
    vecs = np.asarray(rows.column("emb").combine_chunks().flatten().to_numpy()).reshape(-1, args.dim)
    queries = embeddings(rng, basis, args.queries)
    truth = exact_neighbours(ids, vecs, queries, args.k)
    recall_inc, lat_inc = measure(view, queries, truth, args.k, args.nprobes, args.refine)
    t0 = time.perf_counter()
    lance.dataset(view.uri).create_index("emb", index_type="IVF_PQ", name="emb_idx", replace=True, metric="l2",
                                         num_sub_vectors=args.dim // 8,
                                         **({"num_partitions": args.partitions} if args.partitions else {}))
    rebuild = time.perf_counter() - t0
    recall_new, lat_new = measure(view, queries, truth, args.k, args.nprobes, args.refine)
    # a second from-scratch build: how much recall moves from one training run to the next
    lance.dataset(view.uri).create_index("emb", index_type="IVF_PQ", name="emb_idx", replace=True, metric="l2",
                                         num_sub_vectors=args.dim // 8,
                                         **({"num_partitions": args.partitions} if args.partitions else {}))
    recall_again, _ = measure(view, queries, truth, args.k, args.nprobes, args.refine)
    n = view.count_rows()
    print(f"\nvector search on a view kept indexed by its refreshes: {n:,} rows x {args.dim}-d, IVF_PQ "
          f"(nprobes {args.nprobes}{f', refine {args.refine}' if args.refine else ''}), {args.queries} queries, "
          f"recall@{args.k} against exact neighbours by numpy")
    print(f"  first refresh {first_refresh:.1f} s; index build {build:.1f} s")
    print(f"  refresh after +{grow:,} rows: {r.seconds:.2f} s, of which index upkeep {upkeep:.2f} s "
          f"({upkeep / r.seconds:.0%}; rebuilding from scratch instead: {rebuild:.1f} s); the index has "
          f"{segments} segment(s) after it")
    print(f"  {'index':<34} | recall@{args.k} | median latency ms")
    print(f"  {'kept up to date by the refresh':<34} | {recall_inc:9.3f} | {lat_inc * 1e3:8.2f}")
    print(f"  {'built from scratch on the same rows':<34} | {recall_new:9.3f} | {lat_new * 1e3:8.2f}")
    print(f"  {'built from scratch again':<34} | {recall_again:9.3f} |")
    print(f"  recall difference {recall_new - recall_inc:+.3f} (goal <= 0.01; two from-scratch builds differ by "
          f"{abs(recall_new - recall_again):.3f}); latency ratio {lat_inc / lat_new:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
