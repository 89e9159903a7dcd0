"""Table-function views (``@mv.udtf`` + ``db.create_udtf_view``): the rows of
each partition give a table, kept incrementally per partition. Checked
against an oracle built with plain pyarrow (the source at the version the
view reflects, grouped by partition value, the same Python function applied)
and by logging the UDTF's real calls, one file per worker process, each call
naming its partition."""

import json
import os
import pickle

import lance
import pyarrow as pa
import pytest
from click.testing import CliRunner
from runners import CrashAfter

import mv_assets as mv
from mv_assets.cli import main

OUT = pa.schema([("g", pa.string()), ("bucket", pa.int64()), ("n", pa.int64()), ("total", pa.int64())])
GROUPS = ["a", "b", "c'd", "e", None]


def summarize(gs: list, xs: list) -> list[tuple]:
    """The UDTF's work and the oracle's: per partition, one row per bucket
    ``x % 3`` of its rows with x >= 0 (count and sum); none without such rows."""
    out: dict[int, list[int]] = {}
    for x in xs:
        if x >= 0:
            out.setdefault(x % 3, []).append(x)
    return [(gs[0], b, len(v), sum(v)) for b, v in sorted(out.items())]


def _log(log_dir: str, key) -> None:
    with open(os.path.join(log_dir, f"agg-{os.getpid()}"), "a") as fh:
        fh.write(json.dumps(key) + "\n")


def make_agg(log_dir: str, partition_by: str | None = "g"):
    @mv.udtf(output_schema=OUT, input_columns=["g", "x"], partition_by=partition_by)
    def agg(t: pa.Table) -> pa.Table:
        gs, xs = t.column("g").to_pylist(), t.column("x").to_pylist()
        _log(log_dir, gs[0] if partition_by else "*")
        rows = summarize(gs, xs) if partition_by else summarize(["all"] * len(xs), xs)
        return pa.Table.from_pylist([dict(zip(OUT.names, r, strict=True)) for r in rows], schema=OUT)

    return agg


def calls(log_dir: str) -> list:
    """The partitions the UDTF was called on since the last look (sorted, NULL first)."""
    out = []
    for f in os.listdir(log_dir):
        with open(os.path.join(log_dir, f)) as fh:
            out += [json.loads(line) for line in fh.read().split("\n") if line]
        os.remove(os.path.join(log_dir, f))
    return sorted(out, key=lambda k: (k is not None, k or ""))


def expected(src_uri: str, version: int, keep=lambda r: r["id"] > 0, whole: bool = False) -> list[tuple]:
    """Every view row, from the source at ``version`` grouped with plain pyarrow."""
    t = lance.dataset(src_uri, version=version).to_table(columns=["id", "g", "x"])
    rows = [r for r in t.to_pylist() if keep(r)]
    if whole:
        return sorted(summarize(["all"] * len(rows), [r["x"] for r in rows])) if rows else []
    groups: dict = {}
    for r in rows:
        groups.setdefault(r["g"], []).append(r["x"])
    out = []
    for g, xs in groups.items():
        out += summarize([g] * len(xs), xs)
    return sorted(out, key=repr)


def actual(view, whole: bool = False) -> list[tuple]:
    t = lance.dataset(view.uri).to_table()
    rows = list(zip(*(t.column(c).to_pylist() for c in OUT.names), strict=True))
    keys = t.column("__partition").to_pylist()
    for row, key in zip(rows, keys, strict=True):  # each row names its partition
        assert key == ("*" if whole else json.dumps(row[0])), (row, key)
    return sorted(rows, key=repr)


def src_rows(ids, g=lambda i: GROUPS[i % len(GROUPS)], x=lambda i: i - 3):
    return [{"id": i, "g": g(i), "x": x(i), "title": f"t{i}"} for i in ids]


def _setup(db, log_dir, n=20):
    src = db.create_table("src", src_rows(range(n)), primary_key="id")
    view = db.create_udtf_view("parts", src.search(None).where("id > 0"), make_agg(log_dir))
    return src, view


