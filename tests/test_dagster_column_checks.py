"""A table's computed columns as Dagster assets: their checks (values_current,
no_failed_rows), evaluated by the engine in the runs that backfill them, and
their column lineage and schema. Real Lance, a real Dagster instance, the
inline runner (no JVM)."""

import dagster as dg
import lance
import pytest
from dagster_helpers import evaluate_sensor, run_requested

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.assets import COLUMN_CHECK_DESCRIPTIONS
from mv_assets.dagster.definitions import job_name, partitions_def_name

K = dg.AssetKey
Y = K(["src", "y"])


@mv.udf
def double(x: int) -> int:
    return 2 * x


@mv.udf(on_error="skip")
def inverse(x: int) -> float:
    if x == 4:
        raise ValueError(f"cannot invert x={x}")
    return 1.0 / (x + 1)


def _defs(db):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))


def _table(tmp_path, udf=double) -> mv.Connection:
    """src: ids 0-9 in two fragments, y = udf(x) added (not backfilled)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    src.add_columns({"y": udf})
    return db


def _check_only(defs, instance, *checks: str, key: dg.AssetKey = Y) -> dict[str, dg.AssetCheckEvaluation]:
    """The checks tab's Execute: a run of the checks alone (nothing materialized)."""
    assets = [defs.get_repository_def().assets_defs_by_key[key]]
    selection = dg.AssetSelection.checks(*(dg.AssetCheckKey(key, c) for c in checks))
    result = dg.materialize(assets, instance=instance, selection=selection)
    assert result.success and not result.get_asset_materialization_events()
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def _materialize(defs, instance, db, keys) -> dg.ExecuteInProcessResult:
    """Materialize over every partition of src's lineage, as "Materialize" in the UI."""
    frags = [str(f) for f in db.open_table("src").fragment_ids()]
    instance.add_dynamic_partitions(partitions_def_name("src"), frags)
    result = defs.resolve_job_def(job_name("src")).execute_in_process(
        instance=instance, asset_selection=keys,
        tags={"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]})
    assert result.success
    return result


def _md(evaluation) -> dict:
    return {k: v.value for k, v in evaluation.metadata.items()}


def _row_ids(db, where: str) -> list[int]:
    ds = lance.dataset(db.table_uri("src"))
    return sorted(int(i) for i in ds.to_table(columns=[], filter=where, with_row_id=True).column("_rowid").to_pylist())


def test_values_current_warns_on_stale_rows_and_passes_after_a_backfill(tmp_path):
    db = _table(tmp_path)
    defs = _defs(db)
    graph = defs.get_repository_def().asset_graph
    specs = {k.name: graph.get_check_spec(k) for k in graph.asset_check_keys if k.asset_key == Y}
    assert set(specs) == {"values_current", "no_failed_rows"}
    assert {n: s.description for n, s in specs.items()} == {n: COLUMN_CHECK_DESCRIPTIONS[n] for n in specs}
    assert "never computed, failed, computed by older code, or whose inputs were written" in (
        specs["values_current"].description or "")
    with dg.instance_for_test() as instance:
        # before any backfill: every row stale, never computed
        before = _check_only(defs, instance, "values_current")["values_current"]
        assert not before.passed and before.severity == dg.AssetCheckSeverity.WARN
        md = _md(before)
        assert (md["rows"], md["rows_current"], md["rows_stale"], md["rows_never_computed"], md["rows_failed"]) == (
            10, 0, 10, 10, 0)
        assert before.description == ("10 of 10 rows of y are stale (10 never computed); materialize the column: "
                                      "its backfill computes exactly those")
        # the sensor's run backfills y and evaluates its checks after, against the run's materialization
        sensor = defs.get_repository_def().get_sensor_def("src_changes")
        tick = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert not [e for e in tick.asset_events if isinstance(e, dg.AssetCheckEvaluation)]  # none outside a run
        (run,) = run_requested(defs, instance, tick)
        got = {e.check_name: e for e in run.get_asset_check_evaluations() if e.asset_key == Y}
        assert set(got) == {"values_current", "no_failed_rows"} and all(e.passed for e in got.values())
        assert _md(got["values_current"])["rows_current"] == 10
        latest = instance.fetch_materializations(Y, limit=1).records[0]
        assert latest.run_id == run.run_id
        for e in got.values():  # a target materialization: the lineage node counts them as passed
            assert e.target_materialization_data is not None
            assert e.target_materialization_data.storage_id == latest.storage_id
        # another tool rewrites the input of two rows: exactly those are stale
        lance.dataset(db.table_uri("src")).update({"x": "x + 100"}, where="id = 1 OR id = 7")
        after = _check_only(defs, instance, "values_current")["values_current"]
        md = _md(after)
        assert not after.passed and after.severity == dg.AssetCheckSeverity.WARN
        assert (md["rows_stale"], md["rows_inputs_rewritten"], md["rows_current"], md["rows_never_computed"]) == (
            2, 2, 8, 0)
        assert md["sample_row_ids"] == _row_ids(db, "id = 1 OR id = 7")
        assert "2 whose inputs were written since" in (after.description or "")
        # materializing the column mends it: the check evaluated in that run passes
        done = _materialize(defs, instance, db, [Y])
        (current,) = [e for e in done.get_asset_check_evaluations() if e.check_name == "values_current"]
        assert current.passed and _md(current)["rows_stale"] == 0
        assert sorted(r["y"] for r in db.open_table("src").to_arrow().to_pylist()) == sorted(
            2 * (i + 100 if i in (1, 7) else i) for i in range(10))


def test_no_failed_rows_warns_with_the_count_and_the_first_error(tmp_path):
    db = _table(tmp_path, inverse)
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        result = _materialize(defs, instance, db, [Y])
        got = {e.check_name: e for e in result.get_asset_check_evaluations()}
        failed = got["no_failed_rows"]
        assert not failed.passed and failed.severity == dg.AssetCheckSeverity.WARN
        md = _md(failed)
        assert md["rows_failed"] == 1 and md["sample_row_ids"] == _row_ids(db, "id = 4")
        assert md["first_error"] == "ValueError: cannot invert x=4"
        assert "1 of 10 rows of y failed and have no value" in (failed.description or "")
        # the failed row is the one stale row: values_current says so
        current = _md(got["values_current"])
        assert not got["values_current"].passed
        assert (current["rows_stale"], current["rows_failed"], current["rows_current"]) == (1, 1, 9)
        assert "see the no_failed_rows check" in (got["values_current"].description or "")
        # the same counts as the engine's column_status and error records
        (status,) = db.open_table("src").column_status()
        assert (status["stale"], status["failed"]) == (1, 1)
        assert len(db.open_table("src").get_errors(column_name="y")) == 1


def test_a_sql_column_has_values_current_only(tmp_path):
    db = _table(tmp_path)
    db.open_table("src").add_columns({"z": "x + 1"})
    graph = _defs(db).get_repository_def().asset_graph
    assert {k.name for k in graph.asset_check_keys if k.asset_key == K(["src", "z"])} == {"values_current"}


def _lineage(defs, key) -> dict[str, set[tuple[str, str]]]:
    lineage = defs.get_repository_def().asset_graph.get(key).metadata["dagster/column_lineage"]
    if not isinstance(lineage, dg.TableColumnLineage):
        lineage = lineage.column_lineage
    return {col: {(d.asset_key.to_user_string(), d.column_name) for d in deps}
            for col, deps in lineage.deps_by_column.items()}


def _schema(defs, key) -> dict[str, tuple[str, str | None]]:
    schema = defs.get_repository_def().asset_graph.get(key).metadata["dagster/column_schema"]
    if not isinstance(schema, dg.TableSchema):
        schema = schema.schema
    return {c.name: (c.type, c.description) for c in schema.columns}


@mv.udf
def add(x: int, w: int) -> int:
    return x + w


@mv.udf
def negate(y: int) -> int:
    return -y


def test_a_computed_columns_asset_carries_its_column_lineage_and_schema(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i, "w": 10 * i, "note": "n"} for i in range(4)], primary_key="id")
    src.add_columns({"y": add, "z": "x * 2 + w", "s": (double, ["w"])})
    src.add_columns({"neg": (negate, ["y"])})  # reads another computed column
    defs = _defs(db)
    # a UDF column <- its UDF's input columns, a SQL column <- the columns its SQL names
    assert _lineage(defs, K(["src", "y"])) == {"y": {("src", "x"), ("src", "w")}}
    assert _lineage(defs, K(["src", "z"])) == {"z": {("src", "x"), ("src", "w")}}
    assert _lineage(defs, K(["src", "s"])) == {"s": {("src", "w")}}  # the input mapped to another column
    # a computed input comes from that column's asset, which the column depends on
    assert _lineage(defs, K(["src", "neg"])) == {"neg": {("src/y", "y")}}
    graph = defs.get_repository_def().asset_graph
    assert graph.get(K(["src", "neg"])).parent_keys == {K(["src"]), K(["src", "y"])}
    assert graph.get(K(["src", "y"])).parent_keys == {K(["src"])}
    # the column's schema: its type and what computes it (UDF, inputs, code fingerprint)
    assert _schema(defs, K(["src", "y"])) == {
        "y": ("int64", f"Computed column: UDF `add`(x, w) -> int64; code fingerprint {add.fingerprint}.")}
    assert _schema(defs, K(["src", "z"])) == {"z": ("int64", "Computed column: SQL: `x * 2 + w`.")}
    with dg.instance_for_test() as instance:  # the lineage runs in order: neg after y
        _materialize(defs, instance, db, [K(["src", c]) for c in ("y", "z", "s", "neg")])
    rows = sorted(db.open_table("src").to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["neg"] for r in rows] == [-11 * i for i in range(4)]


