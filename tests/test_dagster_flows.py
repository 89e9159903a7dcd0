"""The UI flows through Dagster's own testing APIs (inline runner, no JVM):
what a click on Materialize, a checks tab or a launch dialog runs."""

import dagster as dg
import lance
import pyarrow as pa
import pytest
from dagster_helpers import evaluate_sensor, small_catalog
from oracle import actual_view, expected_view

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import job_name, partitions_def_name
from mv_assets.demo import seed

K = dg.AssetKey


_catalog = small_catalog


def _defs(db):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))


def _job(defs, table: str = "src"):
    """The job the table's sensor launches its runs in (``refresh_<table>``)."""
    return defs.resolve_job_def(job_name(table))


def _frags(db, name="src"):
    return [str(f.fragment_id) for f in lance.dataset(db.table_uri(name)).get_fragments()]


def test_checks_tab_execute_all_runs_the_checks_on_their_own(tmp_path):
    """The checks tab launches a run of the checks only, without a partition."""
    db = _catalog(tmp_path / "cat")
    db.refresh(["v", "w"])
    defs = _defs(db)
    checks = [dg.AssetCheckKey(K(["v"]), n)
              for n in ("matches_source_query", "no_orphan_rows", "values_match_source", "udf_values_present")]
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
        # fragment 0 holds ids 0-5 (one filtered out), fragment 1 ids 6-9; the asset's row count is the view's
        assert {p: md["partition_row_count"].value for p, md in mats.items()} == {frags[0]: 5, frags[1]: 4}
        assert {p: md["dagster/row_count"].value for p, md in mats.items()} == {frags[0]: 9, frags[1]: 9}
        assert {p: md["rows_computed"].value for p, md in mats.items()} == {frags[0]: 5, frags[1]: 4}
        assert set(instance.get_materialized_partitions(K(["v"]))) == set(frags)  # the UI shows them green
        mat = instance.get_latest_materialization_event(K(["v", "y"])).asset_materialization
        assert mat.partition == frags[-1] and mat.metadata["udf_rows_computed"].value == 4  # fragment 1's rows


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
            result = _job(defs, "documents").execute_in_process(
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
            "corpus_stats", "doc_authors", "doc_authors/byline", "doc_chunks", "doc_chunks/embedding", "doc_features",
            "doc_features/embedding", "doc_features/summary", "doc_features/words", "documents/checksum", "long_docs",
        ]
        # fragments written once, none of their rows deleted: no observation (the instance knows
        # a never-observed fragment at its data version as written; the run records it)
        assert not [e for e in first.asset_events if isinstance(e, dg.AssetObservation)]
        data_versions = {str(f): v for f, v in docs.fragment_data_versions().items()}
        assert set(data_versions) == set(_frags(db, "documents")) and not [v for v in data_versions.values() if "-" in v]
        # the run: backfill, view, view over the view, in lineage order, in one process
        result = _job(defs, "documents").execute_in_process(instance=instance, asset_selection=run.asset_selection,
                                                            tags=run.tags)
        assert result.success
        assert docs.plan_backfill("checksum").rows == 0  # the backfill made a new Lance version...
        for name in ("doc_features", "long_docs", "doc_chunks", "corpus_stats"):
            assert db.open_table(name).status().versions_behind == 0  # ...that no view needs
        (stats,) = db.open_table("corpus_stats").to_arrow().to_pylist()  # the aggregate of the UDF's output
        words = db.open_table("doc_features").to_arrow().column("words").to_pylist()
        assert stats["documents"] == len(words) and stats["max_words"] == max(words)
        p90 = sorted(words)[int(0.9 * (len(words) - 1))]
        assert abs(stats["p90_words"] - p90) <= 0.01 * p90  # approx_quantile's accuracy
        assert db.open_view("doc_chunks").plan_backfill("embedding").rows == 0  # the passages are embedded
        later = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs, resources=defs.resources)
        assert later.run_requests == []
        assert not [e for e in later.asset_events if isinstance(e, dg.AssetObservation)]  # no fragment changed
        assert {str(f): v for f, v in docs.fragment_data_versions().items()} == data_versions
        assert db.open_table("doc_features").status().versions_behind == 0


