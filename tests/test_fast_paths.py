"""The engine's fast paths keep their results: a refresh that only adds rows
commits a Lance Append (an Update derives version metadata per row in the
commit), task output is written in large chunks, and a cheap UDF's paced
checkpoints never build input identities they do not save."""

import json
import shutil

import lance
import pyarrow as pa
import pytest
from oracle import actual_view, expected_view
from spies import view_key_reads

import mv_assets as mv
from mv_assets.execution import tasks


@mv.udf
def plus(x: int) -> int:
    return x + 1


def _keep(row):
    return row["x"] % 3 != 0


def _project(row):
    return {"id": row["id"], "y": row["x"] + 1}


def _operation(view) -> str:
    ds = lance.dataset(view.uri)
    return type(ds.read_transaction(ds.version).operation).__name__


def test_additive_refresh_commits_an_append_and_changes_an_update(tmp_path):
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(50)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    assert _operation(view) == "Append"
    src.add([{"id": i, "x": i} for i in range(50, 60)])
    assert view.refresh().udf_rows_computed == {"y": 7}
    assert _operation(view) == "Append"
    appended = lance.dataset(view.uri).to_table(columns=["_row_created_at_version", "_row_last_updated_at_version"])
    assert appended.column(0).to_pylist() == appended.column(1).to_pylist()  # inserted rows: created = updated
    src.update("id = 1", values_sql={"x": "100"})
    src.delete("id = 2")
    view.refresh()
    assert _operation(view) == "Update"
    src.add([{"id": 99, "x": 3}])  # filtered out: no row to add, nothing committed as an Append
    view.refresh()
    assert _operation(view) != "Append"
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
    # a view over it still sees the appended rows as changes (Append is a commit that matters)
    w = db.create_materialized_view("w", view.search(None).select({"id": "id", "y": "y"}))
    w.refresh()
    src.add([{"id": 200, "x": 200}])
    view.refresh()
    assert w.refresh().rows_inserted == 1


def test_task_output_is_written_in_large_chunks():
    batches = [pa.record_batch({"a": list(range(i * 10, i * 10 + 10))}) for i in range(25)]
    out = list(tasks._coalesced(batches, rows=100))
    assert [b.num_rows for b in out] == [100, 100, 50]
    assert pa.Table.from_batches(out).column("a").to_pylist() == list(range(250))
    assert list(tasks._coalesced([], rows=100)) == []
    one = list(tasks._coalesced(batches[:1], rows=100))
    assert one[0] is batches[0]
    # a byte bound cuts earlier; a batch alone over it passes as it is
    by_bytes = list(tasks._coalesced(batches, rows=100, max_bytes=3 * batches[0].nbytes))
    assert [b.num_rows for b in by_bytes] == [30] * 8 + [10]
    assert [b.num_rows for b in tasks._coalesced(batches[:2], rows=100, max_bytes=1)] == [10, 10]


def test_paced_checkpoints_of_a_cheap_udf_build_no_input_identities(tmp_path, monkeypatch):
    calls = []
    real = tasks.input_identity

    def counting(batch, computed_inputs):
        calls.append(batch.num_rows)
        return real(batch, computed_inputs)

    monkeypatch.setattr(tasks, "input_identity", counting)
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(20_000)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": plus}))
    assert view.refresh().udf_rows_computed == {"y": 20_000}
    assert calls == []  # nothing was looked up or saved: the task's own checkpoint covers it
    # a fixed checkpoint size saves every batch, with its identities
    v2 = db.create_materialized_view("v2", src.search(None).select({"id": "id", "y": plus}))
    v2.refresh(checkpoint_size=4096)
    assert sum(calls) == 20_000


def test_rows_only_appended_are_planned_without_reading_the_view(tmp_path, monkeypatch):
    """Source commits since the last refresh that only append rows (compactions
    between them allowed): the new rows are the inserts, found by their creation
    version in the fragments written since; the view's keys are not read."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(300)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    over = db.create_materialized_view("w", view.search(None).where("y > 10").select({"id": "id", "y": "y"}))
    view.refresh()
    over.refresh()
    src.add([{"id": i, "x": i} for i in range(300, 330)])
    src.optimize()  # the appended rows now sit in a rewritten fragment with old ones
    src.add([{"id": i, "x": i} for i in range(330, 345)])
    view_reads = []
    real = lance.LanceDataset.to_table

    def to_table(self, *a, **k):
        if self.uri in (view.uri, over.uri):
            view_reads.append(self.uri)
        return real(self, *a, **k)

    monkeypatch.setattr(lance.LanceDataset, "to_table", to_table)
    r = view.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (30, 0, 0)
    assert r.udf_rows_computed == {"y": 30}
    assert over.refresh().rows_inserted == 30  # the view's refresh was an Append: the same path
    assert view_reads == []
    monkeypatch.undo()
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
    # an update or a delete since: the general path, still exact
    src.add([{"id": 400, "x": 400}])
    src.update("id = 4", values_sql={"x": "7"})
    src.delete("id = 5")
    r = view.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (1, 1, 1)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)



def test_rows_appended_since_only_by_appends_are_scanned_without_a_version_filter(tmp_path):
    """Every source commit since the last refresh an Append (or an index
    update): the fragments written since hold only new rows, so the tasks scan
    them with the view's filter alone; a compaction among them (old rows moved
    into a new fragment) keeps the ``_row_created_at_version`` filter, and both
    refresh to the oracle."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(300)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": i, "x": i} for i in range(300, 310)])
    src.add([{"id": i, "x": i} for i in range(310, 320)])
    plan = view.plan_refresh()
    predicates = {part[1] for t in plan.tasks for part in t.parts}
    assert predicates == {"x % 3 != 0"}
    view.refresh()
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
    src.add([{"id": i, "x": i} for i in range(320, 330)])
    src.optimize()  # a compaction since: the appended rows sit in a rewritten fragment with old ones
    src.add([{"id": i, "x": i} for i in range(330, 340)])
    plan = view.plan_refresh()
    assert all("_row_created_at_version" in part[1] for t in plan.tasks for part in t.parts)
    r = view.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (13, 0, 0)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