def test_check_columns_refuses_a_query_views_columns(tmp_path):
    db = _table(tmp_path)
    view = db.create_materialized_view("v", db.open_table("src").search(None).select({"id": "id", "d": double}))
    with pytest.raises(ValueError, match=r"'v' is a view whose columns follow its source rows: use check\(\)"):
        view.check_columns()
    assert set(db.open_table("src").check_columns()) == {"y"}


def test_columns_added_to_a_chunk_view_are_checked_in_the_runs_that_fill_them(tmp_path):
    import os

    from test_chunk_views import docs_rows, make_embed, make_split

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    logs = [str(tmp_path / n) for n in ("split", "embed")]
    for d in logs:
        os.makedirs(d)
    docs = db.create_table("docs", docs_rows(range(8)), primary_key="id")
    chunks = db.create_udtf_view("chunks", docs.search(None).select(["id"]), make_split(logs[0]))
    chunks.add_columns({"emb": make_embed(logs[1])})
    defs = _defs(db)
    emb = K(["chunks", "emb"])
    graph = defs.get_repository_def().asset_graph
    assert {k.name for k in graph.asset_check_keys if k.asset_key == emb} == {"values_current", "no_failed_rows"}
    assert _lineage(defs, emb) == {"emb": {("chunks", "text")}}  # over the chunk view's own columns
    assert _schema(defs, emb)["emb"][1].startswith("Computed from the view's rows: UDF `embed`(text) -> int64; ")
    with dg.instance_for_test() as instance:
        sensor = defs.get_repository_def().get_sensor_def("docs_changes")
        tick = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        (run,) = run_requested(defs, instance, tick)
        got = {e.check_name: e for e in run.get_asset_check_evaluations() if e.asset_key == emb}
        assert set(got) == {"values_current", "no_failed_rows"} and all(e.passed for e in got.values())
        assert _md(got["values_current"])["rows"] == db.open_view("chunks").count_rows() > 0