def _assert_quick_runs(home: str) -> None:
    """The demo's run coordinator: a run queue (the UI warns on every backfill
    launch with DefaultRunCoordinator), looked at every second; requested
    backfills every 2 s, not Dagster's 30 ("Materialize" on a view is a backfill)."""
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster._daemon import controller

    before = controller.DEFAULT_DAEMON_INTERVAL_SECONDS
    try:
        with dg.DagsterInstance.from_config(home) as instance:
            coordinator = instance.run_coordinator
            assert isinstance(coordinator, QueuedRunCoordinator)  # the UI's runQueuingSupported: no warning
            assert coordinator.dequeue_interval_seconds == 1
            assert "QUEUED_RUN_COORDINATOR" in instance.get_required_daemon_types()
            assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 2  # what the backfill daemon's loop waits
    finally:
        controller.DEFAULT_DAEMON_INTERVAL_SECONDS = before


def test_demo_never_reuses_what_it_did_not_create(tmp_path):
    import socket

    from mv_assets.dagster.devserver import QUICK_RUNS_YAML, SENSOR_THREADS_YAML, WARM_RUNS_YAML, main, prepare_home
    from mv_assets.dagster.storage import sqlite_storage_yaml
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
    assert (ours / "dagster.yaml").read_text() == (QUICK_RUNS_YAML + WARM_RUNS_YAML + SENSOR_THREADS_YAML
                                                   + sqlite_storage_yaml(str(ours)))
    with dg.DagsterInstance.from_config(str(ours)) as instance:  # what it says, as Dagster reads it
        assert instance.get_sensor_settings() == {"use_threads": True, "num_workers": 8}
        assert type(instance.run_launcher).__name__ == "WarmRunLauncher"
        assert type(instance.event_log_storage).__name__ == "BatchingSqliteEventLogStorage"
    _assert_quick_runs(str(ours))
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
            DagsterRun(job_name=sensor.job_name, run_id="a" * 36, tags=run.tags, status=dg.DagsterRunStatus.STARTED)
        )
        db.open_table("src").add([{"id": 99, "x": 99}])
        during = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs, resources=defs.resources)
        assert not during.run_requests
        instance.report_run_failed(in_flight)
        after = evaluate_sensor(sensor, instance=instance, cursor=during.cursor or first.cursor,
                                                             definitions=defs, resources=defs.resources)
        assert len(after.run_requests) == 1


def _latest_by_partition(instance, key) -> dict:
    """Each partition's latest materialization metadata (values)."""
    out = {}
    for record in instance.fetch_materializations(key, limit=1000).records:  # newest first
        m = record.asset_materialization
        if m.partition not in out:
            out[m.partition] = {k: v.value for k, v in m.metadata.items()}
    return out


ROW_COUNT_QUERY = """query($k: AssetKeyInput!) { assetNodes(assetKeys: [$k]) {
  assetMaterializations(limit: 1) { partition metadataEntries { label ... on IntMetadataEntry { intValue } } } } }"""


def test_the_asset_page_row_count_is_the_whole_views_and_each_partition_has_its_own(tmp_path):
    """The asset page's "Row count" is dagster/row_count of the asset's latest
    materialization (any partition): it is the whole view's, after the first
    runs and after an append refreshed one partition; each partition records
    its own rows as partition_row_count."""
    from dagster_helpers import run_requested, ui_graphql

    db = _catalog(tmp_path / "cat")
    defs = _defs(db)
    sensor = defs.get_repository_def().get_sensor_def("src_changes")
    with dg.instance_for_test() as instance, ui_graphql(instance, tmp_path, db.uri) as query:
        cursor = None
        for change in (None, lambda: db.open_table("src").add([{"id": 50 + i, "x": 50 + i} for i in range(3)])):
            if change:
                change()
            result = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs,
                                     resources=defs.resources)
            cursor = result.cursor
            run_requested(defs, instance, result)
            view = db.open_table("v")
            (latest,) = query(ROW_COUNT_QUERY, k={"path": ["v"]})["assetNodes"][0]["assetMaterializations"]
            shown = {e["label"]: e.get("intValue") for e in latest["metadataEntries"]}
            assert shown["dagster/row_count"] == view.count_rows()  # 9, then 12: not one partition's count
            partitions = _latest_by_partition(instance, K(["v"]))
            src = db.open_table("src")
            own = db.open_view("v").rows_by_fragment(src.version, [int(p) for p in partitions])
            assert {p: md["partition_row_count"] for p, md in partitions.items()} == {str(f): n for f, n in own.items()}
            assert sum(own.values()) == view.count_rows()
        assert view.count_rows() == 12 and len(partitions) == 3