def _rows(n, start=0):
    return [{"id": i, "x": float(i)} for i in range(start, start + n)]


def _record_arrow_writes(monkeypatch) -> list:
    """Paths of every Arrow file the engine writes from now on (plans, checkpoint batches)."""
    from mv_assets.storage import objects

    writes = []
    real = objects.write_arrow

    def counting(path, table, **kw):
        writes.append(path)
        return real(path, table, **kw)

    monkeypatch.setattr(objects, "write_arrow", counting)
    return writes


def test_a_cheap_backfill_writes_in_one_pass_without_checkpoint_files(tmp_path, monkeypatch):
    """A base table's UDF column: computed and written per fragment in one pass;
    a cheap UDF hands nothing through files (no plan, batch or assignment file)."""

    writes = _record_arrow_writes(monkeypatch)
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(3000))
    t.add(_rows(2000, 3000))
    t.add_columns({"y": plus_f})
    r = t.backfill("y")
    assert (r.rows_planned, r.rows_written, r.udf_rows_computed, r.rows_failed) == (5000, 5000, 5000, 0)
    assert writes == []
    got = {row["id"]: row["y"] for row in t.to_arrow().select(["id", "y"]).to_pylist()}
    assert got == {i: i + 1.0 for i in range(5000)}
    assert t.plan_backfill("y").rows == 0 and t.backfill("y").rows_planned == 0
    before = lance.dataset(t.uri).to_table(columns=["id", "_row_last_updated_at_version"], with_row_id=True)
    t.add(_rows(10, 5000))
    r = t.backfill("y")  # only the new rows; row ids and versions of the others untouched
    assert r.udf_rows_computed == 10
    after = lance.dataset(t.uri).to_table(columns=["id", "_row_last_updated_at_version"], with_row_id=True)
    assert after.slice(0, 5000).to_pylist() == before.to_pylist()
    # a given checkpoint_size takes the staged path (batches checkpointed in files)
    t.add_columns({"z": plus_f})
    assert t.backfill("z", checkpoint_size=1000).udf_rows_computed == 5010 and writes


@mv.udf
def plus_f(x: float) -> float:
    return x + 1.0


def test_an_expensive_backfill_resumes_from_checkpoints_saved_by_time(tmp_path, monkeypatch, call_log):
    """Killed part way, an expensive UDF's backfill loses at most about one
    checkpoint's work (target 0.05 s here): the rerun finds the rest by row identity."""
    import time as _time

    from oracle import count_calls, record_call

    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.05")
    stop = tmp_path / "stop"
    stop.write_text("1")

    @mv.udf
    def slow(x: float) -> float:
        record_call(call_log, "slow", x)
        if x >= 400 and stop.exists():
            raise RuntimeError("killed")
        _time.sleep(0.002)
        return x * 2

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(600))
    t.add_columns({"y": slow})
    with pytest.raises(Exception, match="killed"):
        t.backfill("y")
    first = count_calls(call_log, "slow")
    assert first == 401
    stop.unlink()
    r = t.backfill("y")
    again = count_calls(call_log, "slow") - first
    assert again <= 200 + 60, again  # the 200 rows never computed plus at most ~one checkpoint's slice
    assert r.udf_rows_computed == again and r.rows_written == 600
    assert {row["id"]: row["y"] for row in t.to_arrow().select(["id", "y"]).to_pylist()} == {
        i: i * 2.0 for i in range(600)
    }


