"""Refreshes through Dagster Pipes: ``python -m mv_assets.pipes`` launched by
``dagster.PipesSubprocessClient`` (an asset of one's own, and the catalog's
assets with ``build_definitions(pipes_client=...)``), on a real instance."""

import os
import subprocess

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType  # not exported by dagster
from dagster_helpers import run_log, run_requested, small_catalog

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, PipesLauncher, build_definitions, view_pipes_extras
from mv_assets.dagster.assets import CHECK_NAMES
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.dagster.pipes_client import as_pipes_launcher, pipes_command

K = dg.AssetKey


def _view_asset(uri: str, pdef=None, checks=(), **extras):
    """An asset of one's own for view ``v``, refreshed by ``python -m
    mv_assets.pipes`` in a subprocess (``extras``: what it is sent instead
    of :func:`view_pipes_extras`')."""

    @dg.asset(name="v", partitions_def=pdef, check_specs=[dg.AssetCheckSpec(n, asset="v") for n in checks])
    def v(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient):
        sent = extras or view_pipes_extras(context, uri, "v", runner="inline")
        yield from pipes.run(context=context, command=pipes_command(), extras=sent).get_results()

    return v


def _materialize(asset, instance, **kwargs):
    return dg.materialize([asset], instance=instance, resources={"pipes": dg.PipesSubprocessClient()}, **kwargs)


def _metadata(instance, key, partition=None) -> dict:
    event = instance.get_latest_materialization_event(key) if partition is None else next(
        r.event_log_entry for r in instance.fetch_materializations(key, limit=100).records
        if r.partition_key == partition)
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def _pipes_error(instance, run_id) -> str:
    """The error the Pipes process closed its session with, as the run shows it."""
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
        event = record.event_log_entry.dagster_event
        if event.message == "[pipes] external process pipes closed with exception":
            return event.engine_event_data.error.message
    raise AssertionError("no Pipes session closed with an exception")


def _step_failure(result) -> str:
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    data = failure.step_failure_data
    return data.user_failure_data.description if data.user_failure_data else data.error.message


def test_a_pipes_process_refreshes_the_whole_view_and_reports_its_numbers_and_checks(tmp_path):
    db = small_catalog(tmp_path / "cat")
    asset = _view_asset(db.uri, checks=CHECK_NAMES)
    with dg.instance_for_test() as instance:
        result = _materialize(asset, instance)
        assert result.success
        view = db.open_view("v")
        rows = sorted((r["id"], r["y"]) for r in view.to_arrow().to_pylist())
        assert rows == [(x, 2 * x) for x in range(10) if x != 3]
        md = _metadata(instance, K("v"))
        assert md["dagster/row_count"] == 9 and md["run_rows_inserted"] == 9 and md["run_rows_computed"] == 9
        assert (md["run_rows_updated"], md["run_rows_deleted"]) == (0, 0)
        assert md["run_udf_rows_computed"] == {"y": 9}
        assert (md["source_version"], md["view_version"]) == (db.open_table("src").version, view.version)
        assert md["runner"] == "inline" and md["scope"] == "changes since the last refresh"
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert set(checks) == set(CHECK_NAMES) and all(c.passed for c in checks.values())
        assert "equal the view query over the source" in checks["matches_source_query"].metadata["description"].value
        # again: nothing to do, nothing written
        assert _materialize(asset, instance).success
        assert db.open_view("v").version == view.version
        assert _metadata(instance, K("v"))["run_rows_inserted"] == 0


def test_a_pipes_process_refreshes_the_source_fragment_its_partition_names(tmp_path):
    db = small_catalog(tmp_path / "cat")
    frags = db.open_table("src").fragment_ids()
    pdef = dg.DynamicPartitionsDefinition(name="src_fragments")
    # no "fragments" sent: the launching asset's partition key names the fragment
    asset = _view_asset(db.uri, pdef, catalog=db.uri, view="v", runner="inline")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("src_fragments", [str(f) for f in frags])
        assert _materialize(asset, instance, partition_key=str(frags[1])).success
        assert sorted(r["id"] for r in db.open_view("v").to_arrow().to_pylist()) == [6, 7, 8, 9]
        md = _metadata(instance, K("v"), str(frags[1]))
        assert md["source_fragment"] == frags[1] and md["scope"] == "selected fragments"
        assert md["rows_computed"] == md["partition_row_count"] == md["dagster/row_count"] == 4
        assert md["run_udf_rows_computed"] == {"y": 4}


