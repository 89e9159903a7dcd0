"""The UI flows through Dagster's own testing APIs (inline runner, no JVM):
what a click on Materialize, a checks tab or a launch dialog runs."""

import dagster as dg
import lance
import pytest
from dagster_helpers import evaluate_sensor, small_catalog
from oracle import actual_view, expected_view

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.demo import seed

K = dg.AssetKey


_catalog = small_catalog


def _defs(db):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))


def _job(defs):
    return defs.resolve_implicit_global_asset_job_def()


def _frags(db, name="src"):
    return [str(f.fragment_id) for f in lance.dataset(db.table_uri(name)).get_fragments()]


def test_checks_tab_execute_all_runs_the_checks_on_their_own(tmp_path):
    """The checks tab launches a run of the checks only, without a partition."""
    db = _catalog(tmp_path / "cat")
    db.refresh(["v", "w"])
    defs = _defs(db)
    checks = [dg.AssetCheckKey(K(["v"]), n) for n in ("matches_source_query", "no_orphan_rows", "udf_values_present")]
    assets = [defs.get_repository_def().assets_defs_by_key[K(["v"])]]
    with dg.instance_for_test() as instance:
        result = dg.materialize(assets, instance=instance, selection=dg.AssetSelection.checks(*checks))
        assert result.success
        evaluations = result.get_asset_check_evaluations()
        assert {e.check_name for e in evaluations} == {c.name for c in checks}
        assert all(e.passed for e in evaluations)
        assert not result.get_asset_materialization_events()  # nothing was refreshed


def test_partition_run_records_each_partition_with_its_own_numbers(tmp_path):
    db = _catalog(tmp_path / "cat")
    defs = _defs(db)
    frags = _frags(db)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        result = _job(defs).execute_in_process(
            instance=instance, asset_selection=[K(["v"]), K(["v", "y"])],
            tags={"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]},
        )
        assert result.success
        mats = {}
        for event in result.get_asset_materialization_events():
            m = event.event_specific_data.materialization
            if m.asset_key == K(["v"]):
                mats[m.partition] = m.metadata
        # fragment 0 holds ids 0-5 (one filtered out), fragment 1 ids 6-9
        assert {p: md["dagster/row_count"].value for p, md in mats.items()} == {frags[0]: 5, frags[1]: 4}
        assert {p: md["rows_computed"].value for p, md in mats.items()} == {frags[0]: 5, frags[1]: 4}
        assert set(instance.get_materialized_partitions(K(["v"]))) == set(frags)  # the UI shows them green
        mat = instance.get_latest_materialization_event(K(["v", "y"])).asset_materialization
        assert mat.partition in frags and mat.metadata["udf_rows_computed"].value in (4, 5)


def test_view_over_a_behind_view_brings_it_along(tmp_path):
    """Materializing the derived view while its upstream is behind never fails."""
    db = _catalog(tmp_path / "cat")
    db.refresh(["v", "w"])
    src = db.open_table("src")
    src.add([{"id": 50, "x": 50}])
    src.delete("id = 9")
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        result = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["w"])])
        assert result.success
    v, w = db.open_table("v"), db.open_table("w")
    assert v.source_version == src.version
    expect = expected_view(src.uri, src.version, lambda r: r["x"] != 3, lambda r: {"id": r["id"], "x": r["x"], "y": 2 * r["x"]})
    assert actual_view(v) == expect
    assert sorted(r["id"] for r in w.to_arrow().to_pylist()) == sorted(r["id"] for r in expect.values() if r["y"] > 4)


def test_materializing_only_a_list_typed_udf_column_of_the_demo(tmp_path):
    """`doc_features/embedding` (list<float>) and `words` alone: only that column is recomputed."""
    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    db.refresh(["doc_features"])
    before = {r["doc_id"]: r for r in db.open_table("doc_features").to_arrow().to_pylist()}
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    frags = _frags(db, "documents")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("documents"), frags)
        for column in ("words", "embedding"):
            result = _job(defs).execute_in_process(
                instance=instance, asset_selection=[K(["doc_features", column])], partition_key=frags[0]
            )
            assert result.success
            (event,) = result.get_asset_materialization_events()
            assert event.event_specific_data.materialization.asset_key == K(["doc_features", column])
    after = {r["doc_id"]: r for r in db.open_table("doc_features").to_arrow().to_pylist()}
    assert after == before  # same code, same values, every other column copied