def test_a_udtf_view_recomputes_only_the_partitions_whose_rows_changed(db, call_log):
    src, view = _setup(db, call_log)
    r = view.refresh()
    assert calls(call_log) == [None, "a", "b", "c'd", "e"] and r.udf_rows_computed == {"agg": 5}
    assert actual(view) == expected(src.uri, src.version)

    src.add(src_rows([40, 45], g=lambda i: "b"))  # one partition of many
    r = view.refresh()
    assert calls(call_log) == ["b"] and (r.rows_inserted, r.rows_updated, r.rows_deleted) == (0, 1, 0)
    assert actual(view) == expected(src.uri, src.version)

    src.delete("g = 'e'")  # every row of a partition: its output goes, no call
    r = view.refresh()
    assert calls(call_log) == [] and r.rows_deleted == 1 and r.udf_rows_computed == {}
    assert actual(view) == expected(src.uri, src.version)

    src.update("id = 5", values_sql={"g": "'c''d'"})  # a row moves from 'a' to "c'd": both
    assert view.plan_refresh().udf_rows == {"agg": 2}
    view.refresh()
    assert calls(call_log) == ["a", "c'd"]
    assert actual(view) == expected(src.uri, src.version)

    src.update("id = 6", values_sql={"g": "'new'"})  # into a new partition
    r = view.refresh()
    assert calls(call_log) == ["b", "new"] and (r.rows_inserted, r.rows_updated) == (1, 1)
    assert actual(view) == expected(src.uri, src.version)

    src.add(src_rows([50], g=lambda i: None))  # the NULL partition is one partition
    view.refresh()
    assert calls(call_log) == [None]
    assert actual(view) == expected(src.uri, src.version)

    lance.dataset(src.uri).update({"id": "-1"}, where="id = 7")  # another tool: no longer passes the filter
    view.refresh()
    assert calls(call_log) == ["c'd"]
    assert actual(view) == expected(src.uri, src.version)

    lance.dataset(src.uri).optimize.compact_files()  # moves rows, changes none
    before = lance.dataset(view.uri).version
    r = view.refresh()
    assert calls(call_log) == [] and (r.rows_inserted, r.rows_updated, r.rows_deleted) == (0, 0, 0)
    assert lance.dataset(view.uri).version <= before + 1  # at most a state-only commit
    plan = view.plan_refresh()
    assert plan.reason == "already current" and plan.udf_rows == {}  # nothing changed: no scan, no call
    assert view.refresh().udf_rows_computed == {} and calls(call_log) == []
    assert actual(view) == expected(src.uri, src.version)

    plan = view.plan_refresh(mode="full")
    assert plan.full and plan.udf_rows == {"agg": 5}  # None, a, b, c'd, new


def test_a_partition_whose_output_is_empty_and_rows_that_never_pass_the_filter(db, call_log):
    src, view = _setup(db, call_log)
    view.refresh()
    calls(call_log)
    src.add(src_rows([60, 61], g=lambda i: "neg", x=lambda i: -5))  # a partition with no output rows
    r = view.refresh()
    assert calls(call_log) == ["neg"] and r.rows_inserted == 1
    assert actual(view) == expected(src.uri, src.version)
    src.update("id = 0", values_sql={"g": "'zero'", "x": "7"})  # fails the filter (id > 0) before and after
    r = view.refresh()
    assert calls(call_log) == [] and r.udf_rows_computed == {} and r.rows_updated == 0
    src.delete("g = 'neg'")  # a partition that had no view rows goes: nothing to do
    r = view.refresh()
    assert calls(call_log) == [] and (r.rows_inserted, r.rows_updated, r.rows_deleted) == (0, 0, 0)
    assert actual(view) == expected(src.uri, src.version)