def test_a_writer_changing_rows_during_a_one_pass_backfill_is_never_overwritten(tmp_path):
    """A commit conflict (rows of those fragments updated or deleted meanwhile)
    runs the pass again on the new version: the update and the delete stay,
    and every row ends with the value of its current input."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(30))
    once = tmp_path / "once"

    @mv.udf
    def meddling(x: float) -> float:
        if x == 10.0 and not once.exists():  # a concurrent writer, mid-job
            once.write_text("1")
            t.update("id = 20", values_sql={"x": "x + 100"})
            t.delete("id = 25")
            t.add([{"id": 99, "x": 99.0}])
        return x

    t.add_columns({"y": meddling})
    t.backfill("y")
    rows = {r["id"]: (r["x"], r["y"]) for r in t.to_arrow().select(["id", "x", "y"]).to_pylist()}
    assert 25 not in rows and rows[20][0] == 120.0 and len(rows) == 30  # the delete and the update stay
    assert all(y == x for i, (x, y) in rows.items() if i not in (20, 99))
    left = t.plan_backfill("y").rows  # rows changed meanwhile are computed now or by the next backfill
    assert left == sum(1 for i in (20, 99) if rows[i][1] is None)
    t.backfill("y")
    assert all(y == x for x, y in (
        (r["x"], r["y"]) for r in t.to_arrow().select(["x", "y"]).to_pylist()
    ))


def _stale_oracle(t, column: str, fingerprint: str) -> int:
    """Rows whose marker is not the column's current fingerprint at the row's
    current version (a table's markers are "fingerprint@row version"), counted
    in plain pyarrow."""
    rows = lance.dataset(t.uri).to_table(
        columns={"m": f"__computed__{column}", "v": "_row_last_updated_at_version"}).to_pylist()
    return sum(1 for r in rows if r["m"] != f"{fingerprint}@{r['v']}")


@mv.udf(on_error="skip")
def plus_or_fail(x: float) -> float:
    if x == 17.0:
        raise ValueError("seventeen")
    return x + 1.0


@mv.udf
def plus_two(x: float) -> float:
    return x + 2.0


def test_after_a_whole_backfill_only_fragments_written_since_are_scanned(tmp_path, monkeypatch):
    """Appends since a whole one-pass backfill: only the fragments written since
    are scanned for stale rows (O(new rows), not O(table)); every other kind of
    change (an update, a new UDF, failed rows) scans the whole table again.
    The stale count always equals a plain pyarrow count of the markers."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(3000))
    t.add(_rows(1000, 3000))
    t.add_columns({"y": plus_f})
    fp = lambda: next(c.fingerprint for c in t.ref().computed_columns() if c.name == "y")  # noqa: E731
    t.backfill("y")
    scans = []
    real = lance.LanceDataset.scanner

    def scanner(self, *a, **k):
        if self.uri == t.uri and k.get("filter"):
            frags = k.get("fragments")
            scans.append(None if frags is None else sorted(f.fragment_id for f in frags))
        return real(self, *a, **k)

    monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)
    before = {f.fragment_id for f in lance.dataset(t.uri).get_fragments()}
    t.add(_rows(20, 4000))
    t.add(_rows(5, 4020))
    new = sorted({f.fragment_id for f in lance.dataset(t.uri).get_fragments()} - before)
    assert t.plan_backfill("y").rows == 25 == _stale_oracle(t, "y", fp())
    r = t.backfill("y")
    assert r.udf_rows_computed == 25 and scans and all(s == new for s in scans)
    t.optimize()  # a compaction since the last backfill: still narrowed, still exact
    t.add(_rows(3, 4025))
    scans.clear()
    assert t.plan_backfill("y").rows == 3 == _stale_oracle(t, "y", fp())
    assert all(s is not None and not (set(s) & before) for s in scans)
    t.backfill("y")
    # an update of an input: the whole table is scanned again
    t.update("id < 10", values_sql={"x": "x + 1000"})
    scans.clear()
    assert t.plan_backfill("y").rows == 10 == _stale_oracle(t, "y", fp()) and scans == [None]
    t.backfill("y")
    # a new UDF: every row is stale, found by a whole scan
    t.alter_columns({"path": "y", "udf": plus_two})
    assert t.plan_backfill("y").rows == t.count_rows() == _stale_oracle(t, "y", fp())
    t.backfill("y")
    # failed rows: the next backfill after an append finds them too
    t.add_columns({"z": plus_or_fail})
    assert t.backfill("z").rows_failed == 1
    t.add(_rows(2, 5000))
    assert t.plan_backfill("z").rows == 3 == _stale_oracle(t, "z", next(
        c.fingerprint for c in t.ref().computed_columns() if c.name == "z"))
    monkeypatch.undo()
    got = {row["id"]: row["y"] for row in t.to_arrow().select(["id", "y"]).to_pylist()}
    xs = {row["id"]: row["x"] for row in t.to_arrow().select(["id", "x"]).to_pylist()}
    assert got == {i: xs[i] + 2.0 for i in xs if i < 5000} | {i: None for i in xs if i >= 5000}


def test_stale_rows_are_searched_everywhere_when_the_last_backfill_is_too_far_back(tmp_path, monkeypatch):
    """The search for the last whole backfill reads one commit per version: it
    stops after STALE_LOOKBACK versions and scans the whole table instead (exact either way)."""
    from mv_assets.ops import backfill

    monkeypatch.setattr(backfill, "STALE_LOOKBACK", 3)
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(100))
    t.add_columns({"y": plus_f})
    t.backfill("y")
    specs = [c for c in t.ref().computed_columns() if c.name == "y"]
    t.add(_rows(5, 100))
    assert backfill.stale_fragments(lance.dataset(t.uri), specs) is not None
    for i in range(4):
        t.add(_rows(1, 200 + i))
    assert backfill.stale_fragments(lance.dataset(t.uri), specs) is None
    assert t.plan_backfill("y").rows == 9 and t.backfill("y").udf_rows_computed == 9


def _seen(n: int) -> None:
    import os

    with open(os.environ["MV_TEST_BATCH_LOG"], "a") as f:
        f.write(f"{n}\n")


@mv.udf(data_type=pa.int64())
def doubled(x: pa.Array) -> pa.Array:
    _seen(len(x))
    return pa.compute.multiply(x, 2)


@mv.udf(data_type=pa.int64())
def blob_size(blob: pa.Array) -> pa.Array:
    _seen(len(blob))
    return pa.compute.binary_length(blob).cast(pa.int64())


def _batches(log) -> list[int]:
    sizes = [int(x) for x in log.read_text().split()] if log.exists() else []
    log.unlink(missing_ok=True)
    return sizes


