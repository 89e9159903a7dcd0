"""Chunk views (``@mv.chunker`` + ``db.create_udtf_view``): chunker calls per
refresh, refresh times at scale, lancedb's delete and Geneva 0.17's chunker view,
side by side in one run. Nothing here is a timed test; it prints.

The workload: parents ``docs(id, title, body)``, ``body`` a string of 0 to
``4 * chunks`` words (``w<id>_<k>``), chunked by a scalar ``@chunker split(body)``
into pieces of 2 words (``Chunk(text, start)``; about ``--chunks`` children per
parent, ~5% of parents have an empty body and no children). The view is
``docs.search(None).where("id % 10 != 3").select(["id", "title"])`` chunked by
``split``: children inherit ``id`` and ``title``, not ``body``. The chunker's real
calls are counted with a file per process (one byte per call, appended to a file
named by the pid), so calls in any worker process count. After every refresh the
view is compared with a plain pyarrow oracle: the expected children recomputed
(vectorized, not by the chunker) from the source at the version the view reflects,
compared as sorted tables (= as multisets); and the oracle's count of the calls
owed (passing parents that are new or have another ``body`` than at the previous
refresh, and parents without chunks whose row changed at all: docs/concepts.md) is
printed next to the calls counted and the calls the refresh reported
(``RefreshResult.udf_rows_computed["split"]``).

1. Calls table, at ``--geneva-parents`` parents: first refresh; append 1% parents;
   delete 1% (``id % 100 = 11``); update the chunker input of 1% (``body``,
   ``id % 100 = 22``); update an inherited column of 1% (``title``,
   ``id % 100 = 44``); compaction of the source (pylance ``compact_files``); no
   change. The same steps on Geneva 0.17's chunker view (its own venv
   ``.venv-geneva``, local Ray, ``refresh(concurrency=<cores>)``), side by side:
   its refresh time, its chunker calls (same file log, in its Ray workers) and its
   view against the same oracle (Geneva reports no call count).
2. Scale, at ``--parents`` parents: first refresh; append 1% parents then refresh
   (``--repeat`` rounds, best shown, ratio to the first refresh); delete 1% of the
   parents then refresh (rounds; each step starts from a copy of the state after
   the first refresh). Next to it, lancedb 0.40's own materialized view of as many
   rows as the chunk view has children (``bench/bench_lancedb.py``'s worker and
   view, ``SELECT id, x * 2 + 1 AS y FROM src WHERE x >= 0.1`` over
   ``children / 0.9`` source rows): first refresh, then delete 1% of its source rows
   and refresh (rounds, best shown). Deletes hit ``id % 100 = k`` (every fragment)
   or, with ``--pattern range``, a contiguous 1% of ids, on both sides.

mv_assets runs inline (one process) in a worker interpreter of this venv; Geneva in
a worker of ``.venv-geneva``, lancedb in one of ``.venv-lancedb``; only refresh
calls are timed, inside the workers.

Usage: .venv/bin/python bench/bench_chunks.py [--parents 1000000] [--chunks 5]
           [--geneva-parents 20000] [--repeat 3] [--pattern scattered|range]
           [--no-geneva] [--no-lancedb]
The Geneva venv is created if missing (``--no-geneva`` skips that part):
    python3 -m venv .venv-geneva && .venv-geneva/bin/pip install geneva==0.17.0
the lancedb venv as bench/bench_lancedb.py does.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import typing

os.environ.setdefault("LANCE_LOG", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_lancedb as ldb  # noqa: E402  (stdlib-only at import: fine in every venv)

GENEVA_VENV = os.path.join(REPO, ".venv-geneva")
GENEVA_PY = os.path.join(GENEVA_VENV, "bin", "python")
GENEVA_VERSION = "0.17.0"

WHERE = "id % 10 != 3"
CHUNK_WORDS = 2


class Chunk(typing.NamedTuple):
    text: str
    start: int


def make_split(log_dir: str, decorator):
    """The chunker, decorated by ``mv.chunker`` or ``geneva.chunker``. Each call
    appends one byte to a file of its process (the descriptor opened once per
    process and copy of the closure: the closure is pickled by value)."""
    fds: dict[int, int] = {}

    def split(body: str) -> typing.Iterator[Chunk]:
        pid = os.getpid()
        fd = fds.get(pid)
        if fd is None:
            path = os.path.join(log_dir, f"split-{pid}-{id(fds)}")
            fd = fds[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"x")
        w = (body or "").split()
        for i in range(0, len(w), CHUNK_WORDS):
            yield Chunk(" ".join(w[i:i + CHUNK_WORDS]), i)

    return decorator(split)


class CallLog:
    """Counts the chunker's calls: the bytes in the log directory since the last look."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.seen = 0

    def total(self) -> int:
        return sum(os.path.getsize(os.path.join(self.path, f)) for f in os.listdir(self.path))

    def since_last(self) -> int:
        now = self.total()
        n, self.seen = now - self.seen, now
        return n


