"""The Dagster layer with Dagster's own testing tools and a real instance."""

import os
import subprocess
import sys
from typing import Any

import dagster as dg
import lance
import pyarrow as pa
import pytest
from dagster._core.definitions.observe import observe  # not exported by dagster
from dagster_helpers import (
    apply_partition_requests,
    call_sensor,
    double,
    evaluate_schedule,
    evaluate_sensor,
    execute_runs,
    small_catalog,
)
from oracle import actual_view, count_calls, expected_view, record_call

import mv_assets as mv
from mv_assets.dagster import TAG_SCOPE, TAG_SOURCE_VERSION, MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_catalog = small_catalog
_apply = apply_partition_requests


def _sensor(defs, name):
    return defs.get_repository_def().get_sensor_def(name)


def test_definitions_load_without_a_jvm(tmp_path):
    _catalog(tmp_path / "cat")
    code = (
        "import sys; from mv_assets.dagster import build_definitions; "
        f"d = build_definitions({str(tmp_path / 'cat')!r}); d.get_repository_def().asset_graph; "
        "print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_top_level_definitions_module_loads(tmp_path):
    _catalog(tmp_path / "cat")
    env = {**os.environ, "MV_ASSETS_DB": str(tmp_path / "cat")}
    code = "import definitions; print(len(list(definitions.defs.get_repository_def().asset_graph.get_all_asset_keys())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stdout.strip() == "4"  # src, v, v/y, w


def test_top_level_definitions_module_writes_nothing(tmp_path):
    missing = tmp_path / "nowhere"
    env = {**os.environ, "MV_ASSETS_DB": str(missing)}
    out = subprocess.run([sys.executable, "-c", "import definitions"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode != 0 and f"no mv_assets catalog at {missing}: check MV_ASSETS_DB" in out.stderr
    assert not missing.exists()


K = dg.AssetKey


def test_asset_graph_and_lineage(tmp_path):
    db = _catalog(tmp_path / "cat")
    defs = build_definitions(db)
    graph = defs.get_repository_def().asset_graph
    assert set(graph.get_all_asset_keys()) == {K(["src"]), K(["v"]), K(["v", "y"]), K(["w"])}
    # source -> view -> column -> derived view
    assert graph.get(K(["v"])).parent_keys == {K(["src"])}
    assert graph.get(K(["v", "y"])).parent_keys == {K(["v"])}
    assert graph.get(K(["w"])).parent_keys == {K(["v"]), K(["v", "y"])}
    # everything downstream of src is partitioned by src's fragments (one run can carry the lineage)
    for key in (["v"], ["v", "y"], ["w"]):
        assert graph.get(K(key)).partitions_def.name == partitions_def_name("src")
    # UDF fingerprint is the column's code version; descriptions and groups for the UI
    assert graph.get(K(["v", "y"])).code_version == double.fingerprint
    assert "Materialized view over src" in graph.get(K(["v"])).description
    # plain text: the Catalog list shows descriptions as they are (no markdown)
    assert not [k for k in graph.get_all_asset_keys() if "`" in (graph.get(k).description or "")]
    assert graph.get(K(["v"])).group_name == "v"
    assert graph.get(K(["src"])).is_observable
    assert {s.name for s in defs.sensors} == {"src_changes"}  # one sensor per base table, views over views included
    meta = graph.get(K(["v"])).metadata
    assert meta["dagster/table_name"] == "v" and meta["dagster/uri"].endswith("v.lance")
    assert [c.name for c in meta["dagster/column_schema"].columns] == ["id", "x", "y"]
    refs = graph.get(K(["v", "y"])).metadata["dagster/code_references"].code_references
    assert refs[0].file_path == os.path.abspath(double.func.__code__.co_filename)
    assert refs[0].line_number == double.func.__code__.co_firstlineno


def _runs(result, key):
    """The run requests of a sensor result that materialize asset ``key``."""
    if isinstance(result, dg.SkipReason):
        return []
    return [r for r in result.run_requests if dg.AssetKey(key) in r.asset_selection]


def _due(result) -> set[str]:
    """The views a sensor result's runs refresh because they are due (their run
    keys name them: ``<table>@<version>:<view>#<load>,...``), not those a run
    only records (``;recorded:``: refreshed outside the runs that named them)."""
    if isinstance(result, dg.SkipReason):
        return set()
    return {part.split("#")[0] for r in result.run_requests
            for part in r.run_key.split(":", 1)[1].split(";")[0].split("~")[0].split(",") if "#" in part}


def test_sensor_over_append_delete_update_compaction(tmp_path):
    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sensor = _sensor(defs, "src_changes")
    pname = partitions_def_name("src")
    with dg.instance_for_test() as instance:
        def tick(cursor):
            result = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
            if isinstance(result, dg.SkipReason):
                return result, cursor
            _apply(instance, result)
            return result, result.cursor

        def frags():
            return sorted(f.fragment_id for f in lance.dataset(src.uri).get_fragments())

        def run_all(result):  # the requested runs, as the daemon runs them
            execute_runs(defs, instance, result)

        # first tick: every fragment becomes a partition; one run carries v and the view over it
        r, cursor = tick(None)
        assert sorted(instance.get_dynamic_partitions(pname)) == [str(f) for f in frags()]
        (run,) = r.run_requests
        assert set(run.asset_selection) == {K(["v"]), K(["v", "y"]), K(["w"])}
        assert run.tags[TAG_SOURCE_VERSION] == str(src.version) and run.tags[TAG_SCOPE] == "changes"
        assert run.tags["dagster/asset_partition_range_start"] == "0"
        assert run.tags["dagster/asset_partition_range_end"] == str(frags()[-1])
        # the same state again (the run not done yet): an idle tick, nothing read but versions
        again, _ = tick(cursor)
        assert isinstance(again, dg.SkipReason) and "no view below it changed" in again.skip_message
        run_all(r)
        r, cursor = tick(cursor)  # the views moved: a full look, nothing new, nothing due
        assert not r.run_requests and "no view is due" in r.skip_reason.skip_message
        again, _ = tick(cursor)
        assert isinstance(again, dg.SkipReason)  # and idle from then on
        # append: one new fragment, one run per affected view
        src.add([{"id": 100, "x": 100}])
        r, cursor = tick(cursor)
        new = str(frags()[-1])
        assert new in instance.get_dynamic_partitions(pname)
        (run,) = _runs(r, ["v"])
        assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (new, new)
        assert len(r.run_requests) == 1 and K(["w"]) in run.asset_selection
        run_all(r)
        # delete in the first fragment: that partition is refreshed
        src.delete("id = 1")
        r, cursor = tick(cursor)
        (run,) = _runs(r, ["v"])
        assert run.tags["dagster/asset_partition_range_start"] == "0"
        run_all(r)
        # a delete that empties a whole fragment: the partition is retired AND the views refreshed
        src.delete("id = 100")
        r, cursor = tick(cursor)
        assert new not in instance.get_dynamic_partitions(pname)
        assert len(_runs(r, ["v"])) == 1 and len(_runs(r, ["w"])) == 1
        run_all(r)
        assert 100 not in db.open_table("v").to_arrow().column("id").to_pylist()
        # update: the row moves to a new fragment
        src.update("id = 2", {"x": 20})
        r, cursor = tick(cursor)
        assert str(frags()[-1]) in instance.get_dynamic_partitions(pname)
        assert len(_runs(r, ["v"])) == 1
        run_all(r)
        # compaction: old partitions retired, the new fragment added; no view is stale, and the
        # partitions of the merged fragments are recorded (they hold rows the views have)
        before = set(instance.get_dynamic_partitions(pname))
        rows = {n: db.open_table(n).to_arrow().sort_by("id") for n in ("v", "w")}
        src.optimize()
        r, cursor = tick(cursor)
        after = set(instance.get_dynamic_partitions(pname))
        assert after == {str(f) for f in frags()} and not (after & before)
        (run,) = r.run_requests
        assert run.run_key.startswith(f"src@{src.version}:;recorded:")  # no view due
        run_all(r)
        assert {n: db.open_table(n).to_arrow().sort_by("id") for n in ("v", "w")} == rows
        # a partition key typed in the launch dialog that is no fragment id: retired, the sensor survives
        instance.add_dynamic_partitions(pname, ["not-a-fragment"])
        r, cursor = tick(cursor)
        assert "not-a-fragment" not in instance.get_dynamic_partitions(pname)


def test_a_partition_refreshed_to_a_pinned_version_shows_a_later_change_of_its_fragment(tmp_path):
    """The sensor pins the source version its run refreshes to. A delete in the
    same fragment after the tick and before the run: the run refreshes the
    partition to the pinned version, so it is Unsynced after the run (before:
    in sync, the run recorded the fragment as it was at the run's end), and in
    sync after the next tick's run."""
    from dagster._utils.test.data_versions import get_stale_status_resolver
    from dagster_helpers import run_requested

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": double}))  # no view over it
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sensor = _sensor(defs, "src_changes")
    every = [*defs.get_repository_def().assets_defs_by_key.values(), defs.get_assets_def(K(["src"]))]
    with dg.instance_for_test() as instance:
        def status(partition):
            return get_stale_status_resolver(instance, every).get_status(K(["v"]), partition).value

        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        run_requested(defs, instance, first)
        src.delete("id = 1")  # fragment 0
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        assert tick.run_requests[0].tags["dagster/asset_partition_range_start"] == "0"
        src.delete("id = 2")  # fragment 0 again, after the tick: the run is pinned before it
        run_requested(defs, instance, tick)
        assert 2 in db.open_table("v").to_arrow().column("id").to_pylist()
        assert (status("0"), status("1")) == ("STALE", "FRESH")
        later = evaluate_sensor(sensor, instance=instance, cursor=tick.cursor, definitions=defs,
                                resources=defs.resources)
        run_requested(defs, instance, later)
        assert 2 not in db.open_table("v").to_arrow().column("id").to_pylist()
        assert (status("0"), status("1")) == ("FRESH", "FRESH")


def test_a_view_over_a_view_is_unsynced_exactly_where_its_upstream_partition_changed(tmp_path):
    """w reads v (and v's UDF column y). Materializing v's partition of a changed
    fragment alone makes w's partition of that fragment Unsynced ("v has a new
    data version"), and only that one; materializing v's partition of an
    unchanged fragment again changes nothing downstream (a partition's data
    version is what it holds: its fragment's rows as read, not the view's Lance
    version); the sensor's run brings w back in sync."""
    from dagster._core.definitions.events import AssetKeyPartitionKey
    from dagster._utils.test.data_versions import get_stale_status_resolver
    from dagster_helpers import run_requested

    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    sensor = _sensor(defs, "src_changes")
    every = [*repo.assets_defs_by_key.values(), defs.get_assets_def(K(["src"]))]
    v_asset = [repo.assets_defs_by_key[K(["v"])]]
    with dg.instance_for_test() as instance:
        def w_status():
            resolver = get_stale_status_resolver(instance, every)
            return [resolver.get_status(K(["w"]), p).value for p in ("0", "1")]

        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        run_requested(defs, instance, first)
        assert w_status() == ["FRESH", "FRESH"]
        assert dg.materialize(v_asset, instance=instance, partition_key="1", selection=[K(["v"]), K(["v", "y"])]).success
        assert w_status() == ["FRESH", "FRESH"]  # nothing changed in fragment 1
        src.delete("id = 5")  # fragment 0, a row w holds
        assert dg.materialize(v_asset, instance=instance, partition_key="0", selection=[K(["v"]), K(["v", "y"])]).success
        assert w_status() == ["STALE", "FRESH"]
        causes = get_stale_status_resolver(instance, every).get_stale_causes(K(["w"]), "0")
        assert {c.dependency for c in causes} == {AssetKeyPartitionKey(K(["v"]), "0"), AssetKeyPartitionKey(K(["v", "y"]), "0")}
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs, resources=defs.resources)
        run_requested(defs, instance, tick)
        assert 5 not in db.open_table("w").to_arrow().column("id").to_pylist()
        assert w_status() == ["FRESH", "FRESH"]


def test_a_table_emptied_by_deletes_empties_its_views_then_retires_its_partitions(tmp_path):
    """Every row deleted: no fragment is left. The sensor's run names the
    partitions of the fragments that are gone (a run without partitions
    cannot read its partitioned source's observations), the views are
    emptied, and the next tick retires those partitions."""
    from dagster_helpers import run_requested

    db = _catalog(tmp_path / "cat")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sensor = _sensor(defs, "src_changes")
    pname = partitions_def_name("src")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        run_requested(defs, instance, first)
        parts = instance.get_dynamic_partitions(pname)
        db.open_table("src").delete("id >= 0")
        emptied = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                                  resources=defs.resources)
        (run,) = emptied.run_requests
        assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (
            parts[0], parts[-1])
        run_requested(defs, instance, emptied)
        assert (db.open_table("v").count_rows(), db.open_table("w").count_rows()) == (0, 0)
        assert instance.get_dynamic_partitions(pname) == parts  # named by the run: kept until it ran
        after = evaluate_sensor(sensor, instance=instance, cursor=emptied.cursor, definitions=defs,
                                resources=defs.resources)
        assert not after.run_requests
        _apply(instance, after)
        assert instance.get_dynamic_partitions(pname) == []


def test_partition_run_with_a_key_that_is_no_fragment_fails_clearly(tmp_path):
    db = _catalog(tmp_path / "cat")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), ["oops"])
        with pytest.raises(dg.Failure, match="not fragment ids of 'src'"):
            dg.materialize(assets, instance=instance, partition_key="oops")


