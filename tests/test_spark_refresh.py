"""Refresh on real Spark with real Lance files, checked against an oracle
computed with plain pyarrow over the source at the same version."""

import datetime as dt
import json
import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest
from oracle import actual_view, count_calls, expected_view, record_call, shuffle_key, source_rows

import mv_assets as mv

pytestmark = pytest.mark.spark

CALLS = {"dir": None}


def _video_schema():
    return pa.schema(
        [
            pa.field("video_id", pa.int64(), nullable=False),
            pa.field("video_uri", pa.string(), nullable=False),
            pa.field("upload_ts", pa.timestamp("us"), nullable=False),
            pa.field("metadata", pa.json_(), nullable=True),
        ]
    )


def _videos(start, n):
    base = dt.datetime(2026, 1, 1)
    return [
        {
            "video_id": i,
            "video_uri": f"s3://videos/{i:05d}.mp4",
            "upload_ts": base + dt.timedelta(minutes=i),
            "metadata": json.dumps({"duration_s": 10 + i % 50}),
        }
        for i in range(start, start + n)
    ]


def test_seed_video_example_end_to_end(spark_db, call_log):
    """The seed's example: raw_videos -> shuffled view with two UDF columns."""
    db = spark_db
    raw = db.create_table("raw_videos", schema=_video_schema(), primary_key="video_id")
    raw.add(_videos(0, 40))

    @mv.udf
    def transcribe(video_uri) -> str:
        record_call(call_log, "transcribe", video_uri)
        return "transcript of " + video_uri.rsplit("/", 1)[-1]

    @mv.udf(data_type=pa.binary())
    def load_video(video_uri: pa.Array) -> pa.Array:
        record_call(call_log, "load_video", len(video_uri))
        return pa.array([u.encode() for u in video_uri.to_pylist()], pa.binary())

    q = (
        raw.search(None)
        .shuffle(seed=42)
        .select({"video_uri": "video_uri", "video": load_video, "transcription": transcribe})
    )
    view = db.create_materialized_view("table_view", q)
    assert view.count_rows() == 0
    r = db.refresh("table_view")
    assert r.runner == "spark" and r.udf_rows_computed == {"video": 40, "transcription": 40}
    assert count_calls(call_log, "transcribe") == 40

    def project(row):
        uri = row["video_uri"]
        return {"video_uri": uri, "video": uri.encode(), "transcription": "transcript of " + uri.rsplit("/", 1)[-1]}

    assert actual_view(view) == expected_view(raw.uri, raw.version, lambda r: True, project)

    raw.add(_videos(40, 10))
    r = db.refresh("table_view")  # only materialize new rows
    assert r.udf_rows_computed == {"video": 10, "transcription": 10}
    assert count_calls(call_log, "transcribe") == 50
    assert actual_view(view) == expected_view(raw.uri, raw.version, lambda r: True, project)
    # shuffle: the whole view (both refreshes' rows) is in one seeded order
    ids = view.to_arrow(with_internal=True).column("__source_row_id").to_pylist()
    assert [shuffle_key(i, 42) for i in ids] == sorted(shuffle_key(i, 42) for i in ids)
    assert sorted(ids) == list(range(50)) and max(ids[:10]) >= 40 > min(ids[:10])  # new rows all over


def test_udfs_from_test_module_and_stateful_class_run_on_workers(spark_db, call_log):
    db = spark_db
    t = db.create_table("docs", [{"id": i, "text": "word " * (i % 7)} for i in range(30)])

    @mv.udf(data_type=pa.int32())
    class WordCounter:
        def __init__(self):
            self.pid = os.getpid()
            record_call(call_log, "setup", self.pid)

        def __call__(self, text: str) -> int:
            return len(text.split())

    view = db.create_materialized_view(
        "counts", t.search(None).where("id < 25").select({"id": "id", "words": WordCounter})
    )
    r = view.refresh()
    assert r.udf_rows_computed == {"words": 25}
    got = {row["id"]: row["words"] for row in view.to_arrow().to_pylist()}
    assert got == {i: i % 7 for i in range(25)}
    # set up at most once per worker process, not per row or batch
    assert 1 <= count_calls(call_log, "setup") <= 2


def test_large_fragment_is_split_into_parallel_tasks(spark_db):
    db = spark_db
    t = db.create_table("big", pa.table({"id": pa.array(range(5000), pa.int64())}))
    view = db.create_materialized_view("v", t.search(None).where("id % 3 = 0").select({"id": "id", "y": "id * 2"}))
    r = view.refresh(max_rows_per_task=500)
    assert r.tasks == 4  # 1667 rows / 500 per task
    got = sorted(view.to_arrow().column("id").to_pylist())
    assert got == [i for i in range(5000) if i % 3 == 0]


