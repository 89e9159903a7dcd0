"""A Dagster project's own dagster-pyspark resource runs the refreshes:
``build_definitions(..., pyspark=LazyPySparkResource(spark_config=...))``
materializes views on the Spark that resource configures (its
``spark.executorEnv.*`` reaching the Python workers that run the UDFs), a run
with nothing to refresh never asks it for a session (no JVM), a Spark Connect
session from it works too, and anything else is refused."""

import json
import os
import subprocess
import sys

import dagster as dg
import lance
import pyarrow as pa
import pytest
from dagster_pyspark import LazyPySparkResource, PySparkResource, lazy_pyspark_resource

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.dagster.spark_session import PySparkResourceRunner, flat_spark_config

K = dg.AssetKey
MARK = "MV_TEST_MARK"


@mv.udf(data_type=pa.string())
def marked(x: int) -> str:
    """Where it runs, as it sees it: the variable the resource's spark_config sets on executors."""
    import os as _os

    from pyspark import TaskContext

    return f"{x}:{_os.environ.get('MV_TEST_MARK')}:{'task' if TaskContext.get() is not None else 'driver'}"


def _catalog(path) -> mv.Connection:
    """src (two fragments) -> v (x != 3, mark = marked(x)); created inline (no JVM)."""
    db = mv.connect(str(path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    db.create_materialized_view("v", src.search(None).where("x != 3").select({"id": "id", "x": "x", "mark": marked}))
    return db


def _materialize_all(defs, instance, db) -> dg.ExecuteInProcessResult:
    """The UI's "Materialize all" over every fragment of src: one run, the whole lineage."""
    frags = [str(f.fragment_id) for f in lance.dataset(db.open_table("src").uri).get_fragments()]
    instance.add_dynamic_partitions(partitions_def_name("src"), frags)
    whole = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    repo = defs.get_repository_def()
    return dg.materialize([repo.assets_defs_by_key[K(["v"])]], instance=instance, tags=whole)  # resources bound


def _view_rows(db) -> dict[int, tuple]:
    return {r["id"]: (r["x"], r["mark"]) for r in db.open_table("v").to_arrow().to_pylist()}


def _no_spark_running() -> bool:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    return SparkContext._active_spark_context is None and SparkSession.getActiveSession() is None


@pytest.fixture
def no_spark():
    """No classic Spark session in this process before the test (a JVM started
    by an earlier test would keep its static settings: Spark has one context per
    process), and none left after it."""
    from pyspark.sql import SparkSession

    for _ in range(2):
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    assert _no_spark_running()
    yield
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.mark.spark
def test_a_lazy_pyspark_resource_runs_the_refreshes_on_the_spark_it_configures(tmp_path, monkeypatch, no_spark):
    """The user's LazyPySparkResource, handed to build_definitions: the run's
    refresh is a Spark job on its session (local[1], as its spark_config
    says), whose Python workers see the spark.executorEnv it sets (the driver
    does not have the variable), and the view equals its query over the source."""
    db = _catalog(tmp_path / "cat")
    monkeypatch.delenv(MARK, raising=False)
    monkeypatch.setenv("MV_ASSETS_LOCAL_BELOW_ROWS", "0")  # always a Spark job, never the driver
    monkeypatch.setenv("MV_ASSETS_SPARK_MASTER", "local[2]")  # not read: the resource says where Spark runs
    pyspark = LazyPySparkResource(spark_config={
        "spark.master": "local[1]",
        "spark.app.name": "mv_assets_pyspark_test",
        "spark.executorEnv.MV_TEST_MARK": "x",
        "spark.ui.enabled": False,
    })
    defs = build_definitions(db, pyspark=pyspark)
    resource = defs.resources["mv_assets"]
    assert isinstance(resource, MvAssetsResource) and resource.pyspark is pyspark
    seen: list = []
    real_build = PySparkResourceRunner._build

    def build(self):  # what the run's runner got, kept while the session is alive
        session = real_build(self)
        seen.append((session.sparkContext.master, session.sparkContext.appName,
                     session.sparkContext.getConf().get("spark.executorEnv.MV_TEST_MARK"),
                     session.sparkContext.getConf().get("spark.ui.enabled"), self.parallelism(),
                     self.pyspark.spark_session is session))  # the resource's own session
        return session

    monkeypatch.setattr(PySparkResourceRunner, "_build", build)
    with dg.instance_for_test() as instance:
        out = _materialize_all(defs, instance, db)
        assert out.success
        mat = [m for m in out.asset_materializations_for_node("src_lineage") if m.asset_key == K(["v"])][-1]
        assert mat.metadata["runner"].value == "spark"  # a Spark job, not the driver
    assert seen == [("local[1]", "mv_assets_pyspark_test", "x", "false", 1, True)]
    src = db.open_table("src").to_arrow().to_pylist()
    expect = {r["id"]: (r["x"], f"{r['x']}:x:task") for r in src if r["x"] != 3}
    assert _view_rows(db) == expect and len(expect) == 9
    assert MARK not in os.environ  # only the workers had it
    assert _no_spark_running()  # the session this run started is stopped with the run


class _CountingLazy(LazyPySparkResource):
    """A LazyPySparkResource counting the times it is asked for its session."""

    def _init_session(self) -> None:
        _ASKED.append(type(self).__name__)
        super()._init_session()


_ASKED: list = []


@pytest.mark.parametrize("make", [
    lambda: _CountingLazy(spark_config={"spark.master": "local[1]"}),
    lambda: PySparkResource(spark_config={"spark.master": "local[1]"}),  # eager, taken as lazy
], ids=["lazy", "eager"])
def test_a_run_with_nothing_to_refresh_never_starts_the_resources_spark(tmp_path, monkeypatch, no_spark, make):
    """The view is already current: its run (and the sensor's tick) open the
    resources, plan, find nothing to do and finish without asking the pyspark
    resource for a session; no JVM starts. (A PySparkResource, which Dagster
    would set up with a session when the run starts, is taken as lazy.)"""
    db = _catalog(tmp_path / "cat")
    db.refresh(["v"])  # inline: current
    before = _view_rows(db)
    monkeypatch.setenv("MV_ASSETS_LOCAL_BELOW_ROWS", "0")
    _ASKED.clear()
    defs = build_definitions(db, pyspark=make())
    assert type(defs.resources["mv_assets"].pyspark).__name__ in ("_CountingLazy", "LazyPySparkResource")
    with dg.instance_for_test() as instance:
        out = _materialize_all(defs, instance, db)
        assert out.success
        mat = [m for m in out.asset_materializations_for_node("src_lineage") if m.asset_key == K(["v"])][-1]
        assert mat.metadata["rows_computed"].value == 0
        sensor = defs.get_repository_def().get_sensor_def("src_changes")
        with dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources) as ctx:
            sensor.evaluate_tick(ctx)
    assert _ASKED == [] and _no_spark_running()
    assert _view_rows(db) == before


def test_only_a_dagster_pyspark_resource_is_taken(tmp_path):
    """Anything but a PySparkResource or LazyPySparkResource is refused, saying
    what to pass; a pyspark resource and spark_master (or a resource of one's
    own with build_definitions' pyspark=) both saying where Spark runs too.
    Nothing here imports a JVM."""
    db = _catalog(tmp_path / "cat")
    spark_config = {"spark.master": "local[1]"}
    for bad in (spark_config, "local[1]", lazy_pyspark_resource, LazyPySparkResource.configure_at_launch(),
                MvAssetsResource(catalog_uri=db.uri, runner="inline")):
        with pytest.raises(TypeError, match=r"pyspark= takes a dagster-pyspark resource, "
                                            r"dagster_pyspark.LazyPySparkResource\(spark_config=\{\.\.\.\}\)"):
            MvAssetsResource(catalog_uri=db.uri, pyspark=bad)
        with pytest.raises(TypeError, match="pyspark= takes a dagster-pyspark resource"):
            build_definitions(db, pyspark=bad)
    with pytest.raises(ValueError, match="spark_master and pyspark= both say where Spark runs"):
        MvAssetsResource(catalog_uri=db.uri, spark_master="local[2]", pyspark=LazyPySparkResource(spark_config={}))
    with pytest.raises(ValueError, match="give pyspark= to the MvAssetsResource passed as resource="):
        build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri),
                          pyspark=LazyPySparkResource(spark_config=spark_config))
    # taken: the runner follows the resource's spark_config, nested keys too, and starts nothing
    nested = LazyPySparkResource(spark_config={"spark": {"master": "local[3]", "executorEnv": {"A": 1}}})
    resource = MvAssetsResource(catalog_uri=db.uri, pyspark=nested)
    with dg.build_resources({"r": resource}) as res:
        runner = res.r.get_runner()
        assert isinstance(runner, PySparkResourceRunner) and not runner.started
        assert (runner.resolved_master(), runner.resolved_remote(), runner.parallelism()) == ("local[3]", None, 3)
        assert runner.conf["spark.executorEnv.A"] == "1"
    remote = PySparkResourceRunner(pyspark=LazyPySparkResource(spark_config={"spark.remote": "sc://h:15002"}))
    assert remote.resolved_remote() == "sc://h:15002" and not remote._is_local_master()
    assert flat_spark_config({"a": {"b": True, "c": 2}}) == {"a.b": "true", "a.c": "2"}


