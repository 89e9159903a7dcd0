"""Small writes and small refreshes against their floors, side by side in one run.

Default (the floors): for each table size (1M and 10M rows; ``--rows`` to go
smaller), alternated round by round (which side runs first flips), medians of
``--repeat`` rounds (>= 5):

* ``Table.add()`` of 10 rows to a table with a primary key / a bare pylance
  append of the same 10 rows (``lance.write_dataset(..., mode="append")``:
  write + commit), and add() at each size / add() at the smallest;
* ``Table.merge_insert()`` of 10 new keys / the same bare append;
* ``refresh()`` after that 10-row append (a 1:1 view: filter, SQL column,
  scalar ``@udf``) / the same bare append;
* ``refresh()`` with nothing new / opening the dataset at its latest version
  (``lance.dataset(uri)``);

plus what one refresh of each kind opens and reads in Lance (dataset opens,
version checkouts, transactions read), the primary key index's state, and the
view checked against an oracle (pyarrow over the source at the version the
view reflects; the script exits 1 when it differs, or when add() accepts a key
the table holds).

``--spark``: the earlier comparison instead, small incremental refreshes with
the default automatic choice (driver-local when the estimated work is small)
against a forced Spark job (a warm local Spark session, start-up excluded).

Usage: python bench/bench_small_refresh.py [--rows 1000000,10000000] [--repeat 9]
       python bench/bench_small_refresh.py --spark [--rows 200000] [--append 1000] [--master local[2]]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import mv_assets as mv  # noqa: E402

SMALL = 10  # rows per small write


@mv.udf
def model_score(x: float) -> float:
    """Stands in for a model call: ~20 microseconds of Python per row."""
    acc = x
    for k in range(60):
        acc = (acc * 1.0001 + k) % 997.0
    return acc


@mv.udf
def score(x: float) -> float:
    """A cheap scalar UDF (the floors' view)."""
    return x * 3.0 + 1.0


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": np.arange(start, start + n), "x": np.random.default_rng(start).random(n)})


# -- the floors -------------------------------------------------------------


class Pair:
    """Timings of one measure and its floor, taken alternately."""

    def __init__(self, what: str, floor: str, goal: str) -> None:
        self.what, self.floor, self.goal = what, floor, goal
        self.ours: list[float] = []
        self.base: list[float] = []

    def run(self, ours: Callable[[], object], base: Callable[[], object], first_ours: bool) -> None:
        order = [(ours, self.ours), (base, self.base)]
        for f, out in order if first_ours else order[::-1]:
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.base)

    def line(self, size: str) -> str:
        m, b = statistics.median(self.ours) * 1e3, statistics.median(self.base) * 1e3
        return (f"  {size:>4}  {self.what:44s} {m:8.2f} ms   {self.floor:34s} {b:7.2f} ms   "
                f"{self.ratio:5.2f}x  (goal {self.goal})")


class Counts:
    """Lance calls made while counting: dataset opens, checkouts of other versions, transactions read."""

    def __init__(self) -> None:
        self.n = {"opens": 0, "checkouts": 0, "transactions": 0}
        self._undo: list = []

    def __enter__(self) -> "Counts":
        for owner, name, key in ((lance, "dataset", "opens"), (lance.LanceDataset, "checkout_version", "checkouts"),
                                 (lance.LanceDataset, "read_transaction", "transactions"),
                                 (lance.LanceDataset, "get_transactions", "transactions")):
            real = getattr(owner, name)

            def counted(*a, _real=real, _key=key, **k):
                self.n[_key] += 1
                return _real(*a, **k)

            self._undo.append((owner, name, real))
            setattr(owner, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._undo):
            setattr(owner, name, real)

    def __str__(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in self.n.items())


