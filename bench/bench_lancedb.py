"""mv_assets vs lancedb 0.40's own incremental materialized views, side by side.

The same SQL-only view on both sides -- ``SELECT id, x * 2 + 1 AS y FROM src WHERE
x >= 0.1`` -- over the same data, each side with its own source table, each side in
its own interpreter: lancedb in its own venv (``.venv-lancedb``, never a dependency
of this project), mv_assets (inline runner) in this one. This script orchestrates
two worker processes (itself, run with ``--worker``), sends them the same writes,
times only their refresh calls (measured inside the worker) and checks both views
after every refresh against a plain pyarrow oracle over the source at the version
the view was refreshed to.

Steps: first refresh (full), full refresh again (best of --repeat), append 1% then
refresh, delete 1% then refresh, update 1% (``x = 1 - x``: rows move in and out of
the filter) then refresh, compaction then refresh (0.1% appended in 4 small fragments and
0.1% deleted, both views refreshed untimed, then the source compacted by Lance's
``compact_files`` on both sides: the timed refresh follows the compaction alone), append
10 rows then refresh, no-change refresh. Every
incremental step is repeated (--repeat, at least 5 for the small ones); the best of
each side and the ratio of their medians are shown. Each side refreshes first every
other round and writes in that order (each side's writes are the newest every other
round: they may still be settling on disk). The deleted / updated 1% is a contiguous id range and, as a separate step,
``id % 100 = k`` (rows in every fragment); ``--pattern`` keeps one of them. Each step
after the full refreshes starts from a copy of both sides as the first refresh left
them (a new path per step), so one step's history does not slow the next; within a
step the rounds follow one another (both engines slow down as deletions pile up:
see the per-round times printed below the table). ``--profile`` adds one more, unmeasured, round
of the delete / update / append-10 steps whose mv_assets refresh runs under cProfile.

Usage: .venv/bin/python bench/bench_lancedb.py [--rows 1000000] [--repeat 3] [--profile]
The lancedb venv is created if missing:
    python3 -m venv .venv-lancedb && .venv-lancedb/bin/pip install lancedb==0.40.0 pylance pyarrow
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LANCEDB_VENV = os.path.join(REPO, ".venv-lancedb")
LANCEDB_PY = os.path.join(LANCEDB_VENV, "bin", "python")
LANCEDB_VERSION = "0.40.0"

WHERE = "x >= 0.1"
EXPR = "x * 2 + 1"


# -- worker side: one per engine, in its own interpreter ---------------------

class LanceDBSide:
    def __init__(self, root: str, data: str | None) -> None:
        """A new source table from ``data`` (Arrow IPC file) and its empty view,
        or (``data=None``) the ones in an existing copy at ``root``."""
        import lancedb
        import pyarrow as pa

        self.root = root
        self.db = lancedb.connect(root)
        if data is None:
            self.src = self.db.open_table("src")
            self.view = self.db.open_materialized_view("v")
        else:
            table = pa.ipc.open_file(data).read_all()
            self.src = self.db.create_table("src", table, storage_options={"new_table_enable_stable_row_ids": "true"})
            self.view = self.db.create_materialized_view(
                "v", "src", select={"id": "id", "y": EXPR}, where=WHERE, with_no_data=True)
        self.src_uri = os.path.join(root, "src.lance")
        self.view_uri = os.path.join(root, "v.lance")

    def refresh(self, full: bool) -> tuple[float, int, dict]:
        t0 = time.perf_counter()
        r = self.view.refresh(full=full)
        s = time.perf_counter() - t0
        return s, r.source_version, {"mode": r.mode, "rows_written": r.rows_written}

    def add(self, table) -> None:
        self.src.add(table)

    def delete(self, where: str) -> None:
        self.src.delete(where)

    def update(self, where: str, values_sql: dict) -> None:
        self.src.update(where=where, values_sql=values_sql)

    def compact(self) -> None:
        import warnings

        with warnings.catch_warnings():  # (compact_files: deprecated for optimize(), which also prunes and indexes)
            warnings.simplefilter("ignore")
            self.src.compact_files()  # Lance's compact_files with its defaults


class MvAssetsSide:
    def __init__(self, root: str, data: str | None) -> None:
        import pyarrow as pa

        import mv_assets as mv

        self.root = root
        self.db = mv.connect(root, runner=mv.InlineRunner())
        if data is None:
            self.src = self.db.open_table("src")
            view = self.db.open_view("v")
        else:
            table = pa.ipc.open_file(data).read_all()
            self.src = self.db.create_table("src", table, primary_key="id")
            q = self.src.search(None).where(WHERE).select({"id": "id", "y": EXPR})
            view = self.db.create_materialized_view("v", q)
        self.src_uri = self.src.uri
        self.view_uri = view.uri

    def refresh(self, full: bool) -> tuple[float, int, dict]:
        t0 = time.perf_counter()
        r = self.db.refresh("v", mode="full" if full else "auto")
        s = time.perf_counter() - t0
        info = {"full": r.full, "inserted": r.rows_inserted, "updated": r.rows_updated,
                "deleted": r.rows_deleted, "timings": {k: round(v, 4) for k, v in r.timings.items()}}
        return s, r.to_version, info

    def add(self, table) -> None:
        self.src.add(table)

    def delete(self, where: str) -> None:
        self.src.delete(where)

    def update(self, where: str, values_sql: dict) -> None:
        self.src.update(where, values_sql=values_sql)

    def compact(self) -> None:
        self.src.compact_files()  # Lance's compact_files with its defaults


def profile_text(prof) -> str:
    import io
    import pstats

    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("cumulative").print_stats(15)
    out.write("   -- by own time --\n")
    st.sort_stats("tottime").print_stats(8)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    keep = []
    for ln in lines:  # drop pstats' preamble lines, keep the header and the rows
        if ln.lstrip().startswith(("Ordered by", "List reduced")) or " function calls " in ln:
            continue
        keep.append("   " + ln.replace(REPO + "/", "").replace(sys.prefix + "/", ""))
    return "\n".join(keep)


def worker(side: str) -> None:
    """Serves JSON commands on stdin, one reply per line on the real stdout."""
    import pyarrow as pa

    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr
    eng = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            out: dict = {}
            if op == "setup":
                cls = LanceDBSide if side == "lancedb" else MvAssetsSide
                eng = cls(cmd["root"], cmd["data"])
                out = {"src_uri": eng.src_uri, "view_uri": eng.view_uri}
                if side == "lancedb":
                    import lancedb
                    out["version"] = lancedb.__version__
            elif op == "snapshot":  # a copy of the source and view as they are now
                shutil.copytree(eng.root, cmd["dst"])
            elif op == "clone":  # continue on a fresh copy of a snapshot, at a path never opened before
                previous = eng.root
                del eng
                shutil.copytree(cmd["src"], cmd["dst"])
                eng = (LanceDBSide if side == "lancedb" else MvAssetsSide)(cmd["dst"], None)
                if cmd.get("drop_previous"):
                    shutil.rmtree(previous, ignore_errors=True)
                out = {"src_uri": eng.src_uri, "view_uri": eng.view_uri}
            elif op == "refresh":
                if cmd.get("profile"):
                    import cProfile
                    prof = cProfile.Profile()
                    prof.enable()
                    s, v, info = eng.refresh(cmd.get("full", False))
                    prof.disable()
                    out["profile"] = profile_text(prof)
                else:
                    s, v, info = eng.refresh(cmd.get("full", False))
                out.update(s=s, src_version=v, info=info)
            elif op == "add":
                eng.add(pa.ipc.open_file(cmd["data"]).read_all())
            elif op == "delete":
                eng.delete(cmd["where"])
            elif op == "update":
                eng.update(cmd["where"], cmd["values_sql"])
            elif op == "compact":
                eng.compact()
            elif op == "quit":
                reply.write(json.dumps({"ok": True}) + "\n")
                reply.flush()
                return
            out["ok"] = True
        except Exception as exc:  # reported to the orchestrator, which stops
            import traceback
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        reply.write(json.dumps(out) + "\n")
        reply.flush()


# -- orchestrator ------------------------------------------------------------

class Worker:
    def __init__(self, side: str, python: str) -> None:
        self.side = side
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO if side == "mv_assets" else ""
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", side], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.side} worker died (exit {self.proc.wait()})")
        out = json.loads(line)
        if not out.get("ok"):
            raise RuntimeError(f"{self.side} worker: {out['error']}\n{out.get('trace', '')}")
        return out

    def close(self) -> None:
        try:
            self.call(op="quit")
        except Exception:
            pass
        self.proc.wait(timeout=60)


def ensure_lancedb_venv() -> None:
    ok = os.path.exists(LANCEDB_PY) and subprocess.run(
        [LANCEDB_PY, "-c", f"import lancedb, sys; sys.exit(lancedb.__version__ != {LANCEDB_VERSION!r})"],
        capture_output=True).returncode == 0
    if ok:
        return
    how = (f"python3 -m venv {LANCEDB_VENV} && {LANCEDB_VENV}/bin/pip install "
           f"lancedb=={LANCEDB_VERSION} pylance pyarrow")
    print(f"creating the lancedb venv: {how}", flush=True)
    r = subprocess.run(how, shell=True)
    if r.returncode != 0:
        sys.exit(f"could not create the lancedb venv (no network?); create it with:\n  {how}")


def make_rows(start: int, n: int, seed: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "x": rng.random(n), "category": pa.array((ids % 17).astype(str))})


def write_ipc(table, path: str) -> str:
    import pyarrow as pa

    with pa.ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    return path


def sorted_pairs(ids, ys):
    import numpy as np

    order = np.argsort(ids, kind="stable")
    return ids[order], ys[order]


def oracle(src_uri: str, version: int):
    """The expected (id, y) rows, by plain pyarrow over the source at ``version``."""
    import lance
    import pyarrow.compute as pc

    t = lance.dataset(src_uri, version=version).to_table(columns=["id", "x"])
    kept = t.filter(pc.greater_equal(t.column("x"), 0.1))
    y = pc.add(pc.multiply(kept.column("x"), 2.0), 1.0)
    return sorted_pairs(kept.column("id").to_numpy(), y.to_numpy())


def check(label: str, side: str, view_uri: str, expected) -> bool:
    import lance
    import numpy as np

    t = lance.dataset(view_uri).to_table(columns=["id", "y"])
    ids, ys = sorted_pairs(t.column("id").to_numpy(), t.column("y").to_numpy())
    eids, eys = expected
    if len(ids) == len(eids) and np.array_equal(ids, eids) and np.array_equal(ys, eys):
        return True
    dup = len(ids) - len(np.unique(ids))
    missing = len(np.setdiff1d(eids, ids))
    extra = len(np.setdiff1d(ids, eids))
    wrong = 0
    if not missing and not extra and not dup:
        wrong = int((ys != eys).sum())
    print(f"\n!!!!!! FAILURE [{label}] {side} view is wrong: {len(ids):,} rows vs {len(eids):,} expected; "
          f"missing {missing:,}, extra {extra:,}, duplicate ids {dup:,}, wrong y {wrong:,} !!!!!!\n", flush=True)
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each step (small steps: at least 5); best shown")
    ap.add_argument("--pattern", choices=["range", "scattered", "both"], default="both",
                    help="deleted/updated 1%%: a contiguous id range, id %% 100 = k (every fragment), or both")
    ap.add_argument("--profile", action="store_true",
                    help="one more round of delete/update/append-10 with the mv_assets refresh under cProfile")
    ap.add_argument("--worker", choices=["lancedb", "mv_assets"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0

    n, rep = args.rows, max(1, args.repeat)
    small_rep = max(rep, 5)
    ensure_lancedb_venv()
    root = tempfile.mkdtemp(prefix="mv_bench_lancedb_")
    started = time.perf_counter()
    failures: list[str] = []
    sides = {}
    try:
        data_dir = os.path.join(root, "data")
        os.makedirs(data_dir)
        seq = [0]

        def data_file(table) -> str:
            seq[0] += 1
            return write_ipc(table, os.path.join(data_dir, f"{seq[0]}.arrow"))

        sides = {"lancedb": Worker("lancedb", LANCEDB_PY), "mv_assets": Worker("mv_assets", sys.executable)}
        initial = data_file(make_rows(0, n, seed=0))
        setup = {k: w.call(op="setup", root=os.path.join(root, k), data=initial) for k, w in sides.items()}
        try:
            head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  cwd=REPO).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "mv_assets"], capture_output=True, text=True,
                                   cwd=REPO).stdout.strip()
            engine = f"mv_assets at {head}{' + uncommitted changes' if dirty else ''}"
        except OSError:
            engine = "mv_assets"
        print(f"{engine} vs lancedb {setup['lancedb']['version']}: view SELECT id, {EXPR} AS y FROM src WHERE {WHERE}; "
              f"{n:,} source rows, {os.cpu_count()} cores, best of {rep} ({small_rep} for small steps), "
              f"1% deletes/updates: {args.pattern}", flush=True)

        results: dict[str, dict[str, list]] = {}  # step -> side -> [(seconds, info)]
        profiles: dict[str, str] = {}
        order: list[str] = []

        import numpy as np

        turn = [0]

        def refresh_both(step: str, full: bool = False, profile: bool = False, record: bool = True) -> None:
            expected = None
            # each side goes first every other timed round (the other's writes still settling); an
            # untimed refresh (between a step's writes) does not move the turn
            turn[0] += 1 if record else 0
            both = list(sides.items())
            for k, w in (both if turn[0] % 2 else both[::-1]):
                out = w.call(op="refresh", full=full, profile=profile and k == "mv_assets")
                if "profile" in out:
                    profiles[step] = out["profile"]
                if record:
                    if step not in results:
                        results[step] = {s: [] for s in sides}
                        order.append(step)
                    results[step][k].append((out["s"], out["info"]))
                exp = oracle(setup[k]["src_uri"], out["src_version"])
                if expected is None:
                    expected = exp
                elif not (np.array_equal(exp[0], expected[0]) and np.array_equal(exp[1], expected[1])):
                    print(f"\n!!!!!! FAILURE [{step}] the two sources differ !!!!!!\n", flush=True)
                    failures.append(f"{step}: the two sources differ")
                if not check(step, k, setup[k]["view_uri"], exp):
                    failures.append(f"{step}: {k}")

        def write_both(**cmd) -> None:
            # in the order the next refresh goes (the side refreshing first writes first): each side
            # writes last every other round, its newest write (a compaction's, say) still settling
            both = list(sides.values())
            for w in (both if (turn[0] + 1) % 2 else both[::-1]):
                w.call(**cmd)

        refresh_both("first refresh (full)", full=False)
        # Every later step starts from a copy of this state (a new path per step, so no
        # cache of either engine sees an older copy): one step's history (deletion
        # vectors, fragments, versions) does not slow the next.
        for k, w in sides.items():
            w.call(op="snapshot", dst=os.path.join(root, f"{k}-after-first-refresh"))
        for _ in range(rep):
            refresh_both("full refresh (again)", full=True)

        next_id = [n]

        def append(count: int) -> None:
            write_both(op="add", data=data_file(make_rows(next_id[0], count, seed=next_id[0])))
            next_id[0] += count

        counters: dict[tuple, int] = {}

        def change_1pct(op: str, pattern: str) -> None:
            """Deletes or updates (x = 1 - x) 1% of the rows: a contiguous id range, or
            ``id % 100 = k`` (rows in every fragment); a different 1% every round."""
            k = counters.get((op, pattern), 0)
            counters[(op, pattern)] = k + 1
            if pattern == "scattered":
                where = f"id % 100 = {k if op == 'delete' else 50 + k}"
            else:
                lo = int(((0.10 if op == "delete" else 0.14) + 0.08 * k) * n)
                where = f"id >= {lo} AND id < {lo + n // 100}"
            if op == "delete":
                write_both(op="delete", where=where)
            else:
                write_both(op="update", where=where, values_sql={"x": "1.0 - x"})

        patterns = ["range", "scattered"] if args.pattern == "both" else [args.pattern]
        label = {"range": "id range", "scattered": "scattered"}
        steps = [("append 1% then refresh", lambda: append(n // 100), rep, False)]
        for op in ("delete", "update"):
            for pattern in patterns:
                steps.append((f"{op} 1% ({label[pattern]}) then refresh",
                              lambda op=op, pattern=pattern: change_1pct(op, pattern), rep, True))
        compactions = [0]

        def compaction() -> None:
            """Small fragments and deletions to compact (0.1% appended in 4 fragments, 0.1% deleted,
            ``id % 1000 = k``), both views refreshed (not timed), then the source compacted on both
            sides (Lance's compact_files, its defaults): the timed refresh follows a compaction only."""
            for _ in range(4):
                append(max(1, n // 4000))
            write_both(op="delete", where=f"id % 1000 = {500 + compactions[0]}")
            compactions[0] += 1
            refresh_both("compaction then refresh", record=False)
            write_both(op="compact")

        steps += [
            ("compaction then refresh", compaction, rep, True),
            ("append 10 rows then refresh", lambda: append(10), small_rep, True),
            ("no-change refresh", lambda: None, small_rep, False),
        ]
        for i, (step, write, times, profiled) in enumerate(steps):
            for k, w in sides.items():
                setup[k] = w.call(op="clone", src=os.path.join(root, f"{k}-after-first-refresh"),
                                  dst=os.path.join(root, f"{k}-step{i}"), drop_previous=True)
            for _ in range(times):
                write()
                refresh_both(step)
            if args.profile and profiled:
                write()
                refresh_both(step, profile=True, record=False)

        elapsed = time.perf_counter() - started
        print(f"\n{'step':<40} | {'lancedb s':>10} | {'mv_assets s':>11} | {'ratio mv/ldb':>12} | "
              f"{'median ratio':>12}")
        print("-" * 97)
        for step in order:
            best = {k: min(v, key=lambda r: r[0]) for k, v in results[step].items()}
            lt, mt = best["lancedb"][0], best["mv_assets"][0]
            med = {k: float(np.median([s for s, _ in v])) for k, v in results[step].items()}
            print(f"{step:<40} | {lt:>10.4f} | {mt:>11.4f} | {mt / lt:>11.2f}x | "
                  f"{med['mv_assets'] / med['lancedb']:>11.2f}x")
        print(f"\n(best of the rounds, and the ratio of the two sides' medians; whole run {elapsed:.0f} s incl. "
              "writes and oracle checks)")
        print("\nall rounds, seconds (lancedb / mv_assets), and what each side reported for its best round:")
        for step in order:
            r = results[step]
            print(f"  {step}: lancedb {[round(s, 4) for s, _ in r['lancedb']]} / "
                  f"mv_assets {[round(s, 4) for s, _ in r['mv_assets']]}")
            print(f"     lancedb   {min(r['lancedb'], key=lambda x: x[0])[1]}")
            print(f"     mv_assets {min(r['mv_assets'], key=lambda x: x[0])[1]}")
        for step, text in profiles.items():
            print(f"\ncProfile of one mv_assets refresh, {step} (top 15 by cumulative time):\n{text}")
        if failures:
            print(f"\n!!!!!! {len(failures)} WRONG VIEW(S): {failures} !!!!!!")
            return 1
        print("\nevery refresh of both views matched the pyarrow oracle")
        return 0
    finally:
        for w in sides.values():
            w.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
