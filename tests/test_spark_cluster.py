"""On a real Spark standalone cluster (a master and two workers on loopback,
from the pyspark wheel), refreshing a view whose catalog is on an S3 server."""

import os
import textwrap

import pyarrow as pa
import pytest
from spark_cluster import StandaloneCluster

import mv_assets as mv
from mv_assets.execution.spark import SparkRunner

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path, spark_runner):
    # One SparkContext per process: the shared local session steps aside (it
    # starts again on its next use), or getOrCreate would hand it back.
    spark_runner.stop()
    c = StandaloneCluster(str(tmp_path / "spark"), workers=2, cores=1)
    yield c
    c.stop()


def test_refresh_on_a_standalone_cluster_with_the_catalog_on_s3(cluster, s3_server, tmp_path, monkeypatch):
    # A UDF dependency the executors cannot import unless it is shipped.
    deps = tmp_path / "deps" / "scoring"
    deps.mkdir(parents=True)
    (deps / "__init__.py").write_text(textwrap.dedent("""
        import os
        def score(x):
            return x * 10 + int(os.environ.get("MV_TEST_OFFSET", "0"))
    """))
    monkeypatch.setenv("MV_TEST_OFFSET", "7")
    bucket = s3_server.new_bucket()
    opts = s3_server.options
    runner = SparkRunner(master=cluster.master_url, driver_host="127.0.0.1", bind_address="127.0.0.1", local_below_rows=0,
                         py_files=[str(deps)], forward_env=["MV_TEST_OFFSET"], resource_wait_seconds=90,
                         conf={"spark.executor.memory": "512m", "spark.cores.max": "2"})
    try:
        db = mv.connect(f"s3://{bucket}/cat", storage_options=opts, runner=runner)
        t = db.create_table("t", pa.table({"id": list(range(400)), "x": list(range(400))}))
        t.add(pa.table({"id": list(range(400, 500)), "x": list(range(400, 500))}))

        @mv.udf
        def scored(x: int) -> int:
            import scoring  # shipped with py_files

            return scoring.score(x) + os.getpid() * 0

        @mv.udf
        def worker_pid(x: int) -> int:
            return os.getpid()

        db.create_materialized_view(
            "v", t.search(None).where("x % 3 = 0").select({"id": "id", "s": scored, "pid": worker_pid})
        )
        r = db.open_table("v").refresh(max_rows_per_task=40)
        assert r.rows_inserted == len([x for x in range(500) if x % 3 == 0])
        rows = db.open_table("v").to_arrow().to_pylist()
        assert sorted((row["id"], row["s"]) for row in rows) == [(x, x * 10 + 7) for x in range(500) if x % 3 == 0]
        assert os.getpid() not in {row["pid"] for row in rows}  # computed on the executors
        sc = runner.session().sparkContext
        assert sc.master == cluster.master_url  # not some other session of this process
        assert sc._jsc.sc().getExecutorMemoryStatus().size() >= 3  # driver + two workers' executors
        t.delete("x < 30")
        r = db.open_table("v").refresh()
        assert not r.full and r.rows_deleted == 10
    finally:
        runner.stop()


def test_a_cluster_without_free_cores_fails_clearly_instead_of_hanging(cluster, tmp_path):
    """An application asking for more memory per executor than any worker has
    never gets an executor: the refresh fails after the wait, the lock is released."""
    runner = SparkRunner(master=cluster.master_url, driver_host="127.0.0.1", bind_address="127.0.0.1", local_below_rows=0,
                         resource_wait_seconds=5, conf={"spark.executor.memory": "4g"})
    try:
        db = mv.connect(str(tmp_path / "cat"), runner=runner)
        t = db.create_table("t", pa.table({"x": list(range(10))}))
        db.create_materialized_view("v", t.search(None).select({"x": "x"}))
        with pytest.raises(RuntimeError, match="no Spark executor joined within 5s"):
            db.open_table("v").refresh()
        assert db.open_table("v").status().load_state == "FAILED_LOAD"
        db.open_table("v").refresh(runner=mv.InlineRunner(), lock_timeout=1)  # the lock was released
    finally:
        runner.stop()


def test_a_runner_does_not_silently_reuse_a_session_on_another_master(spark_runner):
    spark_runner.session()  # local[2] is running in this process
    other = SparkRunner(master="spark://127.0.0.1:1")
    with pytest.raises(RuntimeError, match="already runs a SparkSession on 'local\\[2\\]'"):
        other.session()