# --- property test: random histories, checked against the oracle -------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 6)),
        st.tuples(st.just("delete"), st.integers(0, 9)),
        st.tuples(st.just("update"), st.integers(0, 9)),
        st.tuples(st.just("optimize"), st.just(0)),
        st.tuples(st.just("refresh"), st.just(0)),
        st.tuples(st.just("partial"), st.integers(0, 5)),
        st.tuples(st.just("cleanup"), st.integers(0, 1)),  # 0: the source's history, 1: the view's
    ),
    min_size=1,
    max_size=10,
)
EXAMPLES = int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12"))


def _keep(row):  # the oracle's filter, written independently of the SQL
    return row["x"] % 3 != 0


def _project(row):
    return {"id": row["id"], "x": row["x"], "label": f"{row['id']}:{row['x']}", "score": row["x"] * 10 + 1}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(ops=OPS)
def test_random_histories_match_oracle(ops, spark_runner, tmp_path_factory):
    call_dir = str(tmp_path_factory.mktemp("calls"))
    db = mv.connect(str(tmp_path_factory.mktemp("cat")), runner=spark_runner)
    src = db.create_table("src", [{"id": i, "x": i} for i in range(8)], primary_key="id")
    next_id = [8]

    @mv.udf
    def score(x: int) -> int:
        record_call(call_dir, "score", x)
        return x * 10 + 1

    @mv.udf
    def twice(score: int) -> int:
        record_call(call_dir, "twice", score)
        return 2 * score

    view = db.create_materialized_view(
        "v",
        src.search(None).where("x % 3 != 0").select({"id": "id", "x": "x", "label": "concat(cast(id as string), ':', cast(x as string))", "score": score}),
    )
    top = db.create_materialized_view("top", view.search(None).where("score > 40").select({"id": "id", "twice": twice}))
    shuffled = db.create_materialized_view(
        "shuf", src.search(None).where("x % 3 != 0").select({"id": "id", "x": "x"}).shuffle(seed=3)
    )
    last_rows: dict = {}  # the oracle's snapshot at the last refresh (cleanup may remove that version)
    calls_seen = 0
    twice_seen = 0
    partial_calls = 0
    ops = list(ops) + [("refresh", 0)]
    for op, arg in ops:
        if op == "add":
            src.add([{"id": next_id[0] + k, "x": (next_id[0] + k) * 7 % 11} for k in range(arg)])
            next_id[0] += arg
        elif op == "delete":
            src.delete(f"id % 10 = {arg}")
        elif op == "update":
            src.update(f"id % 10 = {arg}", values_sql={"x": "x + 1"})
        elif op == "optimize":
            src.optimize()
        elif op == "cleanup":
            (src if arg == 0 else view).optimize(cleanup_older_than=timedelta(0))
        elif op == "partial":
            # a Dagster-style refresh of one source fragment: exact for that fragment
            frags = lance.dataset(src.uri).get_fragments()
            frag = frags[arg % len(frags)]
            r = view.refresh(fragments=[frag.fragment_id])
            partial_calls += r.udf_rows_computed.get("score", 0)
            in_frag = set(frag.to_table(columns=[], with_row_id=True).column("_rowid").to_pylist())
            exp = expected_view(src.uri, src.version, _keep, _project)
            got = actual_view(view)
            assert {k: got.get(k) for k in in_frag} == {k: exp.get(k) for k in in_frag}
            assert set(got) <= set(source_rows(src.uri, src.version))  # deletes applied
        else:
            v1 = src.version
            now = source_rows(src.uri, v1)
            expected_changed = {rid for rid, r in now.items() if _keep(r) and last_rows.get(rid) != r}
            results = db.refresh(["top", "shuf", "v"])
            order = [r.view for r in results]
            assert order.index("v") < order.index("top") and len(order) == 3
            results = [r for r in results if r.view != "shuf"]
            # the shuffled view: the oracle's rows, in one seeded order over the whole view
            assert sorted(actual_view(shuffled).items()) == sorted(
                (rid, {"id": r["id"], "x": r["x"]}) for rid, r in now.items() if _keep(r)
            )
            ids = shuffled.to_arrow(with_internal=True).column("__source_row_id").to_pylist()
            assert [shuffle_key(i, 3) for i in ids] == sorted(shuffle_key(i, 3) for i in ids)
            # view == oracle at the same source version, keyed by stable row id
            assert view.source_version == v1
            assert actual_view(view) == expected_view(src.uri, v1, _keep, _project)
            # UDF work == rows changed, counted by the workers themselves
            calls = count_calls(call_dir, "score")
            assert calls - calls_seen - partial_calls == results[0].udf_rows_computed.get("score", 0)
            if partial_calls == 0:
                assert calls - calls_seen == len(expected_changed)
            else:  # rows computed by a partial refresh are not computed again
                assert results[0].udf_rows_computed.get("score", 0) <= len(expected_changed)
            calls_seen = calls
            partial_calls = 0
            # view over view: equals the oracle applied to the oracle
            exp_top = sorted(
                (r["id"], 2 * r["score"]) for r in expected_view(src.uri, v1, _keep, _project).values() if r["score"] > 40
            )
            got_top = sorted((r["id"], r["twice"]) for r in top.to_arrow().to_pylist())
            assert got_top == exp_top
            # the derived view computes exactly the changed upstream rows it keeps
            after = expected_view(src.uri, v1, _keep, _project)
            twice_calls = count_calls(call_dir, "twice")
            top_changed = sum(1 for rid in expected_changed if after[rid]["score"] > 40)
            assert twice_calls - twice_seen <= top_changed
            twice_seen = twice_calls
            last_rows = now