def test_without_partition_by_the_whole_source_is_one_partition(db, call_log):
    src = db.create_table("src", src_rows(range(1, 10)))
    view = db.create_udtf_view("whole", src.search(None).where("x > 0"), make_agg(call_log, partition_by=None))
    view.refresh()
    assert calls(call_log) == ["*"]
    assert actual(view, whole=True) == expected(src.uri, src.version, lambda r: r["x"] > 0, whole=True)
    src.add(src_rows([20]))
    view.refresh()
    assert calls(call_log) == ["*"]
    assert actual(view, whole=True) == expected(src.uri, src.version, lambda r: r["x"] > 0, whole=True)
    src.update("id = 1", values_sql={"title": "'x'"})  # a row that does not pass: nothing to compute
    assert view.refresh().udf_rows_computed == {} and calls(call_log) == []
    view.refresh()
    assert calls(call_log) == []
    src.delete("id > 0")  # no row left: the output goes, no call
    r = view.refresh()
    assert calls(call_log) == [] and r.rows_deleted == 1 and lance.dataset(view.uri).count_rows() == 0


def test_a_udtf_without_input_columns_reads_the_columns_its_query_selects(db, call_log, tmp_path):
    """Geneva's "the whole source": a UDTF declared without input_columns
    reads the columns of its view's source query, fixed when the view is
    created (all of them, or those select() names). It receives the partition
    with Geneva's query-builder reads (to_arrow, to_pandas, to_batches with
    batch_size) besides the Table's own; changed partitions are computed
    again, and the view equals the oracle."""
    cols = tmp_path / "columns"  # what each call saw (the UDTF runs from its pickled copy)
    cols.mkdir()
    where = str(cols)

    def seen() -> set:
        out = {tuple(json.loads(line)) for f in os.listdir(where) for line in open(os.path.join(where, f))}
        for f in os.listdir(where):
            os.remove(os.path.join(where, f))
        return out

    @mv.udtf(output_schema=OUT, partition_by="g")
    def agg(source: mv.GenevaQueryBuilder):
        t = source.to_arrow()
        with open(os.path.join(where, f"cols-{os.getpid()}"), "a") as fh:
            fh.write(json.dumps(sorted(t.column_names)) + "\n")
        assert len(source) == t.num_rows == sum(b.num_rows for b in source.to_batches(batch_size=2))
        assert all(b.num_rows <= 2 for b in source.to_batches(batch_size=2))
        assert source.to_pandas().shape == (t.num_rows, t.num_columns) and pa.table(source).equals(t)
        gs, xs = source.column("g").to_pylist(), source["x"].to_pylist()
        _log(call_log, gs[0])
        return pa.Table.from_pylist([dict(zip(OUT.names, r, strict=True)) for r in summarize(gs, xs)], schema=OUT)

    src = db.create_table("src", src_rows(range(1, 12)), primary_key="id")
    view = db.create_udtf_view("parts", src.search(None).select(["g", "x"]), agg)
    assert view.definition.table_function.input_columns == ["g", "x"]  # bound at creation
    view.refresh()
    assert seen() == {("g", "x")}
    assert actual(view) == expected(src.uri, src.version, lambda r: True)
    calls(call_log)
    src.update("id = 5", values_sql={"x": "100"})
    src.delete("id = 7")
    view.refresh()
    assert calls(call_log) == sorted({GROUPS[5 % len(GROUPS)], GROUPS[7 % len(GROUPS)]},
                                     key=lambda k: (k is not None, k or ""))
    assert actual(view) == expected(src.uri, src.version, lambda r: True)

    every = db.create_udtf_view("every", src.search(None), agg)  # no select: every column of the source
    seen()
    every.refresh()
    assert seen() == {("g", "id", "title", "x")}
    assert actual(every) == expected(src.uri, src.version, lambda r: True)