@pytest.mark.spark
def test_materializing_requested_partitions_gives_the_oracle_view(tmp_path, spark_runner):
    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    resource = MvAssetsResource(catalog_uri=db.uri, spark_master="local[2]", local_below_rows=0)
    defs = build_definitions(db, resource=resource)
    sensor = _sensor(defs, "src_changes")
    job_assets = defs.get_repository_def().assets_defs_by_key
    view_assets = [job_assets[dg.AssetKey(["v"])], job_assets[dg.AssetKey(["w"])]]
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: src.add([{"id": 50, "x": 50}]), lambda: src.delete("id = 4"),
                       lambda: src.update("id = 5", {"x": 3}), lambda: src.optimize()):
            if change:
                change()
            result = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
            _apply(instance, result)
            cursor = result.cursor
            for run in result.run_requests:
                out = dg.materialize(
                    view_assets, instance=instance, tags=run.tags,
                    selection=run.asset_selection,
                )
                assert out.success
            view = db.open_table("v")
            keep = lambda r: r["x"] != 3  # noqa: E731
            project = lambda r: {"id": r["id"], "x": r["x"], "y": 2 * r["x"]}  # noqa: E731
            expect = expected_view(src.uri, src.version, keep, project)
            assert actual_view(view) == expect
            got_w = sorted(r["id"] for r in db.open_table("w").to_arrow().to_pylist())
            assert got_w == sorted(r["id"] for r in expect.values() if r["y"] > 4)
        # one materialization per asset and partition, with engine metadata
        mats = instance.fetch_materializations(dg.AssetKey(["v"]), limit=100).records
        assert mats and {"rows_computed", "dagster/row_count"} <= set(mats[0].asset_materialization.metadata)
        checks = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(["v"]), "matches_source_query"), limit=1
        )
        assert checks and checks[0].status.value == "SUCCEEDED"