def test_a_view_refreshed_as_a_whole_records_run_totals_not_per_partition_numbers(tmp_path):
    """w (a view over v) is refreshed as a whole: its rows are not counted per
    source fragment, so its partitions record the run's totals, labelled so,
    and the view's size; never another view's fragment numbers as theirs."""
    db = _catalog(tmp_path / "cat")
    defs = _defs(db)
    frags = _frags(db)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        result = _job(defs).execute_in_process(
            instance=instance, asset_selection=[K(["v"]), K(["v", "y"]), K(["w"])],
            tags={"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]},
        )
        assert result.success
        w = _latest_by_partition(instance, K(["w"]))
        rows = db.open_table("w").count_rows()
        assert set(w) == set(frags)
        for md in w.values():
            assert "rows_computed" not in md and "partition_row_count" not in md
            assert md["run_rows_computed"] == rows == md["dagster/row_count"]
        v = _latest_by_partition(instance, K(["v"]))
        assert sum(md["rows_computed"] for md in v.values()) == v[frags[0]]["run_rows_computed"] == 9


def _declared(tmp_path):
    from test_declared import _write

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    calls = tmp_path / "calls"
    calls.mkdir()
    module = tmp_path / "my_views.py"
    _write(module, str(calls))
    return db, module, str(calls)


def _loaded(db, module):
    """The definitions of the views in ``module`` as loading them (or "Reload
    definitions") makes them, and the source's sensor."""
    from test_declared import _defs as declared_defs

    defs = declared_defs(db, str(module))
    return defs, defs.get_repository_def().get_sensor_def("src_changes")


def test_a_code_change_recompute_records_each_partitions_own_rows_and_reads_right(tmp_path):
    """Edit the UDF, reload, "Materialize" the column over every partition:
    each partition records the rows of its own fragment the run recomputed
    (before: 0 everywhere, the total only as a run number), the scope says it
    was a recompute, and descriptions, checks and the run log read right."""
    from dagster_helpers import run_log, run_requested, ui_graphql
    from test_declared import _all_partitions, _write

    db, module, calls = _declared(tmp_path)
    defs, sensor = _loaded(db, module)
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        (run,) = run_requested(defs, instance, first)
        log = run_log(instance, run)
        assert "v: applied the code: created the view from its code" in log
        first_line = next(line for line in log if line.startswith("v: first"))
        assert "first refresh, at source v2: rows +10 ~0 -0, UDF rows computed: score 10, other 10" in first_line
        assert "1 task on inline" in first_line and "None" not in first_line
        # the user edits the UDF and clicks "Reload definitions"
        _write(module, calls, body="x * 10 + 7")
        defs, sensor = _loaded(db, module)
        graph = defs.get_repository_def().asset_graph
        for key in (K(["v"]), K(["v", "score"])):  # true after the recompute too: no state as of the load
            assert "differed" not in graph.get(key).description and "changed for" not in graph.get(key).description
        tags = _all_partitions(db, instance)
        recompute = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v", "score"])], tags=tags)
        assert recompute.success
        parts = _latest_by_partition(instance, K(["v", "score"]))
        own = db.open_view("v").rows_by_fragment(db.open_table("src").version, [int(p) for p in parts])
        assert {p: md["udf_rows_computed"] for p, md in parts.items()} == {str(f): n for f, n in own.items()}
        assert sorted(own.values()) == [4, 6]
        for md in parts.values():
            assert md["scope"] == "rows computed by other code (the UDF code changed)"
            assert md["run_udf_rows_recomputed"] == 10 == md["run_udf_rows_computed"]
        assert any(line.startswith("v: recomputed score (UDF code changed): 10 rows computed by other code")
                   for line in run_log(instance, recompute))
        # the sensor's next tick reports the check against the column's latest
        # materialization, so the UI counts it as passed
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        (evaluation,) = [e for e in tick.asset_events if isinstance(e, dg.AssetCheckEvaluation)
                         and e.asset_key == K(["v", "score"])]
        latest = instance.fetch_materializations(K(["v", "score"]), limit=1).records[0]
        assert evaluation.passed and evaluation.target_materialization_data is not None
        assert evaluation.target_materialization_data.storage_id == latest.storage_id
        run_requested(defs, instance, tick)
        # nothing to do: said so, not "0 tasks ... on none" (the first run may take the view to a source
        # version that changed nothing it reads: said so too)
        for _ in range(2):
            again = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v"])], tags=tags)
            lines = [line for line in run_log(instance, again) if line.startswith("v: ")]
            assert all("on none" not in line and "None" not in line for line in lines)
        assert lines == [f"v: nothing to refresh: it reflects source v{db.open_table('src').version} already"]
        with ui_graphql(instance, tmp_path, db.uri, str(module)) as query:
            nodes = query("""{ assetNodes(assetKeys: [{path: ["v"]}, {path: ["v", "score"]}]) { assetKey { path }
                assetChecksOrError { ... on AssetChecks { checks { name description
                executionForLatestMaterialization { status } } } } } }""")["assetNodes"]
        checks = {(tuple(n["assetKey"]["path"]), c["name"]): c for n in nodes
                  for c in n["assetChecksOrError"]["checks"]}
        assert set(checks) == {(("v",), "matches_source_query"), (("v",), "no_orphan_rows"),
                               (("v",), "values_match_source"), (("v",), "udf_values_present"),
                               (("v", "score"), "udf_code_current")}
        assert all(c["description"] for c in checks.values())  # never "No description provided"
        assert {k: c["executionForLatestMaterialization"]["status"] for k, c in checks.items()} == {
            k: "SUCCEEDED" for k in checks}


def test_a_code_change_shows_on_the_asset_and_its_lineage_node_not_in_the_catalog_list(tmp_path):
    """docs/dagster.md, 'The workflow' step 2, read through the UI's GraphQL:
    after an edit of the UDF and "Reload definitions", the sensor's next tick
    fails the column's udf_code_current check with severity ERROR against its
    latest materialization (what the asset page's "Latest check results" and
    the lineage node read; a failed WARN check would leave the node's footer
    green), each partition is stale with "has a new code version" (the
    Partitions tab), and the partition counts, all the Catalog list shows of a
    partitioned asset, stay as they were: every partition materialized, none
    failed."""
    from dagster_helpers import run_requested, ui_graphql
    from test_declared import _write

    db, module, calls = _declared(tmp_path)
    defs, sensor = _loaded(db, module)
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        _write(module, calls, body="x * 10 + 7")  # the user edits the UDF, clicks "Reload definitions"
        defs, sensor = _loaded(db, module)
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        assert not run_requested(defs, instance, tick)  # nothing runs by itself: the user materializes
        parts = sorted(_latest_by_partition(instance, K(["v", "score"])))
        with ui_graphql(instance, tmp_path, db.uri, str(module)) as query:
            (node,) = query("""query($p: String) { assetNodes(assetKeys: [{path: ["v", "score"]}]) {
                assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization {
                status evaluation { severity description } } } } }
                partitionStats { numPartitions numMaterialized numFailed numMaterializing }
                staleStatus(partition: $p) staleCauses(partition: $p) { reason } } }""", p=parts[0])["assetNodes"]
        (check,) = node["assetChecksOrError"]["checks"]
        execution = check["executionForLatestMaterialization"]
        assert check["name"] == "udf_code_current" and execution["status"] == "FAILED"
        assert execution["evaluation"]["severity"] == "ERROR"
        assert "the UDF code changed" in execution["evaluation"]["description"]
        assert node["partitionStats"] == {"numPartitions": 2, "numMaterialized": 2, "numFailed": 0,
                                          "numMaterializing": 0}
        assert node["staleStatus"] == "STALE" and [c["reason"] for c in node["staleCauses"]] == [
            "has a new code version"]


def test_a_code_change_applied_by_a_sensors_run_of_an_append_records_every_partition_it_recomputed(tmp_path):
    """Edit the UDF, reload, and let the source take an append before anyone
    materializes: the sensor's run of the new fragment applies the code and
    recomputes the column's rows everywhere, so every partition, not only the
    run's, is recorded with the current code version and reads FRESH (before:
    the others stayed "has a new code version" for good, their rows current)."""
    from dagster_helpers import run_log, run_requested, ui_graphql
    from test_declared import _write

    db, module, calls = _declared(tmp_path)
    defs, sensor = _loaded(db, module)
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        before = _latest_by_partition(instance, K(["v", "score"]))
        _write(module, calls, body="x * 10 + 7")  # the user edits the UDF, clicks "Reload definitions"
        defs, sensor = _loaded(db, module)
        db.open_table("src").add([{"id": 100, "x": 100}])
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        (run,) = run_requested(defs, instance, tick)
        assert run.success
        new = sorted(set(_frags(db)) - set(before), key=int)
        assert new and run.dagster_run.tags.get("dagster/partition") in (None, *new)
        old = sorted(before, key=int)
        assert (f"v: score recomputed in {len(old)} partition(s) outside the run ({', '.join(old)}): recorded "
                "with its current code") in "\n".join(run_log(instance, run))
        view = db.open_view("v")
        assert view.to_arrow().sort_by("id").column("score").to_pylist() == [10 * x + 7 for x in [*range(10), 100]]
        parts = _latest_by_partition(instance, K(["v", "score"]))
        assert sorted(parts, key=int) == old + new
        own = view.rows_by_fragment(db.open_table("src").version, [int(p) for p in old])
        assert {p: parts[p]["udf_rows_computed"] for p in old} == {str(f): n for f, n in own.items()}
        assert all(parts[p]["scope"].endswith("rows computed by other code (the UDF code changed)") for p in old)
        with ui_graphql(instance, tmp_path, db.uri, str(module)) as query:
            for p in old + new:
                (node,) = query("""query($p: String) { assetNodes(assetKeys: [{path: ["v", "score"]}]) {
                    staleStatus(partition: $p) staleCauses(partition: $p) { reason } } }""", p=p)["assetNodes"]
                assert node == {"staleStatus": "FRESH", "staleCauses": []}, (p, node)


def test_a_new_udf_column_declared_in_code_is_said_to_be_new_not_changed(tmp_path):
    """A UDF column added to a view's code, reloaded: its check says no row
    is computed yet, and the run that fills it says it computes a new
    column's rows never computed (before: "the UDF code changed", "rows
    computed by other code", which no code had computed)."""
    from dagster_helpers import run_log, run_requested
    from test_declared import _all_partitions

    db, module, calls = _declared(tmp_path)
    defs, sensor = _loaded(db, module)
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        text = module.read_text()
        module.write_text(text.replace('"other": other}', '"other": other, "third": third}').replace(
            "def views(db):", "@mv.udf\ndef third(x: int) -> int:\n    return x + 3\n\n\ndef views(db):"))
        defs, sensor = _loaded(db, module)
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        (check,) = [e for e in tick.asset_events if isinstance(e, dg.AssetCheckEvaluation)
                    and e.asset_key == K(["v", "third"])]
        assert not check.passed
        assert check.description.startswith("a new UDF column (") and "none of the 10 rows is computed yet" in (
            check.description)
        run = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v", "third"])],
                                            tags=_all_partitions(db, instance))
        assert run.success
        lines = [line for line in run_log(instance, run) if line.startswith("v: ")]
        assert "v: computing third (a new UDF column): 10 rows never computed" in lines
        assert "v: computed third (a new UDF column): 10 rows never computed written (10 computed, 0 failed)" in lines
        assert not any("code changed" in line or "other code" in line for line in lines)
        parts = _latest_by_partition(instance, K(["v", "third"]))
        assert {md["scope"] for md in parts.values()} == {"rows never computed (a new UDF column)"}
        assert sum(md["udf_rows_computed"] for md in parts.values()) == 10
        assert db.open_view("v").to_arrow().sort_by("id").column("third").to_pylist() == [x + 3 for x in range(10)]