def test_a_udtf_view_refresh_killed_after_some_tasks_resumes_without_recomputing_them(db, call_log):
    src = db.create_table("src", src_rows(range(1, 9), g=lambda i: "pqrs"[i % 4]), primary_key="id")
    view = db.create_udtf_view("parts", src.search(None), make_agg(call_log))

    with pytest.raises(RuntimeError, match="driver died"):
        view.refresh(runner=CrashAfter(), max_rows_per_task=1)  # one partition per task
    assert lance.dataset(view.uri).count_rows() == 0  # nothing half-visible
    first = calls(call_log)
    assert len(first) == 2
    r = view.refresh(max_rows_per_task=1)
    assert (r.tasks, r.tasks_resumed) == (4, 2)
    assert r.udf_rows_computed == {"agg": 2} and r.udf_rows_resumed == {"agg": 2}
    assert sorted(first + calls(call_log)) == ["p", "q", "r", "s"]  # the two unfinished partitions only
    assert actual(view) == expected(src.uri, src.version, keep=lambda r: True)


def test_bad_udtf_views_are_refused_before_anything_is_written(db, call_log):
    src = db.create_table("src", [{"id": 1, "g": "a", "x": 1, "f": 0.5}])
    agg = make_agg(call_log)

    def udtf(**kw):
        return mv.udtf(**{"output_schema": OUT, "input_columns": ["g", "x"], **kw})(lambda t: t)

    cases = [
        (lambda: db.create_udtf_view("c", src.search(None), udtf(input_columns=["g", "nope"])), "nope"),
        (lambda: db.create_udtf_view("c", src.search(None), udtf(input_columns=["gg", "x"], partition_by="gg")), "gg"),
        (lambda: db.create_udtf_view("c", src.search(None), udtf(input_columns=["f"], partition_by="f")), "double"),
        (lambda: db.create_udtf_view("src", src.search(None), agg), "already exists"),
        (lambda: db.create_udtf_view("c", src.search(None).select({"g": "g", "y": "x + 1"}), agg), "select"),
        (lambda: db.create_udtf_view("c", src.search(None).select({"gg": "g", "x": "x"}), agg), "select"),
        (lambda: db.create_udtf_view("c", src.search(None).select(["g", "f"]), agg), "does not select"),
        (lambda: db.create_udtf_view("c", src.search(None).limit(2), agg), "limit"),
        (lambda: db.create_udtf_view("c", src.search(None).where("nope > 1"), agg), "nope"),
        (lambda: db.create_udtf_view("c", src.search(None), lambda t: t), "@udtf"),
        (lambda: udtf(partition_by="x", input_columns=["g"]), "not one of its input_columns"),
        (lambda: mv.udtf(output_schema=pa.schema([("__partition", pa.string())]), input_columns=["g"])(len), "reserved"),
        (lambda: mv.udtf(input_columns=["g"])(len), "output_schema"),
    ]
    for make, match in cases:
        with pytest.raises((ValueError, mv.TableExistsError), match=match):
            make()
        assert "c" not in db.table_names()
    assert calls(call_log) == []