def test_a_session_the_projects_own_asset_starts_first_runs_this_interpreter(tmp_path, monkeypatch):
    """Definitions with pyspark= set PYSPARK_PYTHON to this interpreter (unless
    set): a session the project's own asset starts through the resource before
    any refresh (or an eager PySparkResource at the run's start) ran the first
    python3 on the PATH in its workers, without mv_assets (ModuleNotFoundError
    in the refresh's tasks). A value the user set stays."""
    db = _catalog(tmp_path / "cat")
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    build_definitions(db, pyspark=PySparkResource(spark_config={"spark.master": "local[1]"}))
    assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    MvAssetsResource(catalog_uri=db.uri, pyspark=LazyPySparkResource(spark_config={}))
    assert os.environ["PYSPARK_PYTHON"] == "/opt/py/bin/python"


@pytest.mark.spark
def test_a_setting_spark_refuses_stops_the_session_the_refresh_started():
    """spark.sql.shuffle.partitions=abc: Spark refuses it only when the
    resource's getOrCreate applies it to the session the refresh just started
    (the run fails, saying so); that session is stopped, not left running in
    the process with nothing keeping it (a notebook or test process held a
    SparkContext after the failed run). In a process of its own (no session
    of another test there)."""
    code = (
        "from dagster_pyspark import LazyPySparkResource\n"
        "from pyspark import SparkContext\n"
        "from mv_assets.dagster.spark_session import PySparkResourceRunner\n"
        "r = PySparkResourceRunner(pyspark=LazyPySparkResource(spark_config={'spark.master': 'local[1]', "
        "'spark.ui.enabled': 'false', 'spark.sql.shuffle.partitions': 'abc'}))\n"
        "try:\n    r.session()\n    print('built')\nexcept Exception:\n    print('refused')\n"
        "print('active', SparkContext._active_spark_context is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["refused", "active", "False"], out.stdout + out.stderr[-2000:]


@pytest.mark.spark
def test_a_leftover_mv_assets_spark_master_does_not_apply_to_the_resources_session():
    """With pyspark=, $MV_ASSETS_SPARK_MASTER does not apply (docs/dagster.md):
    a session the resource started (no spark.master: local[*]) is the
    refresh's, whatever the variable says. It was read: "this process already
    runs a SparkSession on 'local[*]' ... master 'local[1]' cannot be used".
    In a process of its own (no session of another test there)."""
    code = (
        "import os\n"
        "os.environ['MV_ASSETS_SPARK_MASTER'] = 'local[1]'\n"
        "from dagster_pyspark import LazyPySparkResource\n"
        "from mv_assets.dagster.spark_session import PySparkResourceRunner\n"
        "res = LazyPySparkResource(spark_config={'spark.ui.enabled': 'false', 'spark.driver.host': '127.0.0.1'})\n"
        "started = res.spark_session\n"  # (the project's own asset, first)
        "r = PySparkResourceRunner(pyspark=res)\n"
        "print(r.session().sparkContext.master, r.session() is started)\n"
        "started.stop()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == ["local[*]", "True"], out.stdout + out.stderr[-2000:]


def test_definitions_with_a_pyspark_resource_load_without_a_jvm(tmp_path):
    """Loading definitions given a LazyPySparkResource starts no JVM (pyspark is
    imported: dagster-pyspark imports it; no SparkContext, no gateway)."""
    _catalog(tmp_path / "cat")
    code = (
        "from dagster_pyspark import LazyPySparkResource; from mv_assets.dagster import build_definitions; "
        "from pyspark import SparkContext; "
        f"d = build_definitions({str(tmp_path / 'cat')!r}, "
        "pyspark=LazyPySparkResource(spark_config={'spark.master': 'local[1]'})); "
        "d.get_repository_def().asset_graph; d.resources['mv_assets'].get_runner(); "
        "print(SparkContext._gateway is None and SparkContext._active_spark_context is None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


_CONNECT_CLIENT = r"""
import json, sys
import dagster as dg
import lance
from dagster_pyspark import LazyPySparkResource
from mv_assets.dagster import build_definitions
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.dagster.spark_session import PySparkResourceRunner
import mv_assets as mv

seen = []
real_build = PySparkResourceRunner._build
def build(self):
    session = real_build(self)
    seen.append([type(session).__module__, self.pyspark.spark_session is session])
    return session
PySparkResourceRunner._build = build

db = mv.connect(sys.argv[2])
defs = build_definitions(db, pyspark=LazyPySparkResource(spark_config={"spark.remote": sys.argv[1]}))
frags = [str(f.fragment_id) for f in lance.dataset(db.open_table("src").uri).get_fragments()]
with dg.instance_for_test() as instance:
    instance.add_dynamic_partitions(partitions_def_name("src"), frags)
    tags = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    out = dg.materialize([defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["v"])]], instance=instance,
                         tags=tags)
    mat = [m for m in out.asset_materializations_for_node("src_lineage") if m.asset_key == dg.AssetKey(["v"])][-1]
print(json.dumps({"success": out.success, "runner": mat.metadata["runner"].value, "seen": seen}))
"""


@pytest.mark.spark
def test_a_pyspark_resource_with_spark_remote_refreshes_over_spark_connect(tmp_path):
    """spark.remote in the resource's spark_config: the run's session is a
    Spark Connect client (no SparkContext is asked of it), the refresh a job on
    the Connect server's Spark, whose workers see the server's environment, and
    the view equals its query. (The client runs in a process of its own:
    pyspark marks a process as a Connect client for good.)"""
    from mv_assets.dagster.devserver import free_port
    from mv_assets.execution import connect_server

    db = _catalog(tmp_path / "cat")
    state = str(tmp_path / "connect")
    url = connect_server.start(port=free_port(), master="local[1]", state_dir=state)
    try:
        script = tmp_path / "client.py"
        script.write_text(_CONNECT_CLIENT)
        env = {**os.environ, "MV_ASSETS_LOCAL_BELOW_ROWS": "0"}
        env.pop(MARK, None)
        out = subprocess.run([sys.executable, str(script), url, db.uri], capture_output=True, text=True,
                             timeout=400, env=env)
    finally:
        connect_server.stop(state)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"success": True, "runner": "spark", "seen": [["pyspark.sql.connect.session", True]]}
    src = db.open_table("src").to_arrow().to_pylist()
    assert _view_rows(db) == {r["id"]: (r["x"], f"{r['x']}:None:task") for r in src if r["x"] != 3}