@pytest.mark.spark
def test_ui_partition_materialization_is_idempotent(tmp_path):
    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    resource = MvAssetsResource(catalog_uri=db.uri, spark_master="local[2]", local_below_rows=0)
    defs = build_definitions(db, resource=resource)
    assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]]
    frag = str(lance.dataset(src.uri).get_fragments()[1].fragment_id)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), [frag])
        for attempt in range(2):
            out = dg.materialize(assets, instance=instance, partition_key=frag, selection=[K(["v"]), K(["v", "y"])])
            assert out.success
            (mat,) = [m for m in out.asset_materializations_for_node("src_lineage") if m.asset_key == K(["v"])]
            computed = mat.metadata["rows_computed"].value
            assert computed == (4 if attempt == 0 else 0)
        assert sorted(db.open_table("v").to_arrow().column("id").to_pylist()) == [6, 7, 8, 9]


def test_selecting_only_a_column_recomputes_only_that_column(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    log = str(tmp_path)

    @mv.udf
    def a(x: int) -> int:
        record_call(log, "a", x)
        return x + 1

    @mv.udf
    def b(x: int) -> int:
        record_call(log, "b", x)
        return x + 2

    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)])
    src.add([{"id": i, "x": i} for i in range(5, 8)])
    db.create_materialized_view("v", src.search(None).select({"id": "id", "a": a, "b": b}))
    resource = MvAssetsResource(catalog_uri=db.uri, runner="inline")
    defs = build_definitions(db, resource=resource)
    assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]]
    frags = [str(f.fragment_id) for f in lance.dataset(src.uri).get_fragments()]
    whole = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        assert dg.materialize(assets, instance=instance, tags=whole).success
        assert (count_calls(log, "a"), count_calls(log, "b")) == (8, 8)
        # one partition picked in the launch dialog: b is recomputed there, a is not
        out = dg.materialize(assets, instance=instance, partition_key=frags[0], selection=[dg.AssetKey(["v", "b"])])
        assert out.success
        assert (count_calls(log, "a"), count_calls(log, "b")) == (8, 13)
        mats = out.get_asset_materialization_events()
        assert [m.asset_key for m in mats] == [dg.AssetKey(["v", "b"])]
        # every partition, nothing changed: b is current for every row, nothing is computed
        assert dg.materialize(assets, instance=instance, tags=whole, selection=[dg.AssetKey(["v", "b"])]).success
        assert count_calls(log, "b") == 13