def test_a_udf_error_fails_the_pipes_session_with_its_message_and_writes_nothing(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")

    @mv.udf
    def fragile(x: int) -> int:
        if x == 4:
            raise ValueError("fragile cannot take 4")
        return x

    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": fragile}))
    before = db.open_view("v").version
    with dg.instance_for_test() as instance:
        # an asset of one's own: the run shows the error the Pipes process closed with
        result = _materialize(_view_asset(db.uri), instance, raise_on_error=False)
        assert not result.success
        error = _pipes_error(instance, result.run_id)
        assert "UdfError" in error and "fragile cannot take 4" in error and "'y'" in error
        assert db.open_view("v").version == before
        # the catalog's assets: the step fails with the engine's sentence
        defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                                 pipes_client=dg.PipesSubprocessClient())
        job = defs.resolve_job_def("refresh_src")
        instance.add_dynamic_partitions(partitions_def_name("src"), [str(f) for f in src.fragment_ids()])
        run = job.execute_in_process(instance=instance, partition_key=str(src.fragment_ids()[0]),
                                     raise_on_error=False)
        assert not run.success
        failure = _step_failure(run)
        # (the engine's sentence, as in process: no class name, bare or with its module's, before it)
        assert "fragile cannot take 4" in failure and failure.startswith("UDF 'fragile'"), failure
        assert db.open_view("v").version == before


def test_bad_extras_fail_naming_what_is_missing_and_write_nothing(tmp_path):
    db = small_catalog(tmp_path / "cat")
    before = db.open_view("v").version
    missing = tmp_path / "nowhere"
    cases = [
        ({"view": "v"}, "the Pipes extras lack 'catalog' (the catalog URI)"),
        ({"catalog": db.uri}, "the Pipes extras lack 'view' (the view to refresh)"),
        ({"catalog": db.uri, "view": "nope", "runner": "inline"}, "no view 'nope' in the catalog"),
        ({"catalog": db.uri, "view": "src", "runner": "inline"}, "'src' in the catalog at"),
        ({"catalog": str(missing), "view": "v", "runner": "inline"},
         "the Pipes extra 'catalog' names no catalog: no catalog at"),
        ({"catalog": db.uri, "view": "v", "runner": "ray"}, "'runner' must be 'spark' or 'inline'"),
    ]
    with dg.instance_for_test() as instance:
        for extras, message in cases:
            result = _materialize(_view_asset(db.uri, **extras), instance, raise_on_error=False)
            assert not result.success
            assert message in _pipes_error(instance, result.run_id), extras
    assert db.open_view("v").version == before
    assert not missing.exists()