@pytest.mark.parametrize(
    "rows_setting, seconds_setting, rows, estimate, on_driver",
    [
        (None, None, 100, 0.002, True),      # auto: small estimated work stays on the driver
        (None, None, 10**6, 20.0, False),    # auto: large work goes to Spark
        (None, None, 5, None, False),        # no estimate (a runner caller without one): Spark
        (None, 0.0, 100, 0.002, False),      # local_below_seconds=0: never on the driver
        (None, 30.0, 10**6, 20.0, True),     # a higher bound keeps more on the driver
        (0, None, 100, 0.002, False),        # local_below_rows=0: always a Spark job
        (1000, None, 500, 99.0, True),       # a fixed row bound replaces the estimate
        (1000, None, 5000, 0.001, False),
    ],
)
def test_where_work_runs_by_estimate_or_fixed_bound(rows_setting, seconds_setting, rows, estimate, on_driver):
    runner = mv.SparkRunner(local_below_rows=rows_setting, local_below_seconds=seconds_setting)
    assert runner.runs_on_driver(rows, estimate) is on_driver
    assert not runner.started  # deciding never starts Spark


def test_small_refreshes_never_pay_a_spark_job_and_the_cost_is_measured(tmp_path):
    """With the defaults, a small refresh runs on the driver (no JVM starts),
    says so, and records its measured cost per row for the next decision."""
    runner = mv.SparkRunner(master="local[1]")
    db = mv.connect(str(tmp_path / "cat"), runner=runner)
    t = db.create_table("t", pa.table({"id": list(range(5000)), "x": list(range(5000))}))

    @mv.udf
    def inc(x: int) -> int:
        return x + 1

    view = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": inc}))
    r = view.refresh()
    assert r.runner == "spark-driver-local" and not runner.started
    measured = view.refresh_state().seconds_per_row
    assert measured is not None and 0 < measured < 1e-3
    t.add(pa.table({"id": [9999], "x": [1]}))
    r = view.refresh()
    assert r.runner == "spark-driver-local" and r.udf_rows_computed == {"y": 1} and not runner.started
    assert view.refresh_state().seconds_per_row == measured  # too few rows to measure: carried


def test_small_backfills_never_pay_a_spark_job(tmp_path):
    """A backfill of a few rows ran as a Spark job with the default runner
    (a JVM started: ~10 s for 3 rows), where a refresh of as many runs on the
    driver: a backfill's work is estimated as a refresh's first one is."""
    runner = mv.SparkRunner(master="local[1]")
    db = mv.connect(str(tmp_path / "cat"), runner=runner)
    t = db.create_table("t", pa.table({"id": list(range(50)), "x": list(range(50))}))

    @mv.udf
    def inc(x: int) -> int:
        return x + 1

    t.add_columns({"y": inc})
    assert t.backfill("y").rows_written == 50 and not runner.started
    assert t.backfill_async("y", where="x < 5").result(timeout=120) is not None and not runner.started
    assert sorted(t.to_arrow().select(["x", "y"]).to_pylist(), key=lambda r: r["x"]) == [
        {"x": i, "y": i + 1} for i in range(50)]