def test_policies_are_wired_to_sensors_and_schedules(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(10)])
    P = mv.RefreshPolicy
    views = {
        "eager_v": P.eager(),
        "ttl_v": P.ttl(3600),
        "stale_v": P.staleness(25),
        "cron_v": P.cron_schedule("*/5 * * * *"),
        "manual_v": P.manual(),
    }
    for name, policy in views.items():
        db.create_materialized_view(name, src.search(None).select({"id": "id", "y": double}), refresh_policy=policy)
        db.open_table(name).refresh()
    defs = build_definitions(db)
    repo = defs.get_repository_def()
    assert "Policy: ttl" in repo.asset_graph.get(dg.AssetKey(["ttl_v"])).description
    assert repo.asset_graph.get(dg.AssetKey(["ttl_v"])).freshness_policy is not None
    assert repo.asset_graph.get(dg.AssetKey(["eager_v"])).freshness_policy is None
    assert {s.name for s in defs.schedules} == {"cron_v_schedule", "full_checks_src_daily"}  # (stopped: full checks)
    assert repo.get_schedule_def("cron_v_schedule").cron_schedule == "*/5 * * * *"
    sensor = repo.get_sensor_def("src_changes")

    def requested(instance, cursor):
        r = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        if isinstance(r, dg.SkipReason):
            return set(), cursor
        _apply(instance, r)
        return {k.path[0] for run in r.run_requests for k in run.asset_selection}, r.cursor

    with dg.instance_for_test() as instance:
        got, cursor = requested(instance, None)
        src.add([{"id": 100, "x": 1}])  # 1 of 10 rows changed: 10% < 25%
        got, cursor = requested(instance, cursor)
        assert got == {"eager_v"}
        src.add([{"id": 101 + i, "x": 1} for i in range(2)])  # 3 of 10 changed: 30% >= 25%
        got, cursor = requested(instance, cursor)
        assert got == {"eager_v", "stale_v"}
        db.open_table("stale_v").refresh()
        db.open_table("eager_v").refresh()  # what the requested runs did (outside Dagster: recorded by the next)
        db.open_table("ttl_v").set_refresh_policy(P.ttl(0.001))  # now overdue
        r = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        assert _due(r) == {"ttl_v"}  # no new source version, but the ttl expired
        got, cursor = requested(instance, cursor)
        assert got == {"ttl_v", "eager_v", "stale_v"}  # (the two refreshed outside the runs: recorded by it)
        schedule = repo.get_schedule_def("cron_v_schedule")
        run = evaluate_schedule(schedule, instance=instance, resources=defs.resources).run_requests
        assert len(run) == 1 and dg.AssetKey(["cron_v"]) in run[0].asset_selection
        db.open_table("cron_v").refresh()
        skip = evaluate_schedule(schedule, instance=instance, resources=defs.resources)
        assert not skip.run_requests


def test_table_computed_columns_are_assets_filled_by_backfill(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)])
    src.add_columns({"y": double, "z": "x + 100"})
    db.create_materialized_view("v", src.search(None).select(["id", "y"]))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    graph = defs.get_repository_def().asset_graph
    ykey, zkey = dg.AssetKey(["src", "y"]), dg.AssetKey(["src", "z"])
    assert graph.get(ykey).parent_keys == {dg.AssetKey(["src"])}
    assert graph.get(ykey).code_version == src.computed_columns()[0].udf.fingerprint
    parents = graph.get(dg.AssetKey(["v"])).parent_keys
    assert ykey in parents and zkey not in parents  # lineage: only the columns the view reads feed it
    sensor = _sensor(defs, "src_changes")

    def tick(cursor):
        result = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        _apply(instance, result)
        return result

    with dg.instance_for_test() as instance:
        first = tick(None)
        (run,) = first.run_requests  # one run: the backfill of y, then the view that reads it
        # (z, a SQL column, is filled already: its partitions, new to the instance, record their input)
        assert set(run.asset_selection) == {ykey, zkey, dg.AssetKey(["v"])}
        db.open_table("v").refresh()  # the view's run, before the backfill's (outside Dagster: recorded next)
        assert not _due(tick(first.cursor))
        job = defs.resolve_implicit_global_asset_job_def()
        run = job.execute_in_process(instance=instance, asset_selection=[ykey], tags=run.tags)  # "Materialize"
        assert run.success
        mat = instance.get_latest_materialization_event(ykey).asset_materialization
        assert mat.metadata["run_rows_written"].value == 5 == mat.metadata["rows_computed"].value
        assert [r["y"] for r in src.to_arrow().to_pylist()] == [0, 2, 4, 6, 8]
        # the backfill moved no row versions, yet the view reads y: it is refreshed; y itself is not stale
        after = tick(first.cursor)
        assert not _runs(after, ["src", "y"])
        assert len(_runs(after, ["v"])) == 1 and _due(after) == {"v"}
        src.add([{"id": 9, "x": 9}])
        later = tick(after.cursor)
        assert ykey in later.run_requests[0].asset_selection
    # a new UDF version is a new code version of the column asset
    old_version = graph.get(ykey).code_version
    src.alter_columns({"path": "y", "udf": mv.udf(lambda x: 3 * x, data_type=double.data_type, name="triple",
                                                  input_columns=["x"])})
    graph2 = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline")).get_repository_def().asset_graph
    assert graph2.get(ykey).code_version == src.computed_columns()[0].udf.fingerprint != old_version