@pytest.mark.parametrize("kind", ["int", "int64_extremes", "bool", "date", "large_string"])
def test_partitions_by_integers_booleans_dates_and_large_strings_with_a_stateful_udtf(db, call_log, kind):
    import datetime as dt

    values = {
        "int": (pa.int32(), lambda i: [7, -1, None][i % 3]),
        # (-2**63 written as a number reads as minus one past int64: a float to DataFusion)
        "int64_extremes": (pa.int64(), lambda i: [-(2**63), 2**63 - 1, None][i % 3]),
        "bool": (pa.bool_(), lambda i: [True, False, None][i % 3]),
        "date": (pa.date32(), lambda i: [dt.date(2024, 1, 31), dt.date(1999, 12, 1), None][i % 3]),
        "large_string": (pa.large_string(), lambda i: ["it's", "a\\b", None][i % 3]),
    }
    dtype, value = values[kind]
    schema = pa.schema([("id", pa.int64()), ("k", dtype), ("x", pa.int64())])
    src = db.create_table("src", pa.Table.from_pylist([{"id": i, "k": value(i), "x": i} for i in range(9)],
                                                      schema=schema))
    out = pa.schema([("n", pa.int64()), ("total", pa.int64())])

    class Sums:  # stateful: made once per worker process; yields batches
        def __init__(self):
            self.log = call_log

        def __call__(self, t: pa.Table):
            with open(os.path.join(self.log, f"s-{os.getpid()}"), "a") as fh:
                fh.write(json.dumps(str(t.column("k")[0].as_py())) + "\n")
            yield pa.record_batch({"n": [t.num_rows], "total": [sum(t.column("x").to_pylist())]}, schema=out)

    # (instances are kept per process by fingerprint: a version of its own keeps this test's call_log)
    sums = mv.udtf(output_schema=out, input_columns=["k", "x"], partition_by="k", version=f"{kind}|{call_log}")(Sums)
    view = db.create_udtf_view("sums", src.search(None), sums)

    def oracle():
        rows = lance.dataset(src.uri, version=view.source_version).to_table().to_pylist()
        groups: dict = {}
        for r in rows:
            groups.setdefault(r["k"], []).append(r["x"])
        return sorted((len(xs), sum(xs)) for xs in groups.values())

    def got():
        t = lance.dataset(view.uri).to_table()
        return sorted(zip(t.column("n").to_pylist(), t.column("total").to_pylist(), strict=True))

    view.refresh()
    assert len(calls(call_log)) == 3 and got() == oracle()
    src.delete("id = 0")  # partition value(0)
    view.refresh()
    assert calls(call_log) == [str(value(0))] and got() == oracle()
    lance.dataset(src.uri).update({"k": "NULL"}, where="id = 4")  # value(1) -> the NULL partition
    view.refresh()
    assert calls(call_log) == sorted(["None", str(value(1))]) and got() == oracle()


def test_what_a_udtf_view_does_not_take(db, call_log):
    src, view = _setup(db, call_log)
    view.refresh()
    calls(call_log)
    src.add(src_rows([90], g=lambda i: "a"))
    plan = view.plan_refresh(fragments=[0])  # a Dagster partition: a table-function view refreshes as a whole
    assert "widened to the whole source" in plan.reason and plan.scope is None and plan.udf_rows == {"agg": 1}
    with pytest.raises(ValueError, match="recompute"):
        view.plan_refresh(recompute=["n"])
    with pytest.raises(ValueError, match="table-function view"):
        view.add_columns({"m": "n + 1"})
    view.refresh(fragments=[0])
    assert calls(call_log) == ["a"] and actual(view) == expected(src.uri, src.version)


def test_checks_of_a_udtf_view(db, call_log):
    """Its rows are a partition's output: checked are the partitions it holds
    (each has passing source rows) and writes by other tools."""
    src, view = _setup(db, call_log)
    view.refresh()
    assert [(o.name, o.passed) for o in view.check()] == [("no_orphan_rows", True), ("values_match_source", True)]
    lance.dataset(src.uri).delete("g = 'a'")
    view.refresh()  # partition "a" is gone from the source and from the view
    assert all(o.passed for o in view.check())
    row = lance.dataset(view.uri).to_table().slice(0, 1)
    row = row.set_column(row.schema.get_field_index("__partition"), "__partition", pa.array(['"zz"']))
    lance.write_dataset(row, view.uri, mode="append")  # another tool adds a row of a partition with no rows
    outcome = {o.name: o for o in view.check()}
    assert not outcome["no_orphan_rows"].passed and outcome["no_orphan_rows"].metadata["sample"] == ['"zz"']
    assert not outcome["values_match_source"].passed
    assert outcome["values_match_source"].metadata["rows_written_outside_refreshes"] == 1


