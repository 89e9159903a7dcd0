"""Spark users read views directly: ``to_spark`` gives a DataFrame read on
the executors, one partition per fragment, internal columns hidden."""

import os

import pyarrow as pa
import pytest

import mv_assets as mv

pytestmark = pytest.mark.spark


@mv.udf
def plus_one(x: int) -> int:
    return x + 1


def test_to_spark_reads_a_view_on_the_executors_one_partition_per_fragment(tmp_path, spark_runner):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"id": list(range(100)), "x": list(range(100))}))
    for lo in (100, 200):
        t.add(pa.table({"id": list(range(lo, lo + 100)), "x": list(range(lo, lo + 100))}))
    view = db.create_materialized_view("v", t.search(None).where("x % 2 = 0").select({"id": "id", "y": plus_one}))
    view.refresh(max_rows_per_task=50)
    spark = spark_runner.session()

    df = view.to_spark(spark)
    assert df.columns == ["id", "y"]  # no __source_row_id / __computed__y
    assert df.rdd.getNumPartitions() == len(view.fragment_ids()) > 1
    got = sorted((r["id"], r["y"]) for r in df.collect())
    assert got == sorted((r["id"], r["y"]) for r in view.to_arrow().to_pylist())
    # Spark computes on it like any DataFrame; partitions are read by executor processes
    assert df.filter("y > 100").count() == len([x for x in range(300) if x % 2 == 0 and x + 1 > 100])
    pids = df.rdd.mapPartitions(lambda rows: [os.getpid()]).collect()
    assert os.getpid() not in pids
    internal = view.to_spark(spark, with_internal=True)
    assert "__source_row_id" in internal.columns and "__computed__y" in internal.columns
    # a pinned version reads that version
    before = view.version
    t.delete("id < 50")
    view.refresh()
    assert view.to_spark(spark, version=before).count() == 150
    assert view.to_spark(spark).count() == 125
    with pytest.raises(ValueError, match="has no columns \\['nope'\\]"):
        view.to_spark(spark, columns=["id", "nope"])


def test_to_spark_of_an_empty_table(tmp_path, spark_runner):
    db = mv.connect(str(tmp_path / "cat"))
    t = db.create_table("t", schema=pa.schema([("x", pa.int64())]))
    df = t.to_spark(spark_runner.session())
    assert df.columns == ["x"] and df.count() == 0