def test_launched_outside_dagster_it_says_so_and_it_never_imports_dagster():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    out = subprocess.run(pipes_command(), capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "launch this through a Dagster Pipes client" in out.stderr
    code = "import sys, mv_assets.pipes; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    imported = subprocess.run([pipes_command()[0], "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_pipes_clients_that_need_their_own_arguments_are_given_as_a_function():
    class Elsewhere(dg.PipesClient):
        def run(self, *, context, extras=None, **kwargs):  # pragma: no cover - never launched
            raise NotImplementedError

    with pytest.raises(TypeError, match="pass a function launch"):
        as_pipes_launcher(Elsewhere())
    with pytest.raises(TypeError, match="pipes_client must be"):
        as_pipes_launcher(42)
    launcher = as_pipes_launcher(lambda context, extras: None)
    assert isinstance(launcher, PipesLauncher) and launcher.extras == {}


def test_a_pyspark_resources_spark_config_reaches_the_pipes_process(tmp_path):
    """build_definitions(pyspark=, pipes_client=): the Pipes process builds its
    Spark from the resource's spark_config (where it runs, and the rest as
    spark_conf); it was dropped, and the process ran local[*] without the
    user's settings (their executorEnv never reached the UDFs)."""
    from dagster_pyspark import LazyPySparkResource

    from mv_assets.dagster.pipes_client import resource_extras

    config = {"spark.master": "local[1]", "spark": {"executorEnv": {"MV_MARK": "x"}}, "spark.app.name": "mine"}
    extras = resource_extras(MvAssetsResource(catalog_uri=str(tmp_path), runner="spark",
                                              pyspark=LazyPySparkResource(spark_config=config)))
    assert extras["spark_master"] == "local[1]" and "spark_remote" not in extras
    assert extras["spark_conf"] == {"spark.executorEnv.MV_MARK": "x", "spark.app.name": "mine"}
    remote = resource_extras(MvAssetsResource(catalog_uri=str(tmp_path), runner="spark", pyspark=LazyPySparkResource(
        spark_config={"spark.remote": "sc://127.0.0.1:15002"})))
    assert remote["spark_remote"] == "sc://127.0.0.1:15002" and "spark_master" not in remote
    assert "spark_conf" not in resource_extras(MvAssetsResource(catalog_uri=str(tmp_path), runner="inline"))


def _records(instance, keys, partitions) -> dict:
    """Each asset's and partition's latest materialization: its metadata (the
    duration left out) and its version tags (event pointers left out: storage
    ids of another instance)."""
    out = {}
    for key in keys:
        for p in partitions:
            records = [r for r in instance.fetch_materializations(key, limit=100).records if r.partition_key == p]
            if not records:
                continue
            mat = records[0].asset_materialization
            md = {k: v.value for k, v in mat.metadata.items() if k != "run_duration_s"}
            tags = {k: v for k, v in (mat.tags or {}).items() if "input_event_pointer" not in k}
            out[(key, p)] = (md, tags)
    return out


def _checks(result) -> dict:
    """A run's check evaluations: passed, description, metadata."""
    return {(c.asset_key, c.check_name): (c.passed, c.description, {k: v.value for k, v in c.metadata.items()})
            for c in result.get_asset_check_evaluations()}


def test_the_catalog_assets_through_pipes_record_what_in_process_runs_record(tmp_path):
    """The sensor's first run (the whole lineage: v, its UDF column, w over v,
    their checks), then one partition of v: through a PipesSubprocessClient
    and in process, on two copies of one catalog, the same rows, the same
    materializations (metadata, data versions, inputs) and the same checks."""
    dbs = {how: small_catalog(tmp_path / how) for how in ("pipes", "in_process")}
    keys = [K(["v"]), K(["v", "y"]), K(["w"])]
    seen = {}
    for how, db in dbs.items():
        resource = MvAssetsResource(catalog_uri=db.uri, runner="inline")
        client = dg.PipesSubprocessClient() if how == "pipes" else None
        defs = build_definitions(db, resource=resource, pipes_client=client)
        sensor = defs.get_repository_def().get_sensor_def("src_changes")
        with dg.instance_for_test() as instance:
            with dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources) as ctx:
                tick = sensor.evaluate_tick(ctx)
            (run,) = run_requested(defs, instance, tick)
            checks = _checks(run)
            launched = any("[pipes] external process successfully opened" in m for m in run_log(instance, run))
            assert launched == (how == "pipes")
            frags = [str(f) for f in db.open_table("src").fragment_ids()]
            db.open_table("src").delete("id = 8")
            v_asset = defs.get_repository_def().assets_defs_by_key[K(["v"])]
            one = dg.materialize([v_asset], instance=instance, partition_key=frags[1],
                                 selection=[K(["v"]), K(["v", "y"])])
            assert one.success
            checks.update(_checks(one))
            rows = {n: sorted(map(str, db.open_table(n).to_arrow().to_pylist())) for n in ("v", "w")}
            seen[how] = (rows, checks, _records(instance, keys, frags))
    assert seen["pipes"] == seen["in_process"]
    rows, checks, records = seen["pipes"]
    assert len(checks) == 2 * len(CHECK_NAMES) and all(passed for passed, _, _ in checks.values())
    md, tags = records[(K(["v"]), frags[1])]
    assert md["rows_computed"] == 0 and md["run_rows_deleted"] == 1 and md["partition_row_count"] == 3
    assert tags["dagster/data_version"].startswith("v")


