"""What Dagster records of a view against what the view holds: a sensor's run
that failed is requested again, and partitions a refresh reached outside the
runs that named them (from Python, a run of other partitions, a view over a
view bringing its upstream along, a join view refreshed by the other
source's sensor) are recorded by the next tick's run. Statuses are Dagster's
own (its stale status resolver: what the UI shows), runs are run as the
daemon runs them (a run key used once is never launched again)."""

import json
import os
import time

import dagster as dg
import lance
import pytest
from dagster_helpers import apply_partition_requests, evaluate_sensor, small_catalog
from oracle import actual_view, expected_view

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions, sensors
from mv_assets.dagster.definitions import job_name, partitions_def_name
from mv_assets.dagster.sensors import TAG_LINEAGE

RUN_KEY_TAG = "dagster/run_key"  # (the tag Dagster puts on a run a sensor requested)

K = dg.AssetKey


def _defs(db):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))


def _tick(defs, instance, cursor, sensor="src_changes"):
    """One tick, then its runs as the daemon runs them: a run key used before is skipped.
    (the tick's result, the runs' results, the next cursor)"""
    data = evaluate_sensor(defs.get_repository_def().get_sensor_def(sensor), instance=instance, cursor=cursor,
                           definitions=defs, resources=defs.resources)
    apply_partition_requests(instance, data)
    runs = []
    for run in data.run_requests or []:
        if instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run.run_key})):
            continue
        job = defs.resolve_job_def(job_name(run.tags[TAG_LINEAGE]))
        runs.append(job.execute_in_process(instance=instance, asset_selection=run.asset_selection,
                                           tags={**run.tags, RUN_KEY_TAG: run.run_key}, raise_on_error=False))
    return data, runs, data.cursor if data.cursor is not None else cursor


def _statuses(defs, instance, key: dg.AssetKey, table: str = "src") -> dict[str, str]:
    """Each partition's status as the UI shows it (FRESH, STALE, MISSING)."""
    from dagster._utils.test.data_versions import get_stale_status_resolver

    repo = defs.get_repository_def()
    assets = list({id(a): a for a in repo.assets_defs_by_key.values()}.values())
    for k in repo.asset_graph.get_all_asset_keys():  # (the source assets too)
        a = defs.get_assets_def(k)
        if all(a is not e for e in assets):
            assets.append(a)
    resolver = get_stale_status_resolver(instance, assets)
    parts = instance.get_dynamic_partitions(partitions_def_name(table))
    if os.environ.get("MV_DEBUG_STALE"):
        print({p: [str(c) for c in resolver.get_stale_root_causes(key, p)] for p in parts})
    return {p: resolver.get_status(key, p).value for p in parts}


FAIL = {"flag": ""}


@mv.udf
def fragile(x: int) -> int:
    if FAIL["flag"] and os.path.exists(FAIL["flag"]) and x >= 100:
        raise RuntimeError("the model server is down")
    return 2 * x