def test_backfill_of_an_unread_column_leaves_the_source_data_version_and_views_alone(tmp_path):
    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    docs = db.open_table("documents")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sensor = defs.get_repository_def().get_sensor_def("documents_changes")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        for req in first.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        (run,) = first.run_requests  # one run carries the whole lineage
        assert sorted(k.to_user_string() for k in run.asset_selection) == [
            "doc_chunks", "doc_chunks/embedding", "doc_features", "doc_features/embedding", "doc_features/summary",
            "doc_features/words", "documents/checksum", "long_docs",
        ]
        data_version = first.asset_events[0].tags["dagster/data_version"]
        # the run: backfill, view, view over the view, in lineage order, in one process
        result = _job(defs).execute_in_process(instance=instance, asset_selection=run.asset_selection, tags=run.tags)
        assert result.success
        assert docs.plan_backfill("checksum").rows == 0  # the backfill made a new Lance version...
        for name in ("doc_features", "long_docs", "doc_chunks"):
            assert db.open_table(name).status().versions_behind == 0  # ...that no view needs
        assert db.open_view("doc_chunks").plan_backfill("embedding").rows == 0  # the passages are embedded
        later = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs, resources=defs.resources)
        assert later.run_requests == []
        assert later.asset_events[0].tags["dagster/data_version"] == data_version
        assert db.open_table("doc_features").status().versions_behind == 0


def test_demo_never_reuses_what_it_did_not_create(tmp_path):
    import socket

    from mv_assets.dagster.devserver import IMMEDIATE_RUNS_YAML, main, prepare_home
    from mv_assets.execution import connect_server

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("storage:\n  postgres: {}\n")  # somebody's configuration
    with pytest.raises(RuntimeError, match="was not written by mv_assets"):
        prepare_home(str(home))
    assert (home / "dagster.yaml").read_text() == "storage:\n  postgres: {}\n"  # untouched
    assert main(["prepare", str(home), "3999"]) == 1
    ours = tmp_path / "ours"
    prepare_home(str(ours))
    prepare_home(str(ours))  # its own file: rewritten
    assert (ours / "dagster.yaml").read_text() == IMMEDIATE_RUNS_YAML
    with socket.socket() as busy:  # a port somebody else listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["prepare", str(ours), str(port)]) == 1
        with pytest.raises(RuntimeError, match="did not start"):
            connect_server.start(port=port, state_dir=str(tmp_path / "spark"))


def test_sensor_requests_nothing_while_a_run_of_the_lineage_is_in_flight(tmp_path):
    """One run of a lineage at a time: a tick during a run (say it is waiting for
    Spark) asks for nothing, and the first tick after it sees what is left."""
    from dagster._core.storage.dagster_run import DagsterRun

    db = _catalog(tmp_path / "cat")
    defs = _defs(db)
    sensor = defs.get_repository_def().get_sensor_def("src_changes")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        (run,) = first.run_requests
        assert run.tags["mv_assets/lineage"] == "src"
        in_flight = instance.add_run(
            DagsterRun(job_name="__ASSET_JOB", run_id="a" * 36, tags=run.tags, status=dg.DagsterRunStatus.STARTED)
        )
        db.open_table("src").add([{"id": 99, "x": 99}])
        during = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs, resources=defs.resources)
        assert not during.run_requests
        instance.report_run_failed(in_flight)
        after = evaluate_sensor(sensor, instance=instance, cursor=during.cursor or first.cursor,
                                                             definitions=defs, resources=defs.resources)
        assert len(after.run_requests) == 1