def test_a_pipes_launch_that_reports_no_refresh_fails_the_step(tmp_path):
    """A launch that exits 0 without running mv_assets.pipes (a cluster job
    with another entry point): the step fails saying nothing reported a
    refresh, and no materialization is recorded (the run succeeded and
    recorded v materialized, with no source version, the view never refreshed)."""
    import sys

    db = small_catalog(tmp_path / "cat")
    client = dg.PipesSubprocessClient()
    noop = "from dagster_pipes import open_dagster_pipes\nwith open_dagster_pipes() as p: p.log.info('not mv_assets')"
    launcher = PipesLauncher(lambda context, extras: client.run(
        context=context, command=[sys.executable, "-c", noop], extras=extras))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), pipes_client=launcher)
    v_asset = defs.get_repository_def().assets_defs_by_key[K(["v"])]
    frags = [str(f) for f in db.open_table("src").fragment_ids()]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        result = dg.materialize([v_asset], instance=instance, partition_key=frags[0], selection=[K(["v"])],
                                raise_on_error=False)
        assert not result.success
        assert "ended without reporting a refresh" in _step_failure(result)
        assert instance.get_latest_materialization_event(K(["v"])) is None
    assert not db.open_view("v").refresh_state().refreshed


@pytest.mark.spark
def test_the_catalog_assets_through_pipes_on_a_standalone_spark_cluster(tmp_path):
    """The run process starts no Spark: the Pipes process refreshes on a
    standalone master and worker on loopback (runner "spark", sent as extras)."""
    from spark_cluster import StandaloneCluster

    db = small_catalog(tmp_path / "cat")
    cluster = StandaloneCluster(str(tmp_path / "spark"), workers=1, cores=1, memory="1g")
    try:
        client = dg.PipesSubprocessClient(env={
            "MV_ASSETS_SPARK_DRIVER_HOST": "127.0.0.1", "MV_ASSETS_SPARK_BIND_ADDRESS": "127.0.0.1",
            "MV_ASSETS_SPARK_RESOURCE_WAIT": "120",
        })
        launcher = PipesLauncher.subprocess(client, extras={
            "runner": "spark", "spark_master": cluster.master_url, "local_below_rows": 0,
            "spark_conf": {"spark.executor.memory": "512m", "spark.cores.max": "1"},
        })
        defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                                 pipes_client=launcher)
        with dg.instance_for_test() as instance:
            frags = [str(f) for f in db.open_table("src").fragment_ids()]
            instance.add_dynamic_partitions(partitions_def_name("src"), frags)
            job = defs.resolve_job_def("refresh_src")
            run = job.execute_in_process(instance=instance, tags={
                "dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]})
            assert run.success
            assert all(c.passed for c in run.get_asset_check_evaluations())
            rows = sorted((r["id"], r["y"]) for r in db.open_view("v").to_arrow().to_pylist())
            assert rows == [(x, 2 * x) for x in range(10) if x != 3]
            assert sorted(r["id"] for r in db.open_view("w").to_arrow().to_pylist()) == [x for x in range(10)
                                                                                       if x not in (3,) and 2 * x > 4]
            md = _metadata(instance, K(["v"]), frags[0])
            assert md["runner"] == "spark" and md["run_rows_inserted"] == 9
    finally:
        cluster.stop()


def test_a_udf_column_materialized_alone_through_pipes_is_recorded_as_in_process(tmp_path):
    """Only the UDF column's asset (v/y) of one partition, through a
    PipesSubprocessClient and in process: both succeed with one v/y
    materialization and the same rows. Through Pipes the run failed ("Invalid
    asset key. Expected one of ['v/y'], got 'v'": the Pipes process reported
    for the view's key, not selected) after the column was committed."""
    seen = {}
    for how in ("pipes", "in_process"):
        db = small_catalog(tmp_path / how)
        db.open_table("v").refresh()
        client = dg.PipesSubprocessClient() if how == "pipes" else None
        defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                                 pipes_client=client, sensors_running=False)
        frags = [str(f) for f in db.open_table("src").fragment_ids()]
        db.open_table("src").update(where="id = 7", values={"x": 70})
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(partitions_def_name("src"), frags)
            v_asset = defs.get_repository_def().assets_defs_by_key[K(["v"])]
            run = dg.materialize([v_asset], instance=instance, partition_key=frags[1], selection=[K(["v", "y"])],
                                 raise_on_error=False)
            assert run.success, _step_failure(run)
            launched = any("[pipes] external process successfully opened" in m for m in run_log(instance, run))
            assert launched == (how == "pipes")
            mats = sorted((e.asset_key.to_user_string(), e.partition) for e in run.all_events
                          if e.is_step_materialization)
            assert ("v/y", frags[1]) in mats  # (and v's partition: its rows moved to the new source version)
            seen[how] = (mats, sorted(map(str, db.open_table("v").to_arrow().to_pylist())))
    assert seen["pipes"] == seen["in_process"]


@pytest.mark.parametrize("how", ["in_process", "pipes"])
def test_rows_a_skipping_udf_failed_on_are_not_computed_again_by_every_run(tmp_path, call_log, how):
    """A UDF with on_error="skip" failing on one row: the first run computes
    each row once; later runs (nothing changed) call nothing, commit nothing
    and say so. Every run called the UDF on the failed row again, committed a
    view version, added an error record and labelled the column's
    materialization "the UDF code changed" (the failed row counted as a row
    computed by other code)."""
    from oracle import record_call

    @mv.udf(on_error="skip")
    def inverse(x: int) -> float:
        record_call(call_log, "inverse", x)
        return 1.0 / (x - 3)

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(10)], primary_key="id")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": inverse}))
    client = dg.PipesSubprocessClient() if how == "pipes" else None
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), pipes_client=client,
                             sensors_running=False)
    frag = str(src.fragment_ids()[0])
    seen = []
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(partitions_def_name("src"), [frag])
        job = defs.resolve_job_def("refresh_src")
        for _ in range(3):
            assert job.execute_in_process(instance=instance, partition_key=frag).success
            scope = _metadata(instance, K(["v", "y"]), frag)["scope"]
            calls = sorted(int(v) for f in os.listdir(call_log) for v in open(os.path.join(call_log, f)).read().split())
            for f in os.listdir(call_log):
                os.remove(os.path.join(call_log, f))
            seen.append((calls, db.open_table("v").version, len(db.open_table("v").get_errors()), scope))
    first = seen[0]
    assert first[0] == list(range(10)) and first[2] == 1
    assert seen[1:] == [([], first[1], 1, "nothing to compute: every row is current")] * 2