def test_rows_computed_by_older_code_are_counted_as_such(tmp_path):
    db = _table(tmp_path)
    src = db.open_table("src")
    src.backfill("y")
    src.alter_columns({"path": "y", "udf": mv.udf(lambda x: 3 * x, data_type=double.data_type, name="triple",
                                                  input_columns=["x"])})
    (current, failed) = src.check_columns()["y"]
    assert (current.name, failed.name) == ("values_current", "no_failed_rows")
    assert not current.passed and failed.passed
    assert {k: current.metadata[k] for k in ("rows_stale", "rows_older_code", "rows_never_computed")} == {
        "rows_stale": 10, "rows_older_code": 10, "rows_never_computed": 0}
    assert current.metadata["code_fingerprint"] == src.computed_columns()[0].fingerprint


def test_rows_the_udf_skipped_are_not_computed_again_by_every_run(tmp_path):
    """A column whose UDF (on_error="skip") failed on a row: materializing it
    again computes nothing, commits nothing and records no new error (each
    run called the UDF on the row again, committed a version and added an
    error record); the no_failed_rows check still warns, and retry_errors
    still retries the row."""
    db = _table(tmp_path, inverse)
    defs = _defs(db)
    src = db.open_table("src")
    with dg.instance_for_test() as instance:
        _materialize(defs, instance, db, [Y])
        after_first = (src.version, len(src.get_errors(column_name="y")))
        for _ in range(2):
            result = _materialize(defs, instance, db, [Y])
            assert (src.version, len(src.get_errors(column_name="y"))) == after_first
            got = {e.check_name: e for e in result.get_asset_check_evaluations()}
            assert not got["no_failed_rows"].passed and _md(got["no_failed_rows"])["rows_failed"] == 1
    assert after_first[1] == 1
    retried = src.retry_errors("y")
    assert retried.rows_failed == 1 and len(src.get_errors(column_name="y")) == 2  # (it was called again)