def test_a_new_udf_column_filled_by_a_sensors_run_of_an_append_is_recorded_in_every_partition(tmp_path):
    """Add a UDF column in code, reload, and let the source take an append
    before anyone materializes it: the sensor's run of the new fragment
    computes the column's rows everywhere, so every partition of the column
    is recorded materialized and reads FRESH (before: only the run's
    partition; the others showed "Missing" in the UI, their rows computed)."""
    from dagster_helpers import run_log, run_requested, ui_graphql

    db, module, calls = _declared(tmp_path)
    defs, sensor = _loaded(db, module)
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        old = sorted(_latest_by_partition(instance, K(["v", "score"])), key=int)
        text = module.read_text()
        module.write_text(text.replace('"other": other}', '"other": other, "third": third}').replace(
            "def views(db):", "@mv.udf\ndef third(x: int) -> int:\n    return x + 3\n\n\ndef views(db):"))
        defs, sensor = _loaded(db, module)
        db.open_table("src").add([{"id": 100, "x": 100}])
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        (run,) = run_requested(defs, instance, tick)
        assert run.success
        new = sorted(set(_frags(db)) - set(old), key=int)
        view = db.open_view("v")
        assert view.to_arrow().sort_by("id").column("third").to_pylist() == [x + 3 for x in [*range(10), 100]]
        assert (f"v: third computed in {len(old)} partition(s) outside the run ({', '.join(old)}): recorded "
                "with its current code") in "\n".join(run_log(instance, run))
        parts = _latest_by_partition(instance, K(["v", "third"]))
        assert sorted(parts, key=int) == old + new
        own = view.rows_by_fragment(db.open_table("src").version, [int(p) for p in old])
        assert {p: parts[p]["udf_rows_computed"] for p in old} == {str(f): n for f, n in own.items()}
        assert all(parts[p]["scope"].endswith("rows never computed (a new UDF column)") for p in old)
        with ui_graphql(instance, tmp_path, db.uri, str(module)) as query:
            for p in old + new:
                (node,) = query("""query($p: String) { assetNodes(assetKeys: [{path: ["v", "third"]}]) {
                    staleStatus(partition: $p) staleCauses(partition: $p) { reason } } }""", p=p)["assetNodes"]
                assert node == {"staleStatus": "FRESH", "staleCauses": []}, (p, node)