def oracle_check(view, src_uri: str) -> str | None:
    """The view's rows against pyarrow over the source at the version it reflects; None when equal."""
    src = lance.dataset(src_uri, version=view.source_version).to_table(columns=["id", "x"])
    want = src.filter(pc.greater(src.column("x"), 0.1)).sort_by("id")
    got = view.to_arrow().select(["id", "x", "y", "s"]).sort_by("id")
    if got.num_rows != want.num_rows:
        return f"{got.num_rows:,} rows, the oracle {want.num_rows:,}"
    if got.column("id") != want.column("id") or got.column("x") != want.column("x"):
        return "ids or x differ"
    x = want.column("x").to_numpy()
    if not np.allclose(got.column("y").to_numpy(), x * 2) or not np.allclose(got.column("s").to_numpy(), x * 3.0 + 1.0):
        return "computed columns differ"
    return None


class PlainLoop:
    """What a small refresh must do, in plain pylance, on copies of the source
    and the view: open both in one session, scan the new fragment with the
    view's filter and SQL column (its row ids and versions too), call the UDF
    in a Python loop, write a fragment and commit an Append carrying a state
    property. No status, lock, plan, checks or index upkeep: the floor below
    the engine's own work."""

    def __init__(self, root: str, base: pa.Table) -> None:
        from lance import LanceOperation, Transaction  # noqa: F401  (checked here: the loop uses them)

        self.session = lance.Session()
        self.src = os.path.join(root, f"plain_src_{base.num_rows}.lance")
        self.view = os.path.join(root, f"plain_view_{base.num_rows}.lance")
        lance.write_dataset(base, self.src)
        x = base.column("x")
        view = pa.table({"__source_row_id": pa.array(np.arange(base.num_rows), pa.int64()),
                         "__source_row_version": pa.array(np.ones(base.num_rows, np.int64)), "id": base["id"],
                         "x": x, "y": pc.multiply(x, 2), "s": pc.add(pc.multiply(x, 3.0), 1.0),
                         "__computed__s": pa.array(["0123456789abcdef"] * base.num_rows)})
        lance.write_dataset(view.filter(pc.greater(x, 0.1)), self.view)

    def append(self, data: pa.Table) -> None:
        lance.write_dataset(data, self.src, mode="append", session=self.session)

    def refresh(self) -> None:
        import json

        from lance import LanceOperation, Transaction
        from lance.fragment import write_fragments

        src = lance.dataset(self.src, session=self.session)
        view = lance.dataset(self.view, session=self.session)
        fragment = src.get_fragment(max(src.fragment_ids()))
        t = fragment.scanner(columns={"id": "id", "x": "x", "y": "x * 2", "v": "_row_last_updated_at_version"},
                             filter="x > 0.1", with_row_id=True).to_table()
        s = pa.array([score.func(x) for x in t.column("x").to_pylist()], pa.float64())
        out = pa.table({"__source_row_id": t["_rowid"].cast(pa.int64()), "__source_row_version": t["v"].cast(pa.int64()),
                        "id": t["id"], "x": t["x"], "y": t["y"], "s": s,
                        "__computed__s": pa.array(["0123456789abcdef"] * t.num_rows)})
        txn = Transaction(read_version=view.version, operation=LanceOperation.Append(write_fragments(out, view)),
                          transaction_properties={"state": json.dumps({"source_version": src.version})})
        lance.LanceDataset.commit(view, txn, read_version=view.version)