# -- workload and oracle (plain pyarrow / numpy) -------------------------------

def docs_table(start: int, n: int, chunks: int):
    import numpy as np
    import pyarrow as pa

    ids = np.arange(start, start + n, dtype=np.int64)
    nwords = (ids * 7919 + 13) % (4 * chunks + 1)  # 0 .. 4*chunks words: ~chunks children of 2 words
    bodies = [" ".join([f"w{i}_{k}" for k in range(m)]) for i, m in zip(ids.tolist(), nwords.tolist(), strict=True)]
    return pa.table({"id": pa.array(ids), "title": pa.array([f"t{i}" for i in ids.tolist()]),
                     "body": pa.array(bodies, pa.string())})


def passing(table):
    """The rows passing the view's filter (``id % 10 != 3``)."""
    import pyarrow as pa

    return table.filter(pa.array(table.column("id").to_numpy() % 10 != 3))


def expected_children(parents):
    """(id, title, chunk index, text, start) of every child of ``parents`` (passing
    rows with id, title, body), sorted by (id, chunk index); vectorized, without the chunker."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    words = pc.utf8_split_whitespace(parents.column("body").combine_chunks())
    parent = pc.list_parent_indices(words).to_numpy()
    flat = pc.list_flatten(words)
    keep = pc.not_equal(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)  # "" splits into [""]
    parent, flat = parent[keep], flat.filter(pa.array(keep))
    n = len(parent)
    first = np.ones(n, dtype=bool)
    first[1:] = parent[1:] != parent[:-1]
    starts = np.flatnonzero(first)
    pos = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))  # word index within its parent
    heads = np.flatnonzero(pos % CHUNK_WORDS == 0)
    assert CHUNK_WORDS == 2
    nxt = heads + 1
    has_pair = (nxt < n) & (parent[np.minimum(nxt, n - 1)] == parent[heads])
    head_words = flat.take(pa.array(heads))
    pair_words = flat.take(pa.array(np.where(has_pair, nxt, heads)))
    text = pc.if_else(pa.array(has_pair), pc.binary_join_element_wise(head_words, pair_words, " "), head_words)
    p = parent[heads]
    return pa.table({
        "id": parents.column("id").take(pa.array(p)),
        "title": parents.column("title").take(pa.array(p)),
        "chunk": pa.array(pos[heads] // CHUNK_WORDS, pa.int64()),
        "text": text,
        "start": pa.array(pos[heads], pa.int64()),
    }).sort_by([("id", "ascending"), ("chunk", "ascending")])


def same(actual, expected) -> tuple[bool, str]:
    """Whether two child tables hold the same rows (as multisets); a short diagnosis if not."""
    actual = actual.select(expected.column_names).cast(expected.schema).sort_by(
        [("id", "ascending"), ("chunk", "ascending")])
    if actual.num_rows == expected.num_rows and all(
            actual.column(c).equals(expected.column(c)) for c in expected.column_names):
        return True, ""
    a = set(zip(*(actual.column(c).to_pylist() for c in expected.column_names), strict=True))
    e = set(zip(*(expected.column(c).to_pylist() for c in expected.column_names), strict=True))
    parents = len({r[0] for r in (e - a) | (a - e)})
    return False, (f"{actual.num_rows:,} rows vs {expected.num_rows:,} expected; missing {len(e - a):,}, "
                   f"extra {len(a - e):,}, of {parents:,} parents; e.g. missing {sorted(e - a)[:1]} "
                   f"extra {sorted(a - e)[:1]}")


def changed_parents(prev, now) -> int:
    """The chunker calls the refresh owes (docs/concepts.md, "Chunk views"):
    passing parents of ``now`` (id, title, body) that are new, have another
    body (the chunker's input) than in ``prev``, or yielded no chunks and
    changed at all (no child holds the digest of their inputs to tell)."""
    import pyarrow.compute as pc

    if prev is None:
        return now.num_rows
    j = now.select(["id", "title", "body"]).join(
        prev.select(["id", "title", "body"]).rename_columns(["id", "old_title", "old"]), "id", join_type="left outer")
    new_or_input = pc.fill_null(pc.not_equal(j.column("body"), j.column("old")), True)
    childless = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(j.column("body"))), 0)
    retitled = pc.fill_null(pc.not_equal(j.column("title"), j.column("old_title")), False)
    owed = pc.or_(new_or_input, pc.and_(childless, retitled))
    return int(pc.sum(owed).as_py() or 0)


# -- worker side: one per engine, in its own interpreter -----------------------

class MvSide:
    label = "mv_assets"

    def __init__(self, root: str, log: str, n: int | None, chunks: int) -> None:
        import mv_assets as mv

        self.root, self.chunks = root, chunks
        self.db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
        if n is None:
            self.docs, self.view = self.db.open_table("docs"), self.db.open_view("chunks")
            return
        self.docs = self.db.create_table("docs", docs_table(0, n, chunks), primary_key="id")
        q = self.docs.search(None).where(WHERE).select(["id", "title"])
        self.view = self.db.create_udtf_view("chunks", q, make_split(log, mv.chunker))

    def refresh(self) -> tuple[float, int | None, dict]:
        t0 = time.perf_counter()
        r = self.view.refresh()
        s = time.perf_counter() - t0
        t = r.timings  # execute (the tasks) and commit; the rest of the call is planning
        info = {"plan": s - t.get("execute_s", 0) - t.get("commit_s", 0), "execute": t.get("execute_s", 0),
                "commit": t.get("commit_s", 0), "tasks": r.tasks, "inserted": r.rows_inserted,
                "updated": r.rows_updated, "deleted": r.rows_deleted}
        return s, r.udf_rows_computed.get("split", 0), info

    def source_version(self) -> int:
        return self.view.source_version

    def source_uri(self) -> str:
        return self.docs.uri

    def view_table(self):
        import lance

        t = lance.dataset(self.view.uri).to_table(columns=["id", "title", "__chunk_index", "text", "start"])
        return t.rename_columns(["id", "title", "chunk", "text", "start"])

    def add(self, table) -> None:
        self.docs.add(table)

    def delete(self, where: str) -> None:
        self.docs.delete(where)

    def update(self, where: str, values_sql: dict) -> None:
        self.docs.update(where, values_sql=values_sql)


class GenevaSide:
    label = "geneva"

    def __init__(self, root: str, log: str, n: int | None, chunks: int) -> None:
        import geneva

        self.root, self.chunks = root, chunks
        self.db = geneva.connect(os.path.join(root, "db"))
        if n is None:
            self.docs, self.view = self.db.open_table("docs"), self.db.open_table("chunks")
        else:
            self.docs = self.db.create_table("docs", docs_table(0, n, chunks),
                                             storage_options={"new_table_enable_stable_row_ids": "true"})
            # Geneva wants the chunker's input in the projection; inherit_input_columns=False keeps it out
            q = self.docs.search(None).where(WHERE).select(["id", "title", "body"])
            self.view = self.db.create_udtf_view("chunks", q, make_split(log, geneva.chunker))
        self._ray()

    _ctx = None

    def _ray(self) -> None:
        import logging

        if GenevaSide._ctx is None:  # one local Ray for the worker's life, quiet on the driver
            from geneva.runners.ray._mgr import ray_cluster

            GenevaSide._ctx = ray_cluster(local=True, log_to_driver=False, logging_level=logging.WARNING)
            GenevaSide._ctx.__enter__()

    def refresh(self) -> tuple[float, int | None, dict]:
        t0 = time.perf_counter()
        self.view.refresh(concurrency=os.cpu_count() or 1)
        s = time.perf_counter() - t0
        return s, None, {}  # Geneva reports no chunker call count

    def source_version(self) -> int:
        meta = self.view.to_lance().schema.metadata or {}
        return int(meta[b"geneva::view::base_table_version"])

    def source_uri(self) -> str:
        return self.docs.to_lance().uri

    def view_table(self):
        t = self.view.to_lance().to_table(columns=["id", "title", "__child_index", "text", "start"])
        return t.rename_columns(["id", "title", "chunk", "text", "start"])

    def add(self, table) -> None:
        self.docs.add(table)

    def delete(self, where: str) -> None:
        self.docs.delete(where)

    def update(self, where: str, values_sql: dict) -> None:
        self.docs.update(where=where, values_sql=values_sql)


SIDES = {"mv_assets": MvSide, "geneva": GenevaSide}


def worker(side: str) -> None:
    """Serves JSON commands on stdin, one reply per line on the real stdout."""
    import lance

    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr
    eng = log = None
    prev = None  # the oracle's memory: passing (id, body) at the previous refresh
    saved: dict[str, typing.Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            out: dict = {}
            if op == "setup":
                log = CallLog(cmd["log"])
                eng = SIDES[side](cmd["root"], cmd["log"], cmd["parents"], cmd["chunks"])
                if side == "geneva":
                    import geneva
                    out["version"] = getattr(geneva, "__version__", GENEVA_VERSION)
            elif op == "refresh":
                log.since_last()
                s, reported, info = eng.refresh()
                out.update(s=s, reported=reported, calls=log.since_last(), info=info)
                if cmd.get("check", True):
                    v = eng.source_version()
                    src = lance.dataset(eng.source_uri(), version=v).to_table(columns=["id", "title", "body"])
                    now = passing(src)
                    out["changed"] = changed_parents(prev, now)
                    prev = now.select(["id", "title", "body"])
                    exp = expected_children(now)
                    ok, why = same(eng.view_table(), exp)
                    out.update(src_version=v, equal=ok, why=why, children=exp.num_rows,
                               no_children=int(now.num_rows - len(set(exp.column("id").to_pylist()))))
            elif op == "add":
                eng.add(docs_table(cmd["start"], cmd["n"], eng.chunks))
            elif op == "delete":
                eng.delete(cmd["where"])
            elif op == "update":
                eng.update(cmd["where"], cmd["values_sql"])
            elif op == "compact":
                ds = lance.dataset(eng.source_uri())
                before = len(ds.get_fragments())
                ds.optimize.compact_files()
                out["fragments"] = [before, len(lance.dataset(eng.source_uri()).get_fragments())]
            elif op == "snapshot":  # a copy of the catalog as it is now
                shutil.copytree(eng.root, cmd["dst"])
                saved[cmd["dst"]] = prev
            elif op == "clone":  # continue on a fresh copy of a snapshot, at a path never opened before
                eng_root = eng.root
                eng = None
                shutil.copytree(cmd["src"], cmd["dst"])
                eng = SIDES[side](cmd["dst"], log.path, None, cmd["chunks"])
                prev = saved[cmd["src"]]
                shutil.rmtree(eng_root, ignore_errors=True)
            elif op == "quit":
                reply.write(json.dumps({"ok": True}) + "\n")
                reply.flush()
                return
            out["ok"] = True
        except Exception as exc:  # reported to the orchestrator
            import traceback
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        reply.write(json.dumps(out) + "\n")
        reply.flush()


# -- orchestrator ---------------------------------------------------------------

class Worker(ldb.Worker):
    """bench_lancedb's worker client, running this script's worker; stderr to ``errlog``."""

    def __init__(self, side: str, python: str, errlog: str | None = None) -> None:
        self.side = side
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO if side == "mv_assets" else ""
        env.setdefault("RAY_DEDUP_LOGS", "1")
        self.err = open(errlog, "w") if errlog else None  # noqa: SIM115
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", side], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env, cwd=REPO)

    def close(self) -> None:
        super().close()
        if self.err:
            self.err.close()


def ensure_geneva_venv() -> str | None:
    """None when Geneva imports in its venv (created if missing), else why not."""
    check = [GENEVA_PY, "-c", "import geneva, ray, importlib.metadata as m; print(m.version('geneva'))"]
    if os.path.exists(GENEVA_PY):
        r = subprocess.run(check, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == GENEVA_VERSION:
            return None
    how = f"python3 -m venv {GENEVA_VENV} && {GENEVA_VENV}/bin/pip install geneva=={GENEVA_VERSION}"
    print(f"creating the Geneva venv: {how}", flush=True)
    r = subprocess.run(how, shell=True, capture_output=True, text=True)
    if r.returncode != 0:
        return f"`{how}` failed (exit {r.returncode}): {(r.stderr or r.stdout).strip().splitlines()[-3:]}"
    r = subprocess.run(check, capture_output=True, text=True)
    if r.returncode != 0:
        return f"geneva does not import: {(r.stderr or r.stdout).strip().splitlines()[-3:]}"
    return None


def engine_label() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "mv_assets"], capture_output=True, text=True,
                               cwd=REPO).stdout.strip()
        return f"mv_assets at {head}{' + uncommitted changes' if dirty else ''}"
    except OSError:
        return "mv_assets"


def tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-n:])
    except OSError:
        return ""


def calls_table(args, root: str, failures: list[str]) -> None:
    n = args.geneva_parents
    sides: dict[str, Worker] = {"mv_assets": Worker("mv_assets", sys.executable)}
    geneva_note = None
    if args.no_geneva:
        geneva_note = "skipped (--no-geneva)"
    else:
        geneva_note = ensure_geneva_venv()
        if geneva_note is None:
            sides["geneva"] = Worker("geneva", GENEVA_PY, os.path.join(root, "geneva-worker.log"))
    rows: dict[str, dict[str, dict]] = {}
    order: list[str] = []
    notes: list[str] = []
    geneva_wrong: list[str] = []

    def on(side: str, **cmd):
        w = sides.get(side)
        if w is None:
            return None
        try:
            return w.call(**cmd)
        except RuntimeError as exc:
            nonlocal geneva_note
            if side != "geneva":
                raise
            log = tail(os.path.join(root, "geneva-worker.log"))
            geneva_note = f"failed at {cmd['op']!r}: {str(exc).splitlines()[0]}"
            print(f"\nGeneva side failed ({cmd['op']}): {exc}\n--- its log (tail) ---\n{log}", flush=True)
            sides.pop("geneva").close()
            return None

    try:
        for side in list(sides):
            out = on(side, op="setup", root=os.path.join(root, f"calls-{side}"), log=os.path.join(root, f"log-{side}"),
                     parents=n, chunks=args.chunks)
            if out and "version" in out:
                notes.append(f"Geneva {out['version']}")
        next_id = [n]

        def step(label: str, **write) -> None:
            for side in list(sides):
                if write.get("op") == "compact":
                    out = on(side, **write)
                    if out:
                        notes.append(f"{side} compaction: source fragments {out['fragments'][0]} -> "
                                     f"{out['fragments'][1]}")
                elif write:
                    on(side, **write)
            order.append(label)
            rows[label] = {}
            for side in list(sides):
                out = on(side, op="refresh")
                if out is None:
                    continue
                rows[label][side] = out
                if not out["equal"]:
                    # ours fails the run; Geneva's is a finding about Geneva, printed below the table
                    (failures if side == "mv_assets" else geneva_wrong).append(
                        f"{label}: {side} view differs from the oracle: {out['why']}")
                if side == "mv_assets" and not (out["calls"] == out["reported"] == out["changed"]):
                    failures.append(f"calls table, {label}: mv_assets calls {out['calls']} / reported "
                                    f"{out['reported']} / changed parents {out['changed']}")

        pct = max(1, n // 100)
        step("first refresh")
        step(f"append 1% ({pct:,} parents)", op="add", start=next_id[0], n=pct)
        next_id[0] += pct
        step("delete 1% (id % 100 = 11)", op="delete", where="id % 100 = 11")
        step("update input, 1% (body)", op="update", where="id % 100 = 22",
             values_sql={"body": "concat(body, ' more')"})
        step("update inherited col, 1% (title)", op="update", where="id % 100 = 44",
             values_sql={"title": "concat(title, '!')"})
        step("compaction", op="compact")
        step("no change")
    finally:
        for w in sides.values():
            w.close()

    g = "geneva" in {s for r in rows.values() for s in r}
    print(f"\n1. Chunker calls per refresh, {n:,} parents (~{args.chunks} chunks each, filter {WHERE}); "
          "calls counted by the file log, reported by the refresh, owed by the oracle (new passing parents, changed "
          "chunker input, and parents without chunks that changed at all); "
          "view = oracle at the view's source version")
    head = f"{'step':<34} | {'oracle':>7} | {'mv calls':>8} | {'reported':>8} | {'mv = oracle':>11} | {'mv s':>7}"
    if g:
        head += f" || {'geneva calls':>12} | {'geneva = oracle':>15} | {'geneva s':>8}"
    print(head)
    print("-" * len(head))
    for label in order:
        r = rows[label]
        m = r.get("mv_assets")
        mark = "" if m["calls"] == m["reported"] == m["changed"] else " !"
        line = (f"{label:<34} | {m['changed']:>7,} | {m['calls']:>6,}{mark:<2} | {m['reported']:>8,} | "
                f"{'yes' if m['equal'] else 'NO':>11} | {m['s']:>7.3f}")
        if g:
            gr = r.get("geneva")
            if gr:
                line += f" || {gr['calls']:>12,} | {'yes' if gr['equal'] else 'NO':>15} | {gr['s']:>8.2f}"
            else:
                line += f" || {'-':>12} | {'-':>15} | {'-':>8}"
        print(line)
    last = rows[order[-1]].get("mv_assets") if order else None
    if last:
        print(f"(view: {last['children']:,} children; {last['no_children']:,} passing parents have no children; "
              f"mv_assets inline, one process; Geneva local Ray, refresh(concurrency={os.cpu_count()}))")
    for note in notes:
        print(f"  {note}")
    if geneva_note:
        print(f"  Geneva: {geneva_note}")
    for w in geneva_wrong:
        print(f"  Geneva's view is not the oracle's after {w}")


def scale_table(args, root: str, failures: list[str]) -> None:
    n, rep = args.parents, max(1, args.repeat)
    mv = Worker("mv_assets", sys.executable)
    results: dict[str, list[dict]] = {}
    lance_results: dict[str, list[float]] = {}
    lancedb_note = None
    children = 0

    def record(label: str, out: dict) -> None:
        results.setdefault(label, []).append(out)
        bad = []
        if not out["equal"]:
            bad.append(f"view differs from the oracle: {out['why']}")
        if not (out["calls"] == out["reported"] == out["changed"]):
            bad.append(f"calls {out['calls']} / reported {out['reported']} / changed parents {out['changed']}")
        for b in bad:
            failures.append(f"scale, {label}: {b}")
            print(f"\n!!!!!! FAILURE [{label}] {b} !!!!!!\n", flush=True)

    try:
        base = os.path.join(root, "scale-mv")
        mv.call(op="setup", root=base, log=os.path.join(root, "log-scale"), parents=n, chunks=args.chunks)
        out = mv.call(op="refresh")
        record("first refresh", out)
        children = out["children"]
        snap = os.path.join(root, "scale-mv-after-first")
        mv.call(op="snapshot", dst=snap)
        next_id = n
        pct = n // 100
        for _ in range(rep):
            mv.call(op="add", start=next_id, n=pct)
            next_id += pct
            record("append 1%", mv.call(op="refresh"))
        mv.call(op="clone", src=snap, dst=os.path.join(root, "scale-mv-delete"), chunks=args.chunks)
        for k in range(rep):
            mv.call(op="delete", where=delete_where(args.pattern, k, n))
            record("delete 1%", mv.call(op="refresh"))
    finally:
        mv.close()

    if args.no_lancedb:
        lancedb_note = "skipped (--no-lancedb)"
    else:
        lancedb_note = lancedb_delete(args, root, children, lance_results, failures)

    first = results["first refresh"][0]["s"]
    best = {k: min(v, key=lambda r: r["s"]) for k, v in results.items()}
    print(f"\n2. Scale: {n:,} parents, {children:,} children (mv_assets inline, one process); best of {rep} rounds, "
          f"each step from a copy of the state after the first refresh; deletes: {args.pattern}")
    print(f"{'step':<22} | {'mv_assets s':>11} | {'ratio':>16} | {'calls':>7} | {'reported':>8} | {'oracle':>7} | "
          f"{'= oracle':>8} | {'lancedb s':>9}")
    print("-" * 110)
    ldb_first = lance_results.get("first refresh")
    ldb_del = lance_results.get("delete 1%")
    for label in ("first refresh", "append 1%", "delete 1%"):
        b = best[label]
        ok = all(r["equal"] for r in results[label])
        if label == "append 1%":
            ratio = f"{b['s'] / first:.4f} of first"
        elif label == "delete 1%" and ldb_del:
            ratio = f"{b['s'] / min(ldb_del):.2f}x lancedb"
        else:
            ratio = ""
        ls = {"first refresh": ldb_first, "delete 1%": ldb_del}.get(label)
        print(f"{label:<22} | {b['s']:>11.3f} | {ratio:>16} | {b['calls']:>7,} | {b['reported']:>8,} | "
              f"{b['changed']:>7,} | {'yes' if ok else 'NO':>8} | {f'{min(ls):.3f}' if ls else '-':>9}")
    print("all rounds, seconds: " + "; ".join(
        f"{k}: mv_assets {[round(r['s'], 3) for r in v]}" for k, v in results.items() if k != "first refresh"))
    if lance_results:
        print("                     " + "; ".join(f"{k}: lancedb {[round(s, 3) for s in v]}"
                                                 for k, v in lance_results.items()))
    for label, b in best.items():
        i = b["info"]
        print(f"  mv_assets {label} (best round): plan {i['plan']:.3f} s, tasks {i['execute']:.3f} s "
              f"({i['tasks']} tasks), commit {i['commit']:.3f} s; parents inserted {i['inserted']:,}, "
              f"updated {i['updated']:,}, deleted {i['deleted']:,}")
    ap = best["append 1%"]["s"] / first
    print(f"+1% parents: {best['append 1%']['s']:.3f} s = {ap:.4f} of the first refresh ({first:.2f} s): "
          f"{'<=' if ap <= 0.05 else '>'} 0.05")
    if ldb_del:
        d, ld = best["delete 1%"]["s"], min(ldb_del)
        print(f"delete 1% of parents: {d:.3f} s vs lancedb's delete of 1% of a {children:,}-row view's source "
              f"{ld:.3f} s: {'<=' if d <= ld else '>'} lancedb")
    if lancedb_note:
        print(f"  lancedb: {lancedb_note}")


def delete_where(pattern: str, k: int, n: int) -> str:
    if pattern == "scattered":
        return f"id % 100 = {60 + k}"
    lo = int((0.10 + 0.08 * k) * n)
    return f"id >= {lo} AND id < {lo + n // 100}"


def lancedb_delete(args, root: str, children: int, out: dict[str, list[float]], failures: list[str]) -> str | None:
    """lancedb's own view of ``children`` rows: first refresh, then delete 1% of its source and refresh."""
    try:
        ldb.ensure_lancedb_venv()
    except SystemExit as exc:
        return f"no lancedb venv: {exc}"
    rows = int(round(children / 0.9))
    w = ldb.Worker("lancedb", ldb.LANCEDB_PY)
    try:
        data = ldb.write_ipc(ldb.make_rows(0, rows, seed=0), os.path.join(root, "lancedb-src.arrow"))
        setup = w.call(op="setup", root=os.path.join(root, "lancedb"), data=data)
        os.remove(data)

        def refresh(label: str) -> None:
            r = w.call(op="refresh", full=False)
            out.setdefault(label, []).append(r["s"])
            if not ldb.check(label, "lancedb", setup["view_uri"], ldb.oracle(setup["src_uri"], r["src_version"])):
                failures.append(f"scale, lancedb {label}: view differs from the oracle")

        refresh("first refresh")
        for k in range(max(1, args.repeat)):
            w.call(op="delete", where=delete_where(args.pattern, k, rows))
            refresh("delete 1%")
        return (f"lancedb {setup['version']} view SELECT id, {ldb.EXPR} AS y FROM src WHERE {ldb.WHERE} over "
                f"{rows:,} source rows (~{children:,} view rows), checked against bench_lancedb's oracle")
    except RuntimeError as exc:
        return f"failed: {str(exc).splitlines()[0]}"
    finally:
        w.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parents", type=int, default=1_000_000, help="parents of the scale table")
    ap.add_argument("--chunks", type=int, default=5, help="about this many children per parent")
    ap.add_argument("--geneva-parents", type=int, default=20_000,
                    help="parents of the calls table (mv_assets and Geneva side by side)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the +1%% and delete steps (best shown)")
    ap.add_argument("--pattern", choices=["scattered", "range"], default="scattered",
                    help="deleted 1%%: id %% 100 = k (every fragment) or a contiguous id range")
    ap.add_argument("--no-geneva", action="store_true", help="skip Geneva")
    ap.add_argument("--no-lancedb", action="store_true", help="skip lancedb")
    ap.add_argument("--only", choices=["calls", "scale"], help="run one of the two tables")
    ap.add_argument("--worker", choices=list(SIDES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    root = tempfile.mkdtemp(prefix="mv_bench_chunks_")
    started = time.perf_counter()
    failures: list[str] = []
    print(f"{engine_label()}: chunk view benchmark, {os.cpu_count()} cores", flush=True)
    try:
        if args.only != "scale":
            calls_table(args, root, failures)
        if args.only != "calls":
            scale_table(args, root, failures)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n(whole run {time.perf_counter() - started:.0f} s incl. setup, writes and oracle checks)")
    if failures:
        print(f"\n!!!!!! {len(failures)} FAILURE(S):\n  " + "\n  ".join(failures))
        return 1
    print("every refresh matched the oracle; mv_assets' chunker calls = reported = owed by the oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
