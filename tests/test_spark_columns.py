"""Backfill on real Spark: many tasks, error capture in Python workers, views."""

import pytest
from oracle import count_calls, record_call

import mv_assets as mv

pytestmark = pytest.mark.spark


def test_backfill_on_spark_matches_python_and_computes_each_row_once(spark_db, call_log):
    t = spark_db.create_table("t", [{"id": i, "x": float(i)} for i in range(3000)])
    t.add([{"id": i, "x": float(i)} for i in range(3000, 5000)])

    @mv.udf(on_error="skip")
    def score(x: float) -> float:
        record_call(call_log, "score", x)
        if int(x) % 1000 == 7:
            raise ValueError(f"cannot score {x}")
        return x / 2

    t.add_columns({"s": score})
    plan = t.plan_backfill("s", checkpoint_size=256, max_rows_per_task=1024)
    assert plan.tasks == 5 and plan.rows == 5000
    r = t.backfill("s", checkpoint_size=256, max_rows_per_task=1024)
    assert count_calls(call_log, "score") == 5000 == r.udf_rows_computed
    bad = {i for i in range(5000) if i % 1000 == 7}
    got = {row["id"]: row["s"] for row in t.to_arrow().to_pylist()}
    assert got == {i: (None if i in bad else i / 2) for i in range(5000)}
    assert r.rows_failed == len(bad) and len(t.get_errors(job_id=r.job_id)) == len(bad)
    assert t.plan_backfill("s").rows == len(bad)  # failed rows stay to do; the rest is done


def test_one_pass_backfill_on_spark_matches_python(spark_db, call_log):
    """The default backfill of a table's UDF column: each task computes and
    writes its fragments' column files on an executor; one commit."""
    import os

    t = spark_db.create_table("t", [{"id": i, "x": float(i)} for i in range(3000)])
    t.add([{"id": i, "x": float(i)} for i in range(3000, 5000)])

    @mv.udf(on_error="skip")
    def half(x: float) -> float:
        record_call(call_log, "half", os.getpid())
        if int(x) % 1000 == 7:
            raise ValueError(f"cannot halve {x}")
        return x / 2

    t.add_columns({"h": half})
    r = t.backfill("h")
    assert count_calls(call_log, "half") == 5000 == r.udf_rows_computed
    bad = {i for i in range(5000) if i % 1000 == 7}
    got = {row["id"]: row["h"] for row in t.to_arrow().to_pylist()}
    assert got == {i: (None if i in bad else i / 2) for i in range(5000)}
    assert r.rows_failed == len(bad) and len(t.get_errors(job_id=r.job_id)) == len(bad)
    assert t.plan_backfill("h").rows == len(bad)
    workers = set()
    for name in os.listdir(call_log):
        if name.startswith("half."):
            workers.add(int(name.split(".")[1]))
    assert os.getpid() not in workers  # computed in Spark's Python workers


def test_view_column_backfill_on_spark(spark_db):
    t = spark_db.create_table("t", [{"id": i, "x": i} for i in range(500)])
    v = spark_db.create_materialized_view("v", t.search(None).where("x % 2 = 0"), with_no_data=False)

    @mv.udf
    def neg(x: int) -> int:
        return -x

    v.add_columns({"n": neg})
    r = v.backfill("n", max_rows_per_task=64, checkpoint_size=32)
    assert r.rows_written == 250
    assert sorted((row["x"], row["n"]) for row in v.to_arrow().to_pylist()) == [(i, -i) for i in range(0, 500, 2)]


def test_view_column_one_pass_backfill_on_spark(spark_db):
    """A view's UDF column in one pass on Spark: the plan file and the source
    are read in the executors, each view fragment written once."""
    t = spark_db.create_table("t", [{"id": i, "x": i} for i in range(400)])
    t.add([{"id": i, "x": i} for i in range(400, 700)])
    v = spark_db.create_materialized_view("v", t.search(None).where("x % 2 = 0"), with_no_data=False)

    @mv.udf
    def neg(x: int) -> int:
        return -x

    v.add_columns({"n": neg})
    r = v.backfill("n")
    assert r.rows_written == r.udf_rows_computed == 350
    assert sorted((row["x"], row["n"]) for row in v.to_arrow().to_pylist()) == [(i, -i) for i in range(0, 700, 2)]
    assert v.backfill("n").rows_planned == 0