def test_resource_settings_from_the_environment_stay_env_vars(tmp_path, monkeypatch):
    """Spark settings in the environment are bound as dg.EnvVar (resolved when
    the resource starts, shown as env in the UI), the runner choice is checked."""
    db = mv.connect(str(tmp_path / "cat"))
    db.create_table("t", pa.table({"x": [1, 2]}))
    monkeypatch.setenv("MV_ASSETS_SPARK_MASTER", "local[3]")
    monkeypatch.setenv("MV_ASSETS_LOCAL_BELOW_ROWS", "7")
    monkeypatch.setenv("MV_ASSETS_RUNNER", "inline")
    monkeypatch.setenv("MV_ASSETS_INLINE_THREADS", "3")
    resource = build_definitions(db).resources["mv_assets"]
    assert isinstance(resource, MvAssetsResource)
    config = resource._convert_to_config_dictionary()
    assert config["spark_master"] == {"env": "MV_ASSETS_SPARK_MASTER"}
    assert config["local_below_rows"] == {"env": "MV_ASSETS_LOCAL_BELOW_ROWS"}
    assert config["runner"] == "inline" and "spark_remote" not in config or config.get("spark_remote") is None
    with dg.build_resources({"r": resource}) as res:
        assert (res.r.spark_master, res.r.local_below_rows) == ("local[3]", 7)
        assert type(res.r.get_runner()).__name__ == "InlineRunner"
        assert res.r.get_runner().parallelism() == 3  # tasks on three threads of the run process
    assert config["inline_threads"] == {"env": "MV_ASSETS_INLINE_THREADS"}
    monkeypatch.setenv("MV_ASSETS_RUNNER", "spork")
    with pytest.raises(ValueError, match="MV_ASSETS_RUNNER must be 'spark' or 'inline', got 'spork'"):
        build_definitions(db)


def test_observing_a_source_table_reports_its_data_version(tmp_path):
    """The source table asset's observation (UI: "Observe sources") reads the
    table through the resource: appends move its data version, compaction does not."""
    db = mv.connect(str(tmp_path / "cat"))
    t = db.create_table("t", pa.table({"x": [1, 2]}))
    resource = MvAssetsResource(catalog_uri=db.uri, runner="inline")
    defs = build_definitions(db, resource=resource)
    source = defs.get_assets_def(dg.AssetKey(["t"]))

    def observed() -> str:
        result = observe([source])  # the definitions bind the resource
        assert result.success
        (obs,) = result.asset_observations_for_node(source.op.name)
        return obs.tags["dagster/data_version"]

    first = observed()
    assert first == str(t.version)
    t.add(pa.table({"x": [3]}))
    t.add(pa.table({"x": [4]}))
    appended = observed()
    assert appended == str(t.version) != first
    t.optimize()
    assert observed() == appended


def test_materialized_partitions_are_in_sync_when_the_source_was_never_observed(tmp_path):
    """Materializing from the UI before any sensor tick or "Observe sources":
    the partitions are not Unsynced (the run observes the fragments it read);
    an append leaves them in sync (it touched none of their fragments); a
    delete makes its fragment's partition Unsynced, and only that one."""
    from dagster._core.definitions.events import AssetKeyPartitionKey
    from dagster._utils.test.data_versions import get_stale_status_resolver  # what the UI's staleStatus uses

    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    every = [*repo.assets_defs_by_key.values(), defs.get_assets_def(K(["src"]))]
    frags = [str(f.fragment_id) for f in lance.dataset(src.uri).get_fragments()]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        for frag in frags:
            out = dg.materialize([repo.assets_defs_by_key[K(["v"])]], instance=instance, partition_key=frag,
                                 selection=[K(["v"]), K(["v", "y"])])
            assert out.success

        def statuses():
            resolver = get_stale_status_resolver(instance, every)
            return {(key.to_user_string(), p): resolver.get_status(key, p).value
                    for key in (K(["v"]), K(["v", "y"])) for p in frags}

        assert set(statuses().values()) == {"FRESH"}
        src.add([{"id": 100, "x": 100}])
        observe([defs.get_assets_def(K(["src"]))], instance=instance)  # "Observe sources"
        assert set(statuses().values()) == {"FRESH"}
        src.delete("id = 1")  # fragment 0
        observe([defs.get_assets_def(K(["src"]))], instance=instance)
        resolver = get_stale_status_resolver(instance, every)
        assert [resolver.get_status(K(["v"]), p).value for p in frags] == ["STALE", "FRESH"]
        assert [c.dependency for c in resolver.get_stale_causes(K(["v"]), frags[0])] == [
            AssetKeyPartitionKey(K(["src"]), frags[0])]


def test_an_append_leaves_the_partitions_it_did_not_touch_in_sync(tmp_path):
    """The demo's lineage driven by its sensor: after each change and the run
    it requests, every partition of every asset is in sync, as `mv-assets
    status` says no view is behind; between the tick and the run, partitions
    the run does not cover are in sync, and a delete's partition is not
    (before: an append left every other partition Unsynced forever)."""
    from dagster._utils.test.data_versions import get_stale_status_resolver
    from dagster_helpers import apply_partition_requests, run_requested

    from mv_assets.demo import _documents, seed

    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    docs = db.open_table("documents")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    sources = [K(["documents"]), K(["authors"])]  # (authors: joined by doc_authors)
    every = [*repo.assets_defs_by_key.values(), *(defs.get_assets_def(k) for k in sources)]
    sensor = repo.get_sensor_def("documents_changes")
    keys = [k for k in repo.asset_graph.get_all_asset_keys() if k not in sources]

    def fragment_of(doc_id: int) -> str:
        rows = lance.dataset(docs.uri).to_table(columns=[], filter=f"doc_id = {doc_id}", with_row_address=True)
        return str(rows.column("_rowaddr")[0].as_py() >> 32)

    with dg.instance_for_test() as instance:
        def stale(parts) -> set:
            resolver = get_stale_status_resolver(instance, every)
            return {(k.to_user_string(), p) for k in keys for p in parts if resolver.get_status(k, p).value != "FRESH"}

        cursor = None
        deleted_from = fragment_of(7)
        changes = [None, lambda: docs.add(_documents(5000, 30)), lambda: docs.add(_documents(6000, 20)),
                   lambda: docs.delete("doc_id = 7")]
        for change in changes:
            before = [str(f.fragment_id) for f in lance.dataset(docs.uri).get_fragments()]
            if change:
                change()
            tick = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs,
                                   resources=defs.resources)
            cursor = tick.cursor
            if change:
                apply_partition_requests(instance, tick)
                (run,) = tick.run_requests
                start, end = run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]
                covered = {str(f) for f in range(int(start), int(end) + 1)}
                assert not stale([p for p in before if p not in covered])  # their fragments did not change
                if change is changes[-1]:
                    assert ("doc_features", deleted_from) in stale([deleted_from])
            run_requested(defs, instance, tick)
            assert all(db.open_table(n).status().versions_behind == 0 for n in ("doc_features", "long_docs", "doc_chunks"))
            assert not stale(instance.get_dynamic_partitions(partitions_def_name("documents")))