def test_a_partitions_refresh_is_told_once_and_in_the_same_words_through_pipes(tmp_path):
    """Through Pipes and in process, the run's log says what a partition's
    refresh did in one line, the same words (the time aside); a run again
    with nothing to do says so. Through Pipes the line came twice (the
    process's and the step's, differing), and the re-run's read "first
    refresh ... +0" and "source vNone -> v4 changed nothing it reads"."""
    import re

    seen = {}
    for how in ("pipes", "in_process"):
        db = small_catalog(tmp_path / how)
        client = dg.PipesSubprocessClient() if how == "pipes" else None
        defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"),
                                 pipes_client=client, sensors_running=False)
        frag = str(db.open_table("src").fragment_ids()[1])
        lines = []
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(partitions_def_name("src"), [str(f) for f in db.open_table("src").fragment_ids()])
            job = defs.resolve_job_def("refresh_src")
            for _ in range(2):
                run = job.execute_in_process(instance=instance, partition_key=frag)
                told = [re.sub(r" in \d+\.\d+s$", "", m) for m in run_log(instance, run)
                        if m.startswith("v: ") and not m.startswith("v: refresh")]
                lines.append(told)
        seen[how] = lines
    assert seen["pipes"] == seen["in_process"]
    first, again = seen["pipes"]
    assert len(first) == 1 and first[0].startswith("v: first refresh, at source v") and "rows +4 " in first[0]
    assert len(again) == 1 and again[0].startswith("v: nothing to ") and "None" not in again[0]