def test_a_cheap_udf_gets_large_batches_and_wide_rows_stay_bounded(tmp_path, monkeypatch):
    """Per batch the engine pays a fixed Python cost, so scanner batches are
    joined into compute batches of up to 65,536 rows, but never beyond
    32 MiB (wide rows) and never when checkpoints are saved every N rows."""
    log = tmp_path / "batches.txt"
    monkeypatch.setenv("MV_TEST_BATCH_LOG", str(log))
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    n = 150_000
    src = db.create_table("src", pa.table({"id": pa.array(range(n)), "x": pa.array(range(n))}), primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": doubled}))
    assert view.refresh().udf_rows_computed == {"y": n}
    seen = _batches(log)
    assert sum(seen) == n and 8192 < max(seen) <= 65_536
    assert view.to_arrow().sort_by("id").column("y").to_pylist() == [2 * i for i in range(n)]
    db.create_materialized_view("v2", src.search(None).select({"id": "id", "y": doubled})).refresh(checkpoint_size=4096)
    seen = _batches(log)
    assert sum(seen) == n and max(seen) <= 4096
    # 5 KB rows: 8,192 of them are already over 32 MiB, so batches are not joined
    wide = db.create_table("wide", pa.table({"id": pa.array(range(10_000)), "blob": pa.array([b"x" * 5000] * 10_000)}))
    w = db.create_materialized_view("w", wide.search(None).select({"id": "id", "size": blob_size}))
    assert w.refresh().udf_rows_computed == {"size": 10_000}
    seen = _batches(log)
    assert sum(seen) == 10_000 and max(seen) <= 8192


class TwoCores(mv.InlineRunner):
    """The inline runner, saying it runs two tasks at once (as local[2] does)."""

    def parallelism(self) -> int:
        return 2


def test_a_backfill_makes_one_task_per_core_when_fragments_do_not_divide_evenly(tmp_path):
    """Eight fragments, the first with a few rows already computed, on two
    cores: two tasks of four fragments, not 4 + 3 + 1 (a second wave)."""
    db = mv.connect(str(tmp_path), runner=TwoCores())
    t = db.create_table("t", _rows(1000))
    for k in range(1, 8):
        t.add(_rows(1000, 1000 * k))
    t.add_columns({"y": plus_f})
    t.backfill("y", where="id < 30")
    r = t.backfill("y")
    assert r.udf_rows_computed == 7970 and r.timings["tasks"] == 2
    assert sorted(t.to_arrow().column("y").to_pylist()) == [i + 1.0 for i in range(8000)]


def test_a_refresh_makes_one_task_per_core_when_changed_rows_do_not_divide_evenly(tmp_path):
    """Eight appended fragments, one a little smaller, on two cores: two tasks, not 4 + 3 + 1."""
    db = mv.connect(str(tmp_path), runner=TwoCores())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(10)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": i, "x": i} for i in range(10, 980)])
    for k in range(1, 8):
        src.add([{"id": i, "x": i} for i in range(980 + 1000 * (k - 1), 980 + 1000 * k)])
    r = view.refresh()
    assert (r.rows_inserted, r.tasks) == (7970, 2)
    assert actual_view(view) == expected_view(src.uri, src.version, lambda row: True, _project)


@mv.udf(name="plus")
def plus_again(x: int) -> int:
    return x + 2


def test_a_view_udf_column_backfills_in_one_pass(tmp_path, monkeypatch):
    """A view's UDF column after a code change: computed and written in one
    pass (one plan file, no checkpoint batch files, removed after), for the
    rows whose source row is unchanged since the view's refresh; the refresh
    recomputes the others with the new code."""
    from mv_assets.storage import objects

    writes = _record_arrow_writes(monkeypatch)
    db = mv.connect(str(tmp_path), runner=TwoCores())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(3000)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(3000, 5000)])
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh(max_rows_per_task=1000)  # several view fragments
    view.alter_columns({"path": "y", "udf": plus_again})
    src.update("id = 4", values_sql={"x": "x + 3"})  # changed in the source since the view's refresh
    assert view.plan_backfill("y").rows == 3333 - 1
    r = view.backfill("y")
    assert (r.rows_planned, r.rows_written, r.udf_rows_computed, r.timings["tasks"]) == (3332, 3332, 3332, 2)
    assert len(writes) == 1 and not objects.exists(writes[0])  # the plan, gone after the commit
    got = {row["id"]: row["y"] for row in view.to_arrow().to_pylist()}
    assert got == {i: (5 if i == 4 else i + 2) for i in range(5000) if i % 3}  # id 4: still the old code's
    assert view.backfill("y").rows_planned == 0
    view.refresh()  # the source's change, with the new code
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, lambda row: {"id": row["id"], "y": row["x"] + 2})
    # a given checkpoint_size still takes the staged path (checkpoint batches in files)
    view.alter_columns({"path": "y", "udf": plus})
    assert view.backfill("y", checkpoint_size=1000).batches == 4 and len(writes) > 2


def test_a_first_refresh_without_filter_plans_from_fragment_metadata(tmp_path, monkeypatch):
    """No filter: whole fragments without deletions need no scan of the
    source's row addresses to be planned; one with deletions still is."""
    from test_hardening import _record_scans

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(3000)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(3000, 3500)])
    query = src.search(None).select({"id": "id", "y": plus})
    view = db.create_materialized_view("v", query)
    scans = _record_scans(monkeypatch)
    plan = view.plan_refresh(max_rows_per_task=1000)
    assert [s for s in scans if s[1] == src.uri] == []
    assert [t.rows for t in plan.tasks] == [1000, 1000, 1000, 500]
    monkeypatch.undo()
    view.refresh(max_rows_per_task=1000)
    assert actual_view(view) == expected_view(src.uri, src.version, lambda row: True, _project)
    src.delete("id % 7 = 0 AND id < 3000")
    w = db.create_materialized_view("w", query)
    scans = _record_scans(monkeypatch)
    assert [t.rows for t in w.plan_refresh(max_rows_per_task=1000).tasks] == [1000, 1000, 571, 500]
    assert [s for s in scans if s[1] == src.uri]  # the fragment with deletions is scanned
    monkeypatch.undo()
    w.refresh(max_rows_per_task=1000)
    assert actual_view(w) == expected_view(src.uri, src.version, lambda row: True, _project)


@mv.udf(data_type=pa.int64(), batch_size=1000, on_error="skip")
def doubled_in_thousands(x: pa.Array) -> pa.Array:
    _seen(len(x))
    if 4321 in x.to_pylist():
        raise ValueError("4321")
    return pa.compute.multiply(x, 2)