def test_a_failed_sensor_run_is_requested_again_and_a_second_failure_waits(tmp_path, monkeypatch):
    """A sensor run that failed (a UDF raising, on_error fail) is requested
    again at the next tick, under a run key of its own (the daemon never
    launches a key twice), naming the failed run's partitions; failing again,
    its next retry waits the sensor's interval (doubling with each failure in
    a row) and the tick says so. Once it succeeds the partitions are fresh."""
    monkeypatch.setitem(FAIL, "flag", str(tmp_path / "down"))
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(4)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "x": "x", "y": fragile}))
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        _, runs, cursor = _tick(defs, instance, None)
        assert [r.success for r in runs] == [True]
        (tmp_path / "down").touch()
        src.add([{"id": 100, "x": 100}])
        first, runs, cursor = _tick(defs, instance, cursor)
        assert [r.success for r in runs] == [False]
        (failed_key,) = [r.run_key for r in first.run_requests]
        # still down: the retry is requested at once, under its own key, and fails too
        retry, runs, cursor = _tick(defs, instance, cursor)
        assert [r.run_key for r in retry.run_requests] == [f"{failed_key}~retry1"]
        assert retry.run_requests[0].tags["dagster/asset_partition_range_end"] == "1"  # the new fragment's
        assert [r.success for r in runs] == [False]
        # the second retry waits (30 s: the sensor's interval) and the tick says why nothing runs
        waiting, runs, cursor = _tick(defs, instance, cursor)
        assert not waiting.run_requests and runs == []
        assert f"the last run ({failed_key}~retry1) failed" in waiting.skip_message
        still, runs, cursor = _tick(defs, instance, cursor)  # (an idle tick meanwhile: it says the same)
        assert not still.run_requests and runs == [] and still.skip_message == waiting.skip_message
        assert db.open_view("v").status().load_state == "FAILED_LOAD"
        # the outage is over; once the wait has passed the retry runs and the view is current
        os.remove(tmp_path / "down")
        monkeypatch.setattr(sensors, "_now", lambda: time.time() + 31)
        again, runs, cursor = _tick(defs, instance, cursor)
        assert [r.run_key for r in again.run_requests] == [f"{failed_key}~retry2"] and [r.success for r in runs] == [True]
        assert db.open_view("v").status().load_state == "LOADED"
        assert _statuses(defs, instance, K(["v"])) == {"0": "FRESH", "1": "FRESH"}
        for _ in range(2):  # (a full look: the view moved; then idle)
            idle, runs, cursor = _tick(defs, instance, cursor)
            assert not idle.run_requests and runs == []
        assert "no view below it changed" in idle.skip_message
        assert "run" not in json.loads(cursor)  # (its outcome known: idle ticks look up no run)
    assert actual_view(db.open_view("v")) == expected_view(
        src.uri, src.version, lambda r: True, lambda r: {"id": r["id"], "x": r["x"], "y": 2 * r["x"]})