def test_a_failing_udtf_commits_nothing_and_names_the_partition(db, call_log):
    src = db.create_table("src", src_rows(range(1, 6)))

    @mv.udtf(output_schema=OUT, input_columns=["g", "x"], partition_by="g")
    def picky(t: pa.Table) -> pa.Table:
        if t.column("g")[0].as_py() == "b":
            raise RuntimeError("no b today")
        return OUT.empty_table()

    view = db.create_udtf_view("picky", src.search(None), picky)
    with pytest.raises(mv.UdfError, match="no b today") as err:
        view.refresh()
    assert any('partition "b"' in n for n in getattr(err.value, "__notes__", []))
    # (its remedy is not on_error="skip", which a UDTF refuses: it said so)
    assert 'on_error="skip"' not in str(err.value) and "cannot be skipped" in str(err.value)
    assert lance.dataset(view.uri).count_rows() == 0 and view.source_version is None
    assert view.status().load_state == "FAILED_LOAD"
    with pytest.raises(mv.UdfError, match="cannot be skipped"):  # (the same through a pickle: a Spark task's)
        raise pickle.loads(pickle.dumps(err.value))


def test_views_over_a_udtf_view_status_and_the_cli(db, call_log):
    src, view = _setup(db, call_log)
    big = db.create_materialized_view("big", view.search(None).where("n > 1").select(["g", "bucket", "n"]))
    r = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "refresh", "parts", "big", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert [x["view"] for x in json.loads(r.output)] == ["parts", "big"]
    assert calls(call_log) == [None, "a", "b", "c'd", "e"]
    want = sorted(({"g": g, "bucket": b, "n": n} for g, b, n, _ in expected(src.uri, src.version) if n > 1), key=repr)
    assert sorted(big.to_arrow().select(["g", "bucket", "n"]).to_pylist(), key=repr) == want
    src.add(src_rows([70], g=lambda i: "a"))
    assert view.status().versions_behind == 1 and view.status().stale_count == 1
    r = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "plan", "parts", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0 and json.loads(r.output)["udf_rows"] == {"agg": 1}
    r = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "refresh", "parts"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert calls(call_log) == ["a"]
    r = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "status", "parts", "--json"],
                           catch_exceptions=False)
    rec = json.loads(r.output)
    assert rec["load_state"] == "LOADED" and rec["versions_behind"] == 0 and rec["cardinality"] == len(
        expected(src.uri, src.version))
    r = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "tables", "--json"], catch_exceptions=False)
    assert r.exit_code == 0 and {t["name"]: t for t in json.loads(r.output)}["parts"]["source"] == "src"
    db.drop_table("big")
    db.drop_table("parts")
    assert "parts" not in db.table_names()


def test_a_udtf_view_follows_a_pinned_older_version_and_foreign_writes(db, call_log):
    src, view = _setup(db, call_log)
    v1 = src.version
    src.add(src_rows([80, 81]))
    view.refresh()
    calls(call_log)
    r = view.refresh(src_version=v1)  # back to an older version: every partition
    assert r.full and calls(call_log) == [None, "a", "b", "c'd", "e"]
    assert actual(view) == expected(src.uri, v1)
    view.refresh()
    calls(call_log)
    lance.write_dataset(lance.dataset(view.uri).to_table().slice(0, 1), view.uri, mode="append")  # another tool
    with pytest.raises(ValueError, match="cannot be incremental"):
        view.refresh(mode="incremental_strict")
    r = view.refresh()
    assert r.full and len(calls(call_log)) == 5
    assert actual(view) == expected(src.uri, src.version)


def test_a_udtf_view_refreshes_on_spark(spark_db, call_log):
    src = spark_db.create_table("src", src_rows(range(30)), primary_key="id")
    view = spark_db.create_udtf_view("parts", src.search(None).where("id > 0"), make_agg(call_log))
    r = view.refresh(max_rows_per_task=5)
    assert r.runner.startswith("spark") and r.tasks > 1
    assert calls(call_log) == [None, "a", "b", "c'd", "e"]
    assert actual(view) == expected(src.uri, src.version)
    src.add(src_rows([30, 35], g=lambda i: "b"))
    src.delete("g = 'e'")
    src.update("id = 5", values_sql={"g": "'z'"})  # from 'a'
    r = view.refresh()
    assert calls(call_log) == ["a", "b", "z"] and r.rows_deleted == 1
    assert actual(view) == expected(src.uri, src.version)