def test_a_udf_batch_size_bounds_the_rows_per_call(tmp_path, monkeypatch):
    """A model's memory bound: never more than batch_size rows per call;
    failing rows are still found and recorded by their own row id."""
    log = tmp_path / "batches.txt"
    monkeypatch.setenv("MV_TEST_BATCH_LOG", str(log))
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    n = 20_000
    src = db.create_table("src", pa.table({"id": pa.array(range(n)), "x": pa.array(range(n))}), primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": doubled_in_thousands}))
    assert view.refresh().udf_rows_computed == {"y": n}
    seen = _batches(log)
    assert max(seen) <= 1000 and sum(s for s in seen if s > 1) >= n
    got = {r["id"]: r["y"] for r in view.to_arrow().to_pylist()}
    assert got == {i: (None if i == 4321 else 2 * i) for i in range(n)}
    (err,) = view.get_errors()
    assert err.message == "4321" and err.row_id == lance.dataset(src.uri).to_table(
        filter="id = 4321", with_row_id=True).column("_rowid")[0].as_py()
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        mv.udf(lambda x: x, data_type=pa.int64(), batch_size=0)


@mv.udf(data_type=pa.int64(), batch_size=5)
def plus_one_in_fives(v: pa.Array) -> pa.Array:
    _seen(len(v))
    return pa.array([x + 1 for x in v.to_pylist()], pa.int64())


@mv.udf(data_type=pa.int64(), batch_size=7)
def plus_two_in_sevens(v: pa.Array) -> pa.Array:
    _seen(len(v))
    return pa.array([x + 2 for x in v.to_pylist()], pa.int64())


def test_batch_size_holds_for_a_udf_given_its_input_columns(db, tmp_path, monkeypatch):
    """@udf(batch_size=N) bounds the rows per call when the UDF is given its
    input columns, (udf, [columns]) in a view's select and in add_columns, and
    when backfill(udf=...) maps a replacement onto the column's inputs."""
    log = tmp_path / "batches.txt"
    monkeypatch.setenv("MV_TEST_BATCH_LOG", str(log))
    n = 104
    src = db.create_table("src", pa.table({"id": pa.array(range(n)), "w": pa.array(range(n))}), primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "c": (plus_one_in_fives, ["w"])}))
    assert view.refresh().udf_rows_computed == {"c": n}
    seen = _batches(log)
    assert max(seen) == 5 and sum(seen) == n, seen
    assert {r["id"]: r["c"] for r in view.to_arrow().to_pylist()} == {i: i + 1 for i in range(n)}

    src.add_columns({"d": (plus_one_in_fives, ["w"])})
    assert src.backfill("d").udf_rows_computed == n
    seen = _batches(log)
    assert max(seen) == 5 and sum(seen) == n, seen

    assert src.backfill("d", udf=plus_two_in_sevens).udf_rows_computed == n
    seen = _batches(log)
    assert max(seen) == 7 and sum(seen) == n, seen
    assert {r["id"]: r["d"] for r in src.to_arrow().to_pylist()} == {i: i + 2 for i in range(n)}


def test_a_full_refresh_is_planned_like_a_first_refresh_and_replaces_every_fragment(tmp_path):
    """mode="full" over a populated view computes whole fragments by address
    range (as into an empty view), not scattered ids, and its commit removes
    the view's fragments instead of deleting row by row."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"id": list(range(3000)), "x": list(range(3000))}))
    t.optimize()
    full = db.create_materialized_view("v", t.search(None).where("x % 7 != 0").select({"id": "id", "y": "x + 1"}))
    fresh = db.create_materialized_view("w", t.search(None).where("x % 7 != 0").select({"id": "id", "y": "x + 1"}))
    full.refresh()
    t.delete("id < 10")
    t.add(pa.table({"id": [5000], "x": [5]}))
    plan = full.plan_refresh(mode="full")
    assert [p for task in plan.tasks for p in task.parts] == [p for task in fresh.plan_refresh().tasks for p in task.parts]
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (1, 2571 - 8, 8)  # ids 1-9 but 7 left
    old = {f.fragment_id for f in lance.dataset(full.uri).get_fragments()}
    full.refresh(mode="full")
    assert not old & {f.fragment_id for f in lance.dataset(full.uri).get_fragments()}
    fresh.refresh()
    assert sorted(full.to_arrow().select(["id", "y"]).to_pylist(), key=lambda r: r["id"]) == sorted(
        fresh.to_arrow().select(["id", "y"]).to_pylist(), key=lambda r: r["id"])


def test_a_full_refresh_is_one_overwrite_and_views_over_it_follow(tmp_path):
    """The rebuild commits an Overwrite (no per-row version metadata to derive);
    a view with an added column keeps its schema, and a view over it sees a
    full replacement and equals its query again."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"id": list(range(50)), "x": list(range(50))}))
    v = db.create_materialized_view("v", t.search(None).where("x % 2 = 0").select({"id": "id", "y": "x + 1"}))
    v.refresh()
    v.add_columns({"z": "x * 3"})  # a view's computed columns read its source
    w = db.create_materialized_view("w", v.search(None).where("y > 10").select({"id": "id", "y": "y"}))
    w.refresh()
    schema = lance.dataset(v.uri).schema
    t.update("id < 5", {"x": 1000})
    v.refresh(mode="full")
    ds = lance.dataset(v.uri)
    assert type(ds.read_transaction(ds.version).operation).__name__ == "Overwrite"
    assert ds.schema == schema
    expect = sorted((r["id"], r["x"] + 1) for r in t.to_arrow().to_pylist() if r["x"] % 2 == 0)
    assert sorted((r["id"], r["y"]) for r in v.to_arrow().to_pylist()) == expect
    w.refresh()
    assert sorted((r["id"], r["y"]) for r in w.to_arrow().to_pylist()) == [e for e in expect if e[1] > 10]
    v.backfill("z")
    assert all(r["z"] == (r["y"] - 1) * 3 for r in v.to_arrow().to_pylist())
    t.add(pa.table({"id": [60], "x": [60]}))  # new rows get the added SQL column (and its marker) at once
    v.refresh()
    assert v.column_status()[0]["stale"] == 0 and all(r["z"] == (r["y"] - 1) * 3 for r in v.to_arrow().to_pylist())