def test_a_refresh_made_outside_dagster_is_recorded_by_the_next_tick(tmp_path):
    """Rows appended and deleted, the view refreshed from Python: the next
    tick records the partitions it changed (none is left MISSING or STALE
    while the view holds their rows), and the asset's row count is the
    view's; the tick after requests nothing."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": fragile}))
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        _, _, cursor = _tick(defs, instance, None)
        src.add([{"id": i, "x": i} for i in range(5, 12)])
        src.delete("id = 0")
        db.refresh("v")
        data, runs, cursor = _tick(defs, instance, cursor)
        assert [r.success for r in runs] == [True]
        assert _statuses(defs, instance, K(["v"])) == {"0": "FRESH", "1": "FRESH"}
        latest = instance.fetch_materializations(K(["v"]), limit=1).records[0].asset_materialization
        assert latest.metadata["dagster/row_count"].value == 11
        data, runs, cursor = _tick(defs, instance, cursor)
        assert not data.run_requests and runs == []


def test_a_view_over_a_view_run_records_the_upstream_partitions_it_brought_along(tmp_path):
    """Materializing one partition of a view over a view refreshes its
    upstream whole (it never fails for being behind): the next tick records
    the upstream's partitions it changed and the derived view's others."""
    db = small_catalog(tmp_path / "cat")
    defs = _defs(db)
    src = db.open_table("src")
    with dg.instance_for_test() as instance:
        _, _, cursor = _tick(defs, instance, None)
        src.delete("id = 5")  # fragment 0
        src.add([{"id": 50, "x": 50}])  # a new fragment
        # the sensor adds the new partition (its run refreshes too); then a click on w's partition 0 alone
        data = evaluate_sensor(defs.get_repository_def().get_sensor_def("src_changes"), instance=instance,
                               cursor=cursor, definitions=defs, resources=defs.resources)
        apply_partition_requests(instance, data)
        cursor = data.cursor
        done = defs.resolve_job_def(job_name("src")).execute_in_process(
            instance=instance, asset_selection=[K(["w"])], partition_key="0")
        assert done.success
        assert db.open_view("v").source_version == src.version
        data, runs, cursor = _tick(defs, instance, cursor)
        assert [r.success for r in runs] == [True]
        for key in (K(["v"]), K(["v", "y"]), K(["w"])):
            assert set(_statuses(defs, instance, key).values()) == {"FRESH"}, key
    expect = expected_view(src.uri, src.version, lambda r: r["x"] != 3, lambda r: {"id": r["id"], "x": r["x"], "y": 2 * r["x"]})
    assert actual_view(db.open_view("v")) == expect


def test_a_view_over_a_view_run_succeeds_when_a_write_lands_after_its_upstream_is_brought_along(tmp_path,
                                                                                                  monkeypatch):
    """A run of w (over v over src) brings v up first; a source write
    landing between v's refresh and w's (an ingest job writing all along)
    failed the run with SourceBehindError. w reflects v as refreshed; the
    write is the next run's."""
    db = small_catalog(tmp_path / "cat")
    defs = _defs(db)
    src = db.open_table("src")
    real = mv.MaterializedView.refresh

    def refresh_then_a_write_lands(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        if self.name == "v":
            mv.connect(db.uri, runner=mv.InlineRunner()).open_table("src").add([{"id": 77, "x": 77}])
        return result

    with dg.instance_for_test() as instance:
        _, _, cursor = _tick(defs, instance, None)
        src.add([{"id": 50, "x": 50}])
        monkeypatch.setattr(mv.MaterializedView, "refresh", refresh_then_a_write_lands)
        done = defs.resolve_job_def(job_name("src")).execute_in_process(
            instance=instance, asset_selection=[K(["w"])], partition_key="0", raise_on_error=False)
        monkeypatch.undo()
        assert done.success
        v = db.open_view("v")
        assert v.source_version == src.version - 1  # the write landed after it
        assert sorted(db.open_view("w").to_arrow().column("id").to_pylist()) == [4, 5, 6, 7, 8, 9, 50]


def _join_catalog(tmp_path):
    """docs (4 rows) joined with authors (2) on aid: the view j (id, authors.name)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    authors = db.create_table("authors", [{"aid": i, "name": f"n{i}"} for i in range(2)], primary_key="aid")
    docs = db.create_table("docs", [{"id": i, "aid": i % 2} for i in range(4)], primary_key="id")
    db.create_materialized_view("j", docs.search(None).join(authors, on="aid").select(
        {"id": "id", "name": "authors.name"}))
    return db, docs, authors


@pytest.mark.parametrize("first", ["docs_changes", "authors_changes"])
def test_a_join_view_refreshed_by_one_sources_sensor_is_recorded_whole(tmp_path, first):
    """Both sources of a join view move before the next ticks; whichever
    sensor ticks first refreshes the view whole: the partitions the other
    change reached are recorded too (none stays STALE or MISSING)."""
    db, docs, authors = _join_catalog(tmp_path)
    defs = _defs(db)
    sensors = ["docs_changes", "authors_changes"]
    with dg.instance_for_test() as instance:
        cursors = {}
        for name in sensors:
            _, _, cursors[name] = _tick(defs, instance, None, name)
        docs.add([{"id": 10, "aid": 0}])
        authors.update(where="aid = 1", values={"name": "renamed"})
        for name in ([first] + [s for s in sensors if s != first]) * 2:
            _, runs, cursors[name] = _tick(defs, instance, cursors[name], name)
            assert all(r.success for r in runs)
        assert set(_statuses(defs, instance, K(["j"]), "docs").values()) == {"FRESH"}
        assert sorted(_statuses(defs, instance, K(["j"]), "docs")) == ["0", "1"]
    rows = sorted((r["id"], r["name"]) for r in db.open_table("j").to_arrow().to_pylist())
    assert rows == [(0, "n0"), (1, "renamed"), (2, "n0"), (3, "renamed"), (10, "n0")]
    assert lance.dataset(docs.uri).version == db.open_view("j").source_versions["docs"]


def test_the_full_checks_of_a_plain_view_catch_a_value_another_tool_wrote(tmp_path):
    """Another tool rewrites a copied column of a plain view's row: the full
    checks job (the daily schedule's, every row) fails `values_match_source`
    on it, as the engine's own check() does; the other checks look at keys."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "x": "x", "y": fragile}))
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        _tick(defs, instance, None)
        full = defs.resolve_job_def("full_checks_src").execute_in_process(instance=instance)
        assert {e.check_name: e.passed for e in full.get_asset_check_evaluations()} == {
            "matches_source_query": True, "no_orphan_rows": True, "values_match_source": True,
            "udf_values_present": True}
        lance.dataset(db.open_table("v").uri).update({"x": "-1"}, where="id = 4")
        full = defs.resolve_job_def("full_checks_src").execute_in_process(instance=instance, raise_on_error=False)
        verdicts = {e.check_name: e for e in full.get_asset_check_evaluations()}
        assert not verdicts["values_match_source"].passed
        assert verdicts["values_match_source"].metadata["rows_written_outside_refreshes"].value == 1
        assert [o.passed for o in db.open_view("v").check() if o.name == "values_match_source"] == [False]


def test_a_partition_of_a_fragment_gone_is_refused_and_a_mistyped_catalog_creates_nothing(tmp_path):
    """A click on a partition whose fragment a compaction merged away (the
    sensor has not retired it yet) fails saying so, and records nothing;
    definitions of a catalog path that does not exist fail to load saying
    so, and create no directory there."""
    from mv_assets.model.errors import CatalogNotFoundError

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(5, 10)])
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": fragile}))
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        _tick(defs, instance, None)
        src.optimize()
        assert "0" in instance.get_dynamic_partitions(partitions_def_name("src"))  # (not retired yet)
        before = len(instance.fetch_materializations(K(["v"]), limit=100).records)
        done = defs.resolve_job_def(job_name("src")).execute_in_process(
            instance=instance, asset_selection=[K(["v"])], partition_key="0", raise_on_error=False)
        assert not done.success
        (failure,) = [e for e in done.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "fragments 'src' no longer has" in failure.event_specific_data.error.message
        assert len(instance.fetch_materializations(K(["v"]), limit=100).records) == before
    missing = tmp_path / "no" / "such_catalog"
    with pytest.raises(CatalogNotFoundError, match="no mv_assets catalog at"):
        build_definitions(str(missing))
    assert not missing.exists() and not missing.parent.exists()


def test_recording_never_refreshes_a_view_its_policy_leaves_behind(tmp_path):
    """A manual view over an eager one, refreshed by hand: its partitions are
    recorded as it holds them; a later append refreshes the eager view, and
    the sensor's runs leave the manual view as it was (they refreshed it with
    the recording of its new partition: against its policy)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(4)], primary_key="id")
    db.create_materialized_view("e", src.search(None).select(["id", "x"]))
    db.create_materialized_view("wm", db.open_table("e").search(None).select(["id", "x"]),
                                refresh_policy=mv.RefreshPolicy.manual())
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        _, _, cursor = _tick(defs, instance, None)
        db.refresh("wm")
        data, runs, cursor = _tick(defs, instance, cursor)
        assert [r.run_key.split(":", 1)[1].startswith(";recorded:") for r in data.run_requests] == [True]
        assert data.run_requests[0].tags["mv_assets/record_only"] == "wm"
        held = db.open_view("wm").refresh_state().load_number
        src.add([{"id": 100, "x": 100}])
        for _ in range(3):
            data, runs, cursor = _tick(defs, instance, cursor)
            assert all(r.success for r in runs)
            assert all(K(["wm"]) not in r.asset_selection for r in data.run_requests)
        assert db.open_view("wm").refresh_state().load_number == held
        assert 100 not in db.open_table("wm").to_arrow().column("id").to_pylist()
        assert 100 in db.open_table("e").to_arrow().column("id").to_pylist()


def test_a_join_view_refreshed_twice_outside_dagster_is_recorded_twice(tmp_path):
    """A joined source changes and the join view is refreshed from Python,
    twice: each time the next tick records its partitions (the second run
    had the first one's key, and the daemon never launched it)."""
    db, docs, authors = _join_catalog(tmp_path)
    defs = _defs(db)
    with dg.instance_for_test() as instance:
        cursors = {n: _tick(defs, instance, None, n)[2] for n in ("docs_changes", "authors_changes")}
        for round_ in range(2):
            authors.update(where="aid = 1", values={"name": f"renamed{round_}"})
            db.refresh("j")
            for name in ("docs_changes", "authors_changes"):
                _, runs, cursors[name] = _tick(defs, instance, cursors[name], name)
                assert all(r.success for r in runs)
            assert set(_statuses(defs, instance, K(["j"]), "docs").values()) == {"FRESH"}, round_
