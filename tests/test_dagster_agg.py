"""An aggregate view in Dagster: an asset of its source's lineage, refreshed
whole by the source's sensor runs, its checks run by the asset's check specs."""

import dagster as dg
from dagster_helpers import apply_partition_requests, call_sensor

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions

K = dg.AssetKey


def test_an_aggregate_view_is_an_asset_refreshed_by_its_sources_sensor(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("ev", [{"id": i, "g": i % 3, "x": float(i)} for i in range(9)], primary_key="id")
    view = db.create_materialized_view("per_g", src.search(None).group_by("g").agg(
        {"n": "count(*)", "sx": "sum(x)", "hi": "max(x)"}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    node = repo.asset_graph.get(K(["per_g"]))
    assert node.parent_keys == {K(["ev"])}
    assert "Aggregate view over ev" in node.description and "group by g;" in node.description
    assert "`" not in node.description  # plain text: the Catalog list shows descriptions as they are
    assert "Refreshed as a whole in any partition run" in node.description
    checks = {k.name for k in repo.asset_graph.asset_check_keys if k.asset_key == K(["per_g"])}
    assert checks == {"no_orphan_rows", "values_match_source"}
    sensor = repo.get_sensor_def("ev_changes")
    assets = [repo.assets_defs_by_key[K(["per_g"])]]
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: src.add([{"id": 9, "g": 1, "x": 100.0}]), lambda: src.delete("x = 100")):
            if change:
                change()
            result = call_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
            apply_partition_requests(instance, result)
            cursor = result.cursor
            assert result.run_requests
            for run in result.run_requests:
                assert dg.materialize(assets, instance=instance, tags=run.tags, selection=run.asset_selection).success
            rows = {r["g"]: (r["n"], r["sx"], r["hi"]) for r in view.to_arrow().to_pylist()}
            want: dict = {}
            for r in src.to_arrow().to_pylist():
                n, sx, hi = want.get(r["g"], (0, 0.0, None))
                want[r["g"]] = (n + 1, sx + r["x"], r["x"] if hi is None else max(hi, r["x"]))
            assert rows == want
        mat = instance.get_latest_materialization_event(K(["per_g"])).asset_materialization
        assert mat.metadata["run_groups_updated"].value == 1 and mat.metadata["dagster/row_count"].value == 3
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(K(["per_g"]), "values_match_source"), limit=1)
        assert history and history[0].status.value == "SUCCEEDED"


def test_an_aggregate_of_a_computed_column_follows_its_backfill_in_the_same_run(tmp_path):
    """An aggregate of a table's computed column: downstream of that
    column's asset (it was of the table alone), and the sensor's run that
    backfills the column refreshes the aggregate after it (it refreshed at
    the version the tick pinned, before the backfill: sums of NULLs, FRESH
    in the UI, until the next change)."""
    from dagster_helpers import execute_runs

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i, "g": i % 2} for i in range(4)], primary_key="id")

    @mv.udf
    def dbl(x: int) -> int:
        return 2 * x

    src.add_columns({"y": dbl})
    view = db.create_materialized_view("a", src.search(None).group_by("g").agg({"sy": "sum(y)"}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    repo = defs.get_repository_def()
    assert repo.asset_graph.get(K(["a"])).parent_keys == {K(["src"]), K(["src", "y"])}
    with dg.instance_for_test() as instance:
        cursor = None
        for change in (None, lambda: src.add([{"id": 100, "x": 100, "g": 0}])):
            if change:
                change()
            result = call_sensor(repo.get_sensor_def("src_changes"), instance=instance, cursor=cursor,
                                 definitions=defs, resources=defs.resources)
            apply_partition_requests(instance, result)
            cursor = result.cursor
            execute_runs(defs, instance, result)
            want: dict = {}
            for r in src.to_arrow().to_pylist():
                want[r["g"]] = want.get(r["g"], 0) + 2 * r["x"]
            assert {r["g"]: r["sy"] for r in view.to_arrow().to_pylist()} == want