def test_compacting_a_view_rewrites_only_its_small_fragments(tmp_path, monkeypatch):
    from mv_assets.ops import refresh as refresh_ops

    monkeypatch.setattr(refresh_ops, "TARGET_ROWS_PER_FRAGMENT", 1000)
    monkeypatch.setattr(refresh_ops, "COMPACT_SMALL_FRAGMENTS", 3)
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(900))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    big = [f.fragment_id for f in lance.dataset(v.uri).get_fragments()]
    assert len(big) == 1
    for i in range(5):  # small refreshes, each one more small fragment: compacted after the 4th
        t.add(_rows(10, start=1000 + 10 * i))
        v.refresh()
    frags = lance.dataset(v.uri).get_fragments()
    # the 900-row fragment is not rewritten to absorb the small ones (it was: the
    # whole view copied to merge 40 rows); the small ones were merged together
    assert frags[0].fragment_id == big[0] and frags[0].metadata.physical_rows == 900
    assert len(frags) < 5
    assert actual_view(v) == expected_view(t.uri, t.version, lambda r: True, lambda r: {"id": r["id"], "x": r["x"]})


def _task_predicates(plan) -> list[str]:
    return [p[1] for t in plan.tasks for p in t.parts]


def test_scattered_changed_rows_are_read_by_their_span_and_the_filter_not_a_list_of_ids(tmp_path):
    """Rows an update rewrote, of which only some pass the view's filter, are
    scattered in the rewritten fragment: the task reads them by their address
    span and the change and view filters (every candidate of the span is to be
    computed), not by a list of hundreds of ids; when only some candidates of a
    span are to be computed (a refresh comparing row versions), by their ids."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(900)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.update("id < 600", values_sql={"x": "x + 3"})  # 600 rows rewritten, 400 of them pass: 200 runs
    plan = view.plan_refresh()
    assert plan.rows_to_update == 400 and plan.reason == "incremental"
    predicates = _task_predicates(plan)
    assert predicates and all("_rowid IN" not in p and "_row_last_updated_at_version >" in p for p in predicates)
    assert sum(p[2] for t in plan.tasks for p in t.parts) == 400
    r = view.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (0, 400, 0)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
    # another tool overwrote every other row of the view: the refresh repairs them, and as
    # the other candidates of their span are current, it chooses them by id
    lance.dataset(view.uri).update({"y": "-1"}, where="id % 2 = 0")
    plan = view.plan_refresh()
    assert plan.repaired and plan.rows_to_update == 300
    assert any(p.startswith("_rowid IN (") for p in _task_predicates(plan))
    view.refresh()
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


def test_an_incremental_refresh_reads_the_views_keys_not_their_row_versions(tmp_path, monkeypatch):
    """In an incremental refresh the view reflects exactly its source version:
    no changed row can be current in it, so only its keys are read."""
    from mv_assets.model.names import SOURCE_ROW_VERSION

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(100)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.update("id < 10", values_sql={"x": "x + 1"})
    src.delete("id = 50")
    read = []
    real = lance.LanceDataset.to_table

    def to_table(self, *a, **k):
        if self.uri == view.uri:
            read.append(list(k.get("columns") or []))
        return real(self, *a, **k)

    real_batches = lance.LanceDataset.to_batches
    real_fragment_batches = lance.fragment.LanceFragment.to_batches

    def to_batches(self, *a, **k):  # (the keys are streamed: only those of changed rows are kept)
        if self.uri == view.uri:
            read.append(list(k.get("columns") or []))
        return real_batches(self, *a, **k)

    def fragment_batches(self, *a, **k):  # (... fragment by fragment, in ranges of rows)
        if self._ds.uri == view.uri:
            read.append(list(k.get("columns") or []))
        return real_fragment_batches(self, *a, **k)

    monkeypatch.setattr(lance.LanceDataset, "to_table", to_table)
    monkeypatch.setattr(lance.LanceDataset, "to_batches", to_batches)
    monkeypatch.setattr(lance.fragment.LanceFragment, "to_batches", fragment_batches)
    r = view.refresh()
    monkeypatch.undo()
    assert read and all(SOURCE_ROW_VERSION not in cols for cols in read)
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (4, 3, 4)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


def test_rows_only_appended_after_a_cleaned_up_version_are_still_refreshed_incrementally(tmp_path):
    """Appends alone since the version the view reflects: nothing of that version
    is read (the view recorded the source's largest fragment id then), so a
    history cleanup that removed it leaves the refresh incremental."""
    import time
    from datetime import timedelta

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(60)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    reflected = src.version
    time.sleep(2.0)
    src.add([{"id": i, "x": i} for i in range(60, 70)])
    src.add([{"id": i, "x": i} for i in range(70, 75)])
    lance.dataset(src.uri).cleanup_old_versions(older_than=timedelta(seconds=1))
    assert reflected not in {v["version"] for v in lance.dataset(src.uri).versions()}
    plan = view.plan_refresh()
    assert plan.reason == "incremental" and plan.rows_to_insert == 10
    r = view.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (10, 0, 0)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
    # a delete since: the change feed needs the reflected version, which is gone: rows are compared
    time.sleep(2.0)
    src.delete("id = 61")
    lance.dataset(src.uri).cleanup_old_versions(older_than=timedelta(seconds=1))
    assert view.plan_refresh().reason.startswith("the source's history up to version")
    view.refresh()
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


@pytest.mark.parametrize("appended", [7, 301])
def test_appended_rows_split_into_small_tasks_refresh(tmp_path, appended):
    """Rows only appended, split into tasks of 3 rows: the last task may hold one
    row, read by a one-address range with the creation-version filter, which
    Lance 14 evaluates only when that column is read too (it failed with
    "number of columns..." / "No field named _row_created_at_version")."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(10)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": i, "x": 3 * i + 1} for i in range(10, 10 + appended)])  # every appended row passes
    r = view.refresh(max_rows_per_task=3)
    assert r.rows_inserted == appended and r.tasks == -(-appended // 3)
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


def _deleted_and_updated(tmp_path, n: int):
    """A table of ``n`` rows and a 1:1 view of it, refreshed; then 1% of the
    rows deleted, all over the view, and rows 0-49 updated (moved to a new
    fragment)."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", pa.table({"id": pa.array(range(n), pa.int64()), "x": pa.array(range(n), pa.int64())}),
                          primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x >= 0").select({"id": "id", "x": "x"}))
    view.refresh()
    src.delete("id % 100 = 7")
    src.update("id < 50", values_sql={"x": "x + 1"})
    return src, view


@pytest.mark.parametrize("n", [20_000, 200_000])
def test_planning_a_delete_holds_only_the_changed_rows_keys(tmp_path, monkeypatch, n):
    """A 1% delete (and an update) is planned holding the view's keys of the
    changed rows only: the keys are streamed once and those rows kept, so
    the memory is O(changed rows), the same for a view 10x larger (before:
    every view row's key and address were held: 617 MB at 10M rows)."""
    src, view = _deleted_and_updated(tmp_path, n)
    held, whole = view_key_reads(monkeypatch, view.uri)
    plan = view.plan_refresh()
    monkeypatch.undo()
    deleted = n // 100
    updated = 50 - len([i for i in range(50) if i % 100 == 7])
    assert (plan.rows_to_delete, plan.rows_to_update) == (deleted, updated)
    assert held == [(n, deleted + updated)]  # every key streamed once, only the changed rows' kept
    assert not whole  # the view's keys were never read whole
    r = view.refresh()
    assert (r.rows_deleted, r.rows_updated) == (deleted, updated)
    assert view.to_arrow().num_rows == n - deleted


@pytest.mark.parametrize("n", [20_000, 200_000])
def test_planning_a_partition_run_holds_only_its_rows_and_the_deleted_rows_keys(tmp_path, monkeypatch, n):
    """A refresh scoped to one source fragment (a Dagster partition run) holds
    the view's keys of that fragment's rows and of the rows deleted anywhere
    only (those from the change feed since the whole view's version): the
    memory is O(changed rows), the same for a view 10x larger (before: every
    view row's key, version and address were held: 621 MB at 10M rows,
    bench/bench_delete_plan.py --scoped)."""
    src, view = _deleted_and_updated(tmp_path, n)
    newest = max(src.fragment_ids())
    held, whole = view_key_reads(monkeypatch, view.uri)
    plan = view.plan_refresh(fragments=[newest])
    monkeypatch.undo()
    deleted = n // 100
    updated = 50 - len([i for i in range(50) if i % 100 == 7])
    assert (plan.rows_to_delete, plan.rows_to_update) == (deleted, updated)
    assert held == [(n, deleted + updated)]  # every key streamed once, only those rows' kept
    assert not whole  # the view's keys were never read whole
    r = view.refresh(fragments=[newest])
    assert (r.rows_deleted, r.rows_updated) == (deleted, updated)
    got = view.to_arrow().sort_by("id")
    assert got == src.to_arrow().select(["id", "x"]).sort_by("id")


def test_a_load_and_a_delete_in_one_fragment_of_many_are_planned_from_that_fragment(tmp_path, monkeypatch):
    """Rows loaded in place (``load_columns``: a ``rewrite_columns`` commit that
    moves their versions) and rows deleted, all in one fragment of eight: the
    plan scans that fragment of the source, not the table (the commits name
    the fragments updated in place; before, such a commit made the plan scan
    every fragment for changed row versions: 15,960 rows here). Exact either
    way, and after a compaction moved the loaded rows into a new fragment."""
    import numpy as np
    import pyarrow.parquet as pq

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", pa.table({"id": np.arange(1000), "x": np.arange(1000)}), primary_key="id")
    for k in range(1, 8):
        src.add(pa.table({"id": np.arange(k * 1000, (k + 1) * 1000), "x": np.arange(k * 1000, (k + 1) * 1000)}))
    assert [f.count_rows() for f in lance.dataset(src.uri).get_fragments()] == [1000] * 8
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    scanned = []
    real = lance.LanceDataset.scanner

    def scanner(self, *a, **k):  # rows of the source Lance scans
        if self.uri == src.uri:
            k["scan_stats_callback"] = lambda s: scanned.append(int(s.all_counts.get("rows_scanned", 0)))
        return real(self, *a, **k)

    def plan_and_refresh(expected: tuple[int, int, int]) -> int:
        scanned.clear()
        monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)
        plan = view.plan_refresh()
        monkeypatch.undo()
        assert plan.reason == "incremental"
        assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == expected
        r = view.refresh()
        assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == expected
        assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
        return sum(scanned)

    # 12 rows of fragment 3 loaded (x + 1: 4 rows now pass, 4 now fail, 4 pass before and after)
    pq.write_table(pa.table({"id": np.arange(3000, 3012), "x": np.arange(3001, 3013)}), tmp_path / "x.parquet")
    src.load_columns(str(tmp_path / "x.parquet"), "id", ["x"])
    src.delete("id >= 3500 AND id < 3520")  # 20 rows of the same fragment, 13 of them in the view
    rows = plan_and_refresh((4, 4, 17))
    assert 0 < rows <= 2 * 1000, rows  # that fragment, scanned for rows passing and for rows failing the filter
    # a load, then a compaction that moves the loaded rows into new fragments: exact (those are scanned)
    pq.write_table(pa.table({"id": np.arange(6000, 6003), "x": [1, 2, 3]}), tmp_path / "y.parquet")
    src.load_columns(str(tmp_path / "y.parquet"), "id", ["x"])
    lance.dataset(src.uri).optimize.compact_files(target_rows_per_fragment=2000)
    plan_and_refresh((1, 1, 1))


def test_commits_that_change_no_row_are_planned_without_reading_the_views_keys(tmp_path, monkeypatch):
    """An update and a delete that match no row still commit: the plan finds
    them changing nothing (already current) and reads none of the view's keys
    (before: all of them; then an incremental plan reading none)."""
    from mv_assets.ops import refresh as refresh_ops

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(100)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    before = src.version
    src.update("id < 0", values_sql={"x": "x + 1"})
    src.delete("id < 0")
    assert src.version == before + 2
    read = []
    real = refresh_ops.ViewKeys.touching

    def touching(self, ids):
        out = real(self, ids)
        read.append(self.rows_read)
        return out

    monkeypatch.setattr(refresh_ops.ViewKeys, "touching", touching)
    plan = view.plan_refresh()
    monkeypatch.undo()
    assert plan.reason == "already current" and (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (
        0, 0, 0)
    assert read == []
    view.refresh()
    assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)


def test_the_only_task_of_a_small_refresh_writes_no_task_checkpoint(tmp_path, monkeypatch):
    """A refresh's only task, quicker than a checkpoint's worth of time, saves
    no task checkpoint, UDF columns or not (a crash before the commit redoes
    less than that; the checkpoint cost every small refresh its write and
    removal); a refresh of several tasks still checkpoints each, and a task
    checkpoint that does not read back whole counts as absent."""
    saved: list[str] = []
    real = tasks._save_checkpoint
    monkeypatch.setattr(tasks, "_save_checkpoint", lambda spec, result: (saved.append(spec.task_id), real(spec, result)))
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(50)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": i, "x": i} for i in range(50, 60)])
    r = view.refresh()
    assert r.tasks == 1 and r.udf_rows_computed == {"y": 10} and saved == []
    src.add([{"id": i, "x": i} for i in range(60, 70)])
    src.add([{"id": i, "x": i} for i in range(70, 80)])
    assert view.refresh(max_rows_per_task=10).tasks == 2 and len(saved) == 2
    assert actual_view(view) == expected_view(src.uri, src.version, lambda row: True, _project)
    # a torn checkpoint (an OS crash after its rename, before its data: it is not fsynced) reads as absent
    spec = tasks.TaskSpec(task_id="t1", src_uri=src.uri, src_version=src.version, parts=[], view_uri=view.uri, rows=0,
                          checkpoint_dir=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "t1.json").write_text('{"task_id": "t1", "fragm')
    assert tasks.load_checkpoint(spec) is None


def test_a_refresh_with_nothing_new_reads_no_history(tmp_path, monkeypatch):
    """Neither the source nor the view moved since the last refresh: the plan
    reads the view's state and both tables' versions, not the source's history,
    the view's writers or the columns it reads; a source dropped and created
    again (same version numbers, another table) is not taken for unmoved."""
    from mv_assets.ops import refresh as refresh_ops

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(20)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 3 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": 20, "x": 20}])
    view.refresh()
    read: list[str] = []
    for name in ("read_history", "foreign_writes", "commits_since", "read_field_ids"):
        real = getattr(refresh_ops, name)
        monkeypatch.setattr(refresh_ops, name, lambda *a, _n=name, _r=real, **k: (read.append(_n), _r(*a, **k))[1])
    r = view.refresh()
    assert r.runner == "none" and r.view_version == view.version and read == []
    assert view.plan_refresh().reason == "already current"
    # another tool drops the source and writes another table there, to the same version: rebuilt, not skipped
    version = src.version
    shutil.rmtree(src.uri)
    lance.write_dataset(pa.table({"id": [0], "x": [100]}), src.uri, enable_stable_row_ids=True)
    while lance.dataset(src.uri).version < version:
        n = lance.dataset(src.uri).count_rows()
        lance.write_dataset(pa.table({"id": [n], "x": [n + 100]}), src.uri, mode="append")
    assert lance.dataset(src.uri).version == version
    assert "created again" in view.plan_refresh().reason
    assert view.refresh().full
    assert actual_view(view) == expected_view(src.uri, version, lambda row: row["x"] % 3 != 0, _project)


def test_a_task_run_in_process_hands_over_its_fragments_and_sends_them_as_json(tmp_path, monkeypatch):
    """A task run in this process hands its view fragments to the commit as
    Lance's FragmentMetadata (no JSON made and read back); a result sent from
    a worker (or read from a task checkpoint) carries them as JSON, and both
    commit the same rows."""
    made: list[int] = []
    real = tasks.TaskResult.fragment_json
    monkeypatch.setattr(tasks.TaskResult, "fragment_json", lambda self: (made.append(1), real(self))[1])
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(30)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).where("x % 4 != 0").select({"id": "id", "y": plus}))
    view.refresh()
    src.add([{"id": i, "x": i} for i in range(30, 40)])
    assert view.refresh().rows_inserted == 8 and made == []
    assert actual_view(view) == expected_view(src.uri, src.version, lambda row: row["x"] % 4 != 0, _project)
    # over the wire: JSON, read back as the same fragments
    ds = lance.dataset(view.uri)
    result = tasks.TaskResult(task_id="t", metas=[f.metadata for f in ds.get_fragments()], rows_written=3)
    sent = tasks.TaskResult.from_json(result.to_json())
    assert "metas" not in json.loads(result.to_json()) and sent.metas == []
    assert sent.fragments == [f.metadata.to_json() for f in ds.get_fragments()]
    assert sent.fragment_metadata() == result.fragment_metadata()


def test_a_table_dropped_or_made_again_is_seen_while_its_newest_version_is_held(tmp_path):
    """Whether a dataset is there is read from its versions directory (held
    while the directory is as it was when this process last listed or
    committed): a dropped table reads as gone, one made again as there."""
    from mv_assets.storage import objects

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": 1, "x": 1}], primary_key="id")
    src.add([{"id": 2, "x": 2}])  # (a commit of this process: its newest version held)
    assert objects.is_dataset(src.uri)
    shutil.rmtree(src.uri)
    assert not objects.is_dataset(src.uri)
    (tmp_path / "src.lance" / "_versions").mkdir(parents=True)  # an empty versions directory: no dataset
    assert not objects.is_dataset(src.uri)
    shutil.rmtree(src.uri)
    lance.write_dataset(pa.table({"id": [5]}), src.uri)
    assert objects.is_dataset(src.uri)