def test_a_failing_udf_fails_the_run_naming_column_udf_row_and_remedy(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())

    @mv.udf
    def score(x: int) -> int:
        if x == 3:
            raise ZeroDivisionError("no score for three")
        return x * 10

    src = db.create_table("src", [{"id": 100 + i, "x": i} for i in range(6)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "score": score}))
    row_id = next(r["_rowid"] for r in lance.dataset(src.uri).to_table(with_row_id=True).to_pylist() if r["x"] == 3)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]]
    frags = [str(f.fragment_id) for f in lance.dataset(src.uri).get_fragments()]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        with pytest.raises(dg.Failure, match="UDF 'score' raised ZeroDivisionError: no score for three") as info:
            dg.materialize(assets, instance=instance, partition_key=frags[0])
    failure = info.value
    text = failure.description or ""
    for part in ("column 'score' of 'v'", f"source row id {row_id} of 'src' (id=103)", 'on_error="skip"',
                 "mv-assets errors v"):
        assert part in text
    assert {k: failure.metadata[k].value for k in ("column", "udf", "row_id", "primary_key")} == {
        "column": "score", "udf": "score", "row_id": row_id, "primary_key": "id=103"}
    assert [e.row_id for e in db.open_table("v").get_errors(column_name="score")] == [row_id]


def test_a_chunk_view_is_an_asset_of_its_sources_lineage_refreshed_by_the_sensor_runs(tmp_path):
    """A chunk view (@chunker, create_udtf_view) sits in its source's lineage,
    partitioned by the source's fragments like other views; the sensor's run
    requests materialize it and it equals the oracle after appends, deletes,
    updates and compaction."""
    from test_chunk_views import actual, calls, docs_rows, expected, make_embed, make_split

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    log, embed_log = str(tmp_path / "calls"), str(tmp_path / "embed_calls")
    os.makedirs(log)
    os.makedirs(embed_log)
    docs = db.create_table("docs", docs_rows(range(12)), primary_key="id")
    chunks = db.create_udtf_view("chunks", docs.search(None).where("id > 0").select(["id", "title"]), make_split(log))
    chunks.add_columns({"emb": make_embed(embed_log)})  # computed from the chunks' rows
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    graph = defs.get_repository_def().asset_graph
    assert graph.get(K(["chunks"])).parent_keys == {K(["docs"])}
    assert graph.get(K(["chunks", "emb"])).parent_keys == {K(["chunks"])}  # documents -> chunks -> embeddings
    assert graph.get(K(["chunks"])).partitions_def.name == partitions_def_name("docs")
    assert graph.get(K(["chunks", "emb"])).partitions_def.name == partitions_def_name("docs")
    assert "chunker split " in graph.get(K(["chunks"])).description
    sensor = _sensor(defs, "docs_changes")
    chunk_assets = [defs.get_repository_def().assets_defs_by_key[K(["chunks"])]]
    embedded = 0
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: docs.add(docs_rows(range(20, 24))), lambda: docs.delete("id < 4"),
                       lambda: docs.update("id = 8", values_sql={"body": "'p q r s t'"}), lambda: docs.optimize()):
            if change:
                change()
            result = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
            _apply(instance, result)
            cursor = result.cursor
            for run in result.run_requests:
                assert dg.materialize(chunk_assets, instance=instance, tags=run.tags, selection=run.asset_selection).success
            view = db.open_view("chunks")
            assert actual(view) == expected(docs.uri, docs.version)
            # the same runs computed the new chunks' embeddings, and only those
            assert {c["column"]: c["stale"] for c in view.column_status()} == {"emb": 0}
            embedded += calls(embed_log)
            assert all(r["emb"] == len(r["text"]) * 10 + r["text"].count(" ") for r in view.to_arrow().to_pylist())
            if change is None:  # each partition records its parents chunked and its rows (chunks), named so
                frag_ids = [f.fragment_id for f in lance.dataset(docs.uri).get_fragments()]
                first_rows = view.rows_by_fragment(docs.version, frag_ids)
                assert sum(first_rows.values()) == len(expected(docs.uri, docs.version))
                mds = [m.asset_materialization for m in instance.fetch_materializations(K(["chunks"]), limit=50).records]
                assert mds and all("parents_chunked" in m.metadata and "rows_computed" not in m.metadata
                                   and "run_parents_inserted" in m.metadata for m in mds)
                first_counts = {int(m.partition): m.metadata["partition_row_count"].value for m in mds}
                assert {m.metadata["dagster/row_count"].value for m in mds} == {view.count_rows()}
        assert calls(log) == 11 + 4 + 1  # each passing parent once, the updated one again; deletes and compaction: none
        assert embedded == len(expected(docs.uri, 2)) + 4 + 3  # the first chunks, the appended, the re-chunked
        mats = instance.fetch_materializations(K(["chunks", "emb"]), limit=100).records
        assert mats and {"rows_computed", "run_udf_rows_computed"} <= set(mats[0].asset_materialization.metadata)
        assert first_counts and all(n == first_rows[fid] for fid, n in first_counts.items())