# --- property test: random histories, writes by mv_assets and by plain pylance ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

UDTF_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4)),
        st.tuples(st.just("delete"), st.integers(0, 4)),
        st.tuples(st.just("move"), st.integers(0, 4)),
        st.tuples(st.just("update_x"), st.integers(0, 4)),
        st.tuples(st.just("pl_append"), st.integers(1, 4)),
        st.tuples(st.just("pl_update"), st.integers(0, 4)),
        st.tuples(st.just("pl_merge_insert"), st.integers(0, 4)),
        st.tuples(st.just("pl_delete_group"), st.integers(0, 4)),
        st.tuples(st.just("pl_compact"), st.just(0)),
        st.tuples(st.just("refresh"), st.just(0)),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
@given(ops=UDTF_OPS)
def test_random_udtf_view_histories_match_the_oracle(ops, tmp_path_factory):
    """After every refresh the view equals the oracle at the version it
    reflects, and the UDTF ran exactly once for each partition whose passing
    rows (id, g, x, and row version) differ from the last refresh's, and for
    no other."""
    root = tmp_path_factory.mktemp("udtf")
    log = str(root / "calls")
    os.makedirs(log)
    db = mv.connect(str(root / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", src_rows(range(6)), primary_key="id")
    view = db.create_udtf_view("parts", src.search(None).where("id % 7 != 3"), make_agg(log))
    keep = lambda r: r["id"] % 7 != 3  # noqa: E731
    next_id = [6]
    seen: dict = {}  # partition -> its passing rows (with row versions) at the last refresh

    def fresh(n):
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    def expect_calls() -> list:
        t = lance.dataset(src.uri).to_table(columns=["id", "g", "x", "_row_last_updated_at_version"])
        now: dict = {}
        for r in t.to_pylist():
            if keep(r):
                now.setdefault(r["g"], set()).add((r["id"], r["x"], r["_row_last_updated_at_version"]))
        want = [g for g, rows in now.items() if seen.get(g) != rows]
        seen.clear()
        seen.update(now)
        return sorted(want, key=lambda k: (k is not None, k or ""))

    for op, arg in list(ops) + [("refresh", 0)]:
        ds = lance.dataset(src.uri)
        group = GROUPS[arg % len(GROUPS)]
        where = "g IS NULL" if group is None else "g = '" + group.replace("'", "''") + "'"
        if op == "add":
            src.add(src_rows(fresh(arg)))
        elif op == "delete":
            src.delete(f"id % 5 = {arg}")
        elif op == "move":
            src.update(f"id % 5 = {arg}", values_sql={"g": "'a'"})
        elif op == "update_x":
            src.update(f"id % 5 = {arg}", values_sql={"x": "x + 1"})
        elif op == "pl_append":
            lance.write_dataset(pa.Table.from_pylist(src_rows(fresh(arg)), schema=ds.schema), src.uri, mode="append")
        elif op == "pl_update":
            ds.update({"x": "x * 2 - 1"}, where=f"id % 5 = {arg}")
        elif op == "pl_merge_insert":
            have = ds.to_table(columns=["id"], filter=f"id % 5 = {arg}").column("id").to_pylist()[:2]
            batch = pa.Table.from_pylist(src_rows(have + fresh(1), g=lambda i: "m"), schema=ds.schema)
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        elif op == "pl_delete_group":
            ds.delete(where)
        elif op == "pl_compact":
            ds.optimize.compact_files()
        elif op == "refresh":
            view.refresh()
            got = calls(log)
            assert actual(view) == expected(src.uri, view.source_version, keep), (op, ops)
            assert got == expect_calls(), (got, ops)