def floors(n: int, repeat: int, root: str) -> tuple[dict[str, Pair], list[str], list[str]]:
    """The measures at ``n`` rows: (pairs, notes, failures)."""
    notes: list[str] = []
    failures: list[str] = []
    db = mv.connect(os.path.join(root, f"catalog_{n}"), runner=mv.InlineRunner())
    base = rows(0, n)
    t0 = time.perf_counter()
    src = db.create_table("t", base, primary_key="id")
    bare_uri = os.path.join(root, f"bare_{n}.lance")
    lance.write_dataset(base, bare_uri)
    plain = PlainLoop(root, base)
    del base
    v = db.create_materialized_view("v", src.search(None).where("x > 0.1").select(
        {"id": "id", "x": "x", "y": "x * 2", "s": score}))
    v.refresh()
    notes.append(f"set-up (table, bare copy, first refresh) {time.perf_counter() - t0:.1f} s")
    nxt = [n]

    def fresh() -> pa.Table:
        nxt[0] += SMALL
        return rows(nxt[0] - SMALL, SMALL)

    def bare() -> None:
        lance.write_dataset(fresh(), bare_uri, mode="append")

    t0 = time.perf_counter()
    src.add(fresh())  # the first add of a big table builds its primary key index
    notes.append(f"first add() {time.perf_counter() - t0:.2f} s (builds the key index); {_key_index(src)}")
    v.refresh()
    pairs = {
        "add": Pair(f"add() {SMALL} rows, primary key", "bare pylance append", "<= 2x"),
        "merge": Pair(f"merge_insert() {SMALL} new keys", "bare pylance append", "O(rows)"),
        "refresh": Pair(f"refresh() after a {SMALL}-row add()", "bare pylance append", "<= 2x"),
        "noop": Pair("refresh(), nothing new", "lance.dataset(uri) (latest)", "<= 2x"),
        # the floor below the engine: what a refresh must do, in plain pylance (PlainLoop)
        "plain": Pair("plain pylance refresh loop, 10 new rows", "bare pylance append", "(the floor)"),
        "overhead": Pair(f"refresh() after a {SMALL}-row add()", "plain pylance refresh loop", "(the engine's)"),
    }
    for r in range(-2, repeat):  # two warm-up rounds, not kept
        first = r % 2 == 0
        pairs["add"].run(lambda: src.add(fresh()), bare, first)
        pairs["refresh"].run(v.refresh, bare, not first)
        pairs["noop"].run(v.refresh, lambda: lance.dataset(v.uri), first)
        pairs["merge"].run(lambda: src.merge_insert(fresh()), bare, not first)
        v.refresh()  # (the merged rows: the next timed refresh reads one add's rows only)
        plain.append(fresh())
        pairs["plain"].run(plain.refresh, bare, first)
        src.add(fresh())
        plain.append(fresh())
        pairs["overhead"].run(v.refresh, plain.refresh, not first)
        if r < 0:
            for p in pairs.values():
                p.ours.clear()
                p.base.clear()
    src.add(fresh())
    with Counts() as c:
        v.refresh()
    notes.append(f"one refresh after an add: {c}")
    with Counts() as c:
        v.refresh()
    notes.append(f"one refresh with nothing new: {c}")
    with Counts() as c:
        src.add(fresh())
    notes.append(f"one add(): {c}")
    try:
        src.add(rows(n // 2, SMALL))
        failures.append(f"{n:,} rows: add() accepted keys the table holds")
    except ValueError:
        pass
    notes.append(_key_index(src))
    v.refresh()
    wrong = oracle_check(v, src.uri)
    notes.append(f"view vs oracle at source version {v.source_version}: {'equal' if wrong is None else wrong}")
    if wrong is not None:
        failures.append(f"{n:,} rows: the view differs from the oracle: {wrong}")
    return pairs, notes, failures


def _key_index(table) -> str:
    """The primary key index's state (``Table.primary_key_index``; a version without one: said so)."""
    return str(getattr(table, "primary_key_index", "(this version keeps no primary key index)"))


def run_floors(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.rows.split(",")] if args.rows else [1_000_000, 10_000_000]
    root = tempfile.mkdtemp(prefix="mv_bench_small_")
    results: dict[int, dict[str, Pair]] = {}
    failures: list[str] = []
    print(f"\nsmall writes and refreshes against their floors: medians of {args.repeat} alternated rounds, "
          f"{SMALL} rows each")
    try:
        for n in sizes:
            pairs, notes, failed = floors(n, args.repeat, root)
            results[n] = pairs
            failures += failed
            print(f"\n{n:,} rows")
            for p in pairs.values():
                print(p.line(_size(n)))
            for note in notes:
                print(f"    {note}")
            for done in (f"catalog_{n}", f"bare_{n}.lance", f"plain_src_{n}.lance", f"plain_view_{n}.lance"):
                shutil.rmtree(os.path.join(root, done), ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    smallest = min(results)
    print("\nside by side")
    for key in ("add", "merge", "refresh", "noop", "plain", "overhead"):
        for n, pairs in results.items():
            print(pairs[key].line(_size(n)))
    for n, pairs in results.items():
        if n != smallest:
            growth = statistics.median(pairs["add"].ours) / statistics.median(results[smallest]["add"].ours)
            print(f"  add() at {_size(n)} / add() at {_size(smallest)}: {growth:.2f}x (goal <= 1.3x)")
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


# -- the Spark comparison (--spark) --------------------------------------------


def run_spark(args: argparse.Namespace) -> int:
    n = int(args.rows or 200_000)
    root = tempfile.mkdtemp(prefix="mv_bench_small_")
    auto = mv.SparkRunner(master=args.master)                   # the default choice
    forced = mv.SparkRunner(master=args.master, local_below_rows=0)  # always a Spark job
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=forced)
        src = db.create_table("t", rows(0, n))
        v = db.create_materialized_view("v", src.search(None).select({"id": "id", "s": model_score}))
        first = v.refresh()  # on Spark (also warms the session); measures the cost per row
        print(f"\nsmall refresh benchmark: {n:,} rows, +{args.append:,} per refresh, Spark {args.master}")
        print(f"  first refresh {first.seconds:.2f} s on {first.runner}; measured "
              f"{v.refresh_state().seconds_per_row * 1e6:.1f} us/row")
        results: dict[str, list] = {"auto": [], "spark job": []}
        start = n
        for _ in range(3):
            for label, runner in (("auto", auto), ("spark job", forced)):
                src.add(rows(start, args.append))
                start += args.append
                t0 = time.perf_counter()
                r = v.refresh(runner=runner)
                results[label].append((time.perf_counter() - t0, r.runner, r.udf_rows_computed.get("s", 0)))
        for label, rs in results.items():
            best = min(rs)
            print(f"  {label:10s} best {best[0]:.3f} s  path {best[1]:20s} rows computed {best[2]}")
        print(f"  ratio auto / spark job: {min(results['auto'])[0] / min(results['spark job'])[0]:.2f}"
              f"  (Spark session started by auto: {auto.started})")
        # a no-op refresh reads versions and state only: O(1) in the view's size
        small = db.create_table("small", rows(0, 1000))
        sv = db.create_materialized_view("sv", small.search(None).select({"id": "id", "x": "x"}))
        sv.refresh(runner=mv.InlineRunner())
        v.refresh(runner=auto)
        noop = {}
        for name, view in (("1k-row view", sv), (f"{v.count_rows():,}-row view", v)):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                r = view.refresh(runner=auto)
                times.append(time.perf_counter() - t0)
                assert r.runner == "none"
            noop[name] = min(times)
        (a_name, a_s), (b_name, b_s) = noop.items()
        print(f"  no-op refresh: {a_name} {a_s * 1000:.1f} ms, {b_name} {b_s * 1000:.1f} ms (ratio {b_s / a_s:.2f})")
    finally:
        auto.stop()
        forced.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=None,
                    help="table sizes, comma-separated (default 1000000,10000000; --spark: one size, 200000)")
    ap.add_argument("--repeat", type=int, default=9, help="rounds per measure (medians; at least 5)")
    ap.add_argument("--spark", action="store_true", help="the driver-local vs Spark job comparison instead")
    ap.add_argument("--append", type=int, default=1000, help="--spark: rows appended per refresh")
    ap.add_argument("--master", default="local[2]", help="--spark: the Spark master")
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat: at least 5 rounds")
    sys.exit(run_spark(args) if args.spark else run_floors(args))


if __name__ == "__main__":
    main()