def test_a_table_columns_backfill_records_each_partitions_own_rows(tmp_path):
    """A computed column of a table, backfilled in a run over every partition:
    each partition records the rows of its own fragment; the backfill's totals
    are labelled as the run's."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    src.add_columns({"y": mv.udf(lambda x: 2 * x, data_type=pa.int64(), name="twice", input_columns=["x"])})
    defs = _defs(db)
    frags = _frags(db)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        result = _job(defs).execute_in_process(
            instance=instance, asset_selection=[K(["src", "y"])],
            tags={"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]},
        )
        assert result.success
        parts = _latest_by_partition(instance, K(["src", "y"]))
        assert {p: md["rows_computed"] for p, md in parts.items()} == {frags[0]: 6, frags[1]: 4}
        assert all(md["run_rows_written"] == 10 and "rows_written" not in md for md in parts.values())


def test_a_chunk_views_column_backfill_files_its_rows_under_source_fragment_partitions(tmp_path):
    """`doc_chunks/embedding` is partitioned by the documents' fragments (a
    passage's parent's fragment): each partition records the passages of its
    own documents it embedded (before: filed under the chunk view's own
    fragment ids, so the partitions read the wrong numbers). Then only new
    documents' passages are embedded: the partitions they are in record them,
    the others 0."""
    from dagster_helpers import run_requested

    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    defs = _defs(db)
    sensor = defs.get_repository_def().get_sensor_def("documents_changes")
    chunks = db.open_view("doc_chunks")
    key = K(["doc_chunks", "embedding"])
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        frags = [int(f) for f in _frags(db, "documents")]
        own = chunks.rows_by_fragment(chunks.source_version, frags)  # every passage was embedded in this run
        assert sorted(own) == frags and all(n > 0 for n in own.values()) and len(set(own.values())) > 1
        parts = _latest_by_partition(instance, key)
        assert {p: md["rows_computed"] for p, md in parts.items()} == {str(f): n for f, n in own.items()}
        docs = db.open_table("documents")
        from mv_assets.demo import _documents

        docs.add(_documents(5000, 40))  # a new fragment of documents, so of passages
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, tick))
        new = sorted(set(int(f) for f in _frags(db, "documents")) - set(frags))
        (added,) = new
        want = chunks.rows_by_fragment(chunks.source_version, [added])[added]
        parts = _latest_by_partition(instance, key)
        assert want > 0 and parts[str(added)]["rows_computed"] == want
        assert parts[str(added)]["run_udf_rows_computed"] == want  # the run embedded those passages only


@mv.udf
def slow_next(x: int) -> int:
    import os
    import time

    time.sleep(0.002)
    if x >= 150 and os.path.exists(os.environ["MV_ASSETS_TEST_FAIL_FLAG"]):
        raise RuntimeError("the model server is down")
    return x + 1


@mv.udf
def slow_next_v2(x: int) -> int:  # new code for the same column
    import os
    import time

    time.sleep(0.002)
    if x >= 150 and os.path.exists(os.environ["MV_ASSETS_TEST_FAIL_FLAG"]):
        raise RuntimeError("the model server is down")
    return 1 + x


def test_long_runs_log_their_progress_and_a_resumed_recompute_says_what_came_from_checkpoints(
        tmp_path, monkeypatch):
    """A run that computes for a while logs its progress (rows done of planned,
    rate, time left) every $MV_ASSETS_PROGRESS_SECONDS, not only its outcome
    at the end; a recompute that failed part way and runs again says how many
    rows came from the checkpoints the failed run left."""
    from dagster_helpers import run_log

    monkeypatch.setenv("MV_ASSETS_PROGRESS_SECONDS", "0.05")
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.02")
    flag = tmp_path / "fail"
    monkeypatch.setenv("MV_ASSETS_TEST_FAIL_FLAG", str(flag))
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(200)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": slow_next}))
    defs = _defs(db)
    frags = _frags(db)
    tags = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        first = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v"]), K(["v", "y"])],
                                              tags=tags)
        assert first.success
        log = run_log(instance, first)
        running = [line for line in log if line.startswith("v: refresh: computing: ") and "left" in line]
        assert len(running) >= 3 and all(" of 200 rows (" in line and "rows/s" in line for line in running)
        assert any(line.startswith("v: refresh: computing: 200 of 200 rows (100%)") and line.endswith("done")
                   for line in log)
        # the UDF's code changes (from Python), and its recompute fails part way
        view.alter_columns({"path": "y", "udf": slow_next_v2})
        flag.write_text("down")
        failed = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v", "y"])], tags=tags,
                                               raise_on_error=False)
        assert not failed.success
        flag.unlink()
        again = _job(defs).execute_in_process(instance=instance, asset_selection=[K(["v", "y"])], tags=tags)
        assert again.success
        log = run_log(instance, again)
        (start,) = [line for line in log if line.startswith("v: recomputing y (UDF code changed): 200 rows")]
        resumed = int(start.split("; ")[1].split(" of them")[0].replace(",", ""))
        assert 0 < resumed < 200 and start.endswith("have results checkpointed by an interrupted run")
        (outcome,) = [line for line in log if line.startswith("v: recomputed y (UDF code changed)")]
        assert f"{200 - resumed:,} computed, {resumed:,} from checkpoints" in outcome
    assert view.plan_backfill("y").rows == 0