def test_a_table_function_view_is_refreshed_as_a_whole_in_any_run(tmp_path):
    """A table-function view's partitions are its partition_by values, not the
    source's fragments: its asset says so and every run refreshes it whole."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("ev", [{"id": i, "g": i % 3} for i in range(9)])
    src.add([{"id": 9, "g": 1}])

    @mv.udtf(output_schema=pa.schema([("g", pa.int64()), ("n", pa.int64())]), input_columns=["g"], partition_by="g")
    def count(t: pa.Table) -> pa.Table:
        return pa.table({"g": [t.column("g")[0].as_py()], "n": [t.num_rows]})

    db.create_udtf_view("counts", src.search(None), count)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    node = defs.get_repository_def().asset_graph.get(K(["counts"]))
    assert node.parent_keys == {K(["ev"])}
    assert "udtf count over each g partition" in node.description
    assert "Refreshed as a whole in any partition run" in node.description
    frag = str(lance.dataset(src.uri).get_fragments()[1].fragment_id)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("ev"), [frag])
        assets = [defs.get_repository_def().assets_defs_by_key[K(["counts"])]]
        assert dg.materialize(assets, instance=instance, partition_key=frag, selection=[K(["counts"])]).success
    got = sorted((r["g"], r["n"]) for r in db.open_view("counts").to_arrow().to_pylist())
    assert got == [(0, 3), (1, 4), (2, 3)]  # every partition, not only the fragment's rows


def test_a_views_indexes_and_their_coverage_show_on_its_asset(tmp_path):
    """Each run that refreshes a view brings its indexes up to date; the asset's
    materialization says which indexes there are and how many rows each covers."""
    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    db.open_view("v").create_scalar_index("x", index_type="BTREE")  # pending: the view has no rows yet
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri))
    sensor = _sensor(defs, "src_changes")
    view_assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]]
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: src.add([{"id": 50, "x": 50}, {"id": 51, "x": 51}])):
            if change:
                change()
            result = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
            _apply(instance, result)
            cursor = result.cursor
            for run in result.run_requests:
                assert dg.materialize(view_assets, instance=instance, tags=run.tags, selection=run.asset_selection).success
            n = db.open_table("v").count_rows()
            (info,) = db.open_table("v").list_indices()
            assert (info.num_indexed_rows, info.num_unindexed_rows) == (n, 0)
            mat = instance.get_latest_materialization_event(dg.AssetKey(["v"])).asset_materialization
            assert mat.metadata["index_coverage"].value == 1.0
            assert f"| x_idx | BTREE | x | {n:,} of {n:,} (100%) |" in mat.metadata["indexes"].value


@pytest.mark.parametrize("runner, kind, words", [("spark", "spark", "on Spark"),
                                                  ("inline", "python", "in the run's process (the inline runner)")])
def test_the_assets_say_where_their_refreshes_compute(tmp_path, runner, kind, words):
    """The view's and its UDF column's kinds and the view's description name
    the resource's runner: an inline runner's lineage does not say Spark."""
    db = mv.connect(str(tmp_path / "cat"))
    t = db.create_table("t", pa.table({"x": [1, 2]}))
    db.create_materialized_view("v", t.search(None).select({"x": "x", "y": mv.udf(lambda x: x, data_type=pa.int64())}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner=runner))
    view = defs.get_assets_def(dg.AssetKey(["v"])).specs_by_key[dg.AssetKey(["v"])]
    column = defs.get_assets_def(dg.AssetKey(["v", "y"])).specs_by_key[dg.AssetKey(["v", "y"])]
    assert set(view.kinds) == {"lance", kind}
    assert kind in set(column.kinds)
    assert f"refreshed incrementally {words}." in (view.description or "")
    assert ("Spark" in (view.description or "")) == (runner == "spark")


def _small_lineage(tmp_path):
    """The small catalog, its definitions (inline runner), the source's
    fragments (the partition keys) and the tags of a run over all of them."""
    db = _catalog(tmp_path / "cat")
    src = db.open_table("src")
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    frags = [str(f.fragment_id) for f in lance.dataset(src.uri).get_fragments()]
    whole = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    return db, src, defs, frags, whole


def test_an_asset_of_ones_own_downstream_of_a_view_runs_in_the_same_run(tmp_path):
    """A user's asset over a view (and over one of its UDF columns), in one run
    with the view: it ran after the refresh and saw it (it was skipped: the
    view's materializations were events, not outputs), and each partition of
    the view is recorded once, with its own numbers."""
    db, src, defs, frags, whole = _small_lineage(tmp_path)
    lineage = defs.get_repository_def().assets_defs_by_key[K(["v"])]
    pdef = lineage.partitions_def
    seen: dict[str, list] = {}

    @dg.asset(deps=[K(["v"])])
    def export(context) -> None:  # unpartitioned: reads the whole view
        seen["export"] = sorted(mv.connect(db.uri).open_table("v").to_arrow().column("id").to_pylist())

    @dg.asset(deps=[K(["v", "y"])], partitions_def=pdef)
    def per_fragment(context) -> None:
        seen.setdefault("per_fragment", []).append(context.partition_key)

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        out = dg.materialize([lineage, per_fragment], instance=instance, partition_key=frags[1],
                             selection=[K(["v"]), K(["v", "y"]), K(["per_fragment"])])
        assert out.success and seen == {"per_fragment": [frags[1]]}
        assert [e.event_type_value for e in out.events_for_node("per_fragment") if e.is_step_skipped] == []
        out = dg.materialize([lineage, export], instance=instance, tags=whole,
                             selection=[K(["v"]), K(["v", "y"]), K(["export"])])
        assert out.success and seen["export"] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        view_mats = [m for m in out.get_asset_materialization_events() if m.asset_key == K(["v"])]
        assert sorted(m.partition for m in view_mats) == sorted(frags)  # one each, not two
        assert all("rows_computed" in m.materialization.metadata for m in view_mats)
        assert [m.asset_key for m in out.get_asset_materialization_events()].count(K(["export"])) == 1


def test_an_asset_of_ones_own_loads_a_view_a_column_or_a_table_by_parameter(tmp_path):
    """``def export(v)`` (or ``AssetIn`` of a UDF column's key, or of the source
    table): the parameter is the view's (the table's) handle. It failed: the
    catalog's assets were Nothing-typed outputs, which Dagster cannot load
    ("dagster_type Nothing"), so only ``deps=`` worked. Loaded in the view's
    run and in a run of its own; nothing is stored through the IO manager and
    the view is still recorded once per partition."""
    db, src, defs, frags, whole = _small_lineage(tmp_path)
    repo = defs.get_repository_def()
    lineage = repo.assets_defs_by_key[K(["v"])]
    source = repo.source_assets_by_key[K(["src"])]
    seen: dict[str, Any] = {}

    @dg.asset
    def export(v: mv.MaterializedView, w) -> None:
        seen["export"] = (type(v).__name__, sorted(v.to_arrow().column("id").to_pylist()), w.name)

    @dg.asset(ins={"column": dg.AssetIn(key=K(["v", "y"])), "table": dg.AssetIn(key=K(["src"]))})
    def by_column(column, table) -> None:
        seen["by_column"] = (column.name, sorted(column.to_arrow().column("y").to_pylist()), type(table).__name__,
                             table.count_rows())

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        out = dg.materialize([lineage, source, export, by_column], instance=instance, tags=whole,
                             selection=[K(["v"]), K(["v", "y"]), K(["w"]), K(["export"]), K(["by_column"])])
        assert out.success
        assert seen["export"] == ("MaterializedView", [0, 1, 2, 4, 5, 6, 7, 8, 9], "w")
        assert seen["by_column"] == ("v", [0, 2, 4, 8, 10, 12, 14, 16, 18], "Table", 10)
        view_mats = [m for m in out.get_asset_materialization_events() if m.asset_key == K(["v"])]
        assert sorted(m.partition for m in view_mats) == sorted(frags)  # one each, not two
        src.add([{"id": 10, "x": 10}])
        db.open_view("v").refresh()
        seen.clear()
        out = dg.materialize([lineage, source, export], instance=instance, selection=[K(["export"])])
        assert out.success and seen["export"][1] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]  # (its latest version)

    @dg.asset(io_manager_key="mv_assets_io_manager")
    def mine() -> int:
        return 3

    with dg.instance_for_test() as instance:
        out = dg.materialize([mine], instance=instance, resources=defs.resources, raise_on_error=False)
        assert not out.success
        (failure,) = [e for e in out.all_events if e.is_step_failure]
        assert "mv_assets_io_manager stores nothing" in str(failure.step_failure_data.error)


def test_a_udf_column_alone_after_a_source_change_records_the_views_partition_it_refreshed(tmp_path):
    """The UDF column of one partition materialized alone after the source
    changed: its refresh brings the view's rows in that partition to the new
    source version too. The column recorded the view's new data version as its
    input, and the view's partition kept its old record (a data version the
    view never recorded). The view's partition is now recorded as well; a
    recompute over an unchanged source records the column alone."""
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    db, src, defs, frags, whole = _small_lineage(tmp_path)
    lineage = defs.get_repository_def().assets_defs_by_key[K(["v"])]

    def latest(key, partition):  # (records come newest first)
        rec = next(r for r in instance.fetch_materializations(key, limit=100).records if r.partition_key == partition)
        return rec.asset_materialization, rec.run_id

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        assert dg.materialize([lineage], instance=instance, tags=whole, selection=[K(["v"]), K(["v", "y"])]).success
        src.update(where="id = 0", values={"x": 100})
        out = dg.materialize([lineage], instance=instance, partition_key=frags[0], selection=[K(["v", "y"])])
        assert out.success
        column, run = latest(K(["v", "y"]), frags[0])
        view, view_run = latest(K(["v"]), frags[0])
        assert view_run == run == out.run_id  # (it was the first run's)
        assert column.tags["dagster/input_data_version/v"] == view.tags[DATA_VERSION_TAG]
        assert view.metadata["source_version"].value == src.version
        assert latest(K(["v"]), frags[1])[1] != out.run_id  # (the other partition: not refreshed)
        out = dg.materialize([lineage], instance=instance, partition_key=frags[0], selection=[K(["v", "y"])])
        assert out.success and latest(K(["v", "y"]), frags[0])[1] == out.run_id
        assert latest(K(["v"]), frags[0])[1] == view_run  # (nothing changed under it: the column alone)


def test_a_cron_views_schedule_before_any_partition_exists_runs_over_the_sources_fragments(tmp_path):
    """The schedule of a cron view, before the source's sensor added any
    partition (stopped, or not ticked yet): its run named no partition,
    refreshed and committed the view, then failed recording it (Dagster:
    'Cannot access partition_key for a non-partitioned run'), at every tick.
    It now adds the fragments' partitions and runs over them."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 9)])
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": double}),
                                refresh_policy=mv.RefreshPolicy.cron_schedule("*/5 * * * *"))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    sched = defs.get_repository_def().get_schedule_def("v_schedule")
    with dg.instance_for_test() as instance:
        tick = evaluate_schedule(sched, instance=instance, resources=defs.resources)
        (req,) = tick.run_requests
        frags = [str(f) for f in src.fragment_ids()]
        assert instance.get_dynamic_partitions(partitions_def_name("src")) == frags
        assert (req.tags["dagster/asset_partition_range_start"], req.tags["dagster/asset_partition_range_end"]) == (
            frags[0], frags[-1])
        run = defs.resolve_job_def("refresh_src").execute_in_process(
            instance=instance, asset_selection=req.asset_selection, tags=req.tags, raise_on_error=False)
        assert run.success
        mats = instance.fetch_materializations(K(["v"]), limit=10).records
        assert sorted(r.partition_key for r in mats) == sorted(frags)
        assert db.open_view("v").status().load_state == "LOADED"


def test_a_udf_column_alone_of_a_view_never_refreshed_fails_in_words(tmp_path):
    """Selecting only a view's UDF column before the view was ever refreshed
    'succeeded': every row current, recorded for every partition, over an
    empty view (and an asset downstream ran over nothing)."""
    db, src, defs, frags, whole = _small_lineage(tmp_path)
    lineage = defs.get_repository_def().assets_defs_by_key[K(["v"])]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        out = dg.materialize([lineage], instance=instance, tags=whole, selection=[K(["v", "y"])], raise_on_error=False)
        assert not out.success
        (failure,) = [e for e in out.all_events if e.is_step_failure]
        assert "'v' was never refreshed: its UDF columns (y) are computed with its rows" in str(
            failure.step_failure_data.user_failure_data.description)
        assert instance.fetch_materializations(K(["v", "y"]), limit=10).records == []
        assert dg.materialize([lineage], instance=instance, tags=whole, selection=[K(["v"]), K(["v", "y"])]).success
        assert dg.materialize([lineage], instance=instance, tags=whole, selection=[K(["v", "y"])]).success
