"""Where a task's time goes, when asked (``MV_ASSETS_STAGE_TIMINGS=1``,
mv_assets.execution.stages): a refresh's timings then carry the seconds its
tasks spent reading, in the UDFs, constructing stateful UDFs (once per
process, not in the UDF's time) and writing; unasked, nothing of it. The
values are those without timings (an oracle), failures are raised as before,
and no thread is left behind."""

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mv_assets as mv
from mv_assets.execution.stages import ENV, StageClock, clock
from mv_assets.execution.tasks import TaskResult

SETUP_S = 1.5  # (a margin no busy machine's noise in the UDF's few calls reaches: see the last assertion)
CALL_S = 0.01


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("mv_assets-read", "mv_assets-write")) and t.is_alive()]


@mv.udf(data_type=pa.float64(), batch_size=4096, version="stage-timings")
class SlowModel:
    """A model column: a slow set-up (a model's load), then a short call per batch."""

    def __init__(self) -> None:
        time.sleep(SETUP_S)

    def __call__(self, x: pa.Array) -> pa.Array:
        time.sleep(CALL_S)
        return pc.multiply(x, 3.0)


def _oracle(src) -> dict:
    t = src.to_arrow()
    return dict(zip(t.column("id").to_pylist(), (x * 3.0 for x in t.column("x").to_pylist()), strict=True))


def _values(view) -> dict:
    got = view.to_arrow()
    return dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True))


def _stages(result) -> dict:
    return {k: v for k, v in result.timings.items() if k.startswith("stage_")}


def test_unasked_nothing_is_timed(db, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert clock() is None
    monkeypatch.setenv(ENV, "0")
    assert clock() is None
    rng = np.random.default_rng(5)
    src = db.create_table("src", pa.table({"id": np.arange(20_000), "x": rng.random(20_000)}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": SlowModel}))
    result = view.refresh()
    assert _stages(result) == {}
    assert {"execute_s", "commit_s", "task_s_total"} <= set(result.timings)
    assert _values(view) == _oracle(src)


@pytest.mark.parametrize("rows", [30_000, 1000], ids=["overlapped", "one-after-the-other"])
def test_asked_the_refresh_says_where_its_tasks_time_went(db, monkeypatch, rows):
    """A task reading, computing and writing at once (>= 8,192 rows) and one
    doing them in turn: each stage timed; the set-up counted once per process
    and not in the UDF's time; the values those of the oracle."""
    monkeypatch.setenv(ENV, "1")
    mv.model.udf.UDF._instances.pop(SlowModel.instance_key(), None)  # set up anew in this test
    rng = np.random.default_rng(6)
    src = db.create_table("src", pa.table({"id": np.arange(rows), "x": rng.random(rows)}))
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": SlowModel}))
    first = _stages(view.refresh())
    assert set(first) == {"stage_read_s", "stage_udf_s", "stage_setup_s", "stage_write_s", "stage_cpu_s"}, first
    assert first["stage_setup_s"] >= SETUP_S
    calls = -(-rows // 4096)
    assert first["stage_udf_s"] >= calls * CALL_S
    assert first["stage_read_s"] > 0 and first["stage_write_s"] > 0
    assert _values(view) == _oracle(src)
    # again: the process's instance is reused, its set-up not counted again, nor in the UDF's time
    second = _stages(view.refresh(mode="full"))
    assert second["stage_setup_s"] == 0.0
    assert second["stage_udf_s"] >= calls * CALL_S
    assert first["stage_udf_s"] < second["stage_udf_s"] + SETUP_S * 0.8, (first, second)
    assert _values(view) == _oracle(src)
    assert not _pipeline_threads()


# (a failure part way with timings asked for: test_overlap, parametrized)
def test_a_worker_process_hands_the_stages_back_in_its_result():
    r = TaskResult(task_id="t", stages={"read_s": 1.5, "write_s": 0.25})
    assert TaskResult.from_json(r.to_json()).stages == {"read_s": 1.5, "write_s": 0.25}
    old = '{"task_id": "t", "fragments": [], "rows_written": 0}'  # a worker of a release before stages
    assert TaskResult.from_json(old).stages == {}


def test_clock_adds_from_several_threads_and_closes_what_it_times():
    c = StageClock()

    def add() -> None:
        for _ in range(1000):
            c.add("udf_s", 1.0)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.seconds == {"udf_s": 4000.0}

    closed = []

    def items():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    timed = c.timed_iter(items(), "read_s")
    assert [next(timed), next(timed)] == [0, 1]
    timed.close()  # a consumer that stops early: the source is closed too
    assert closed == [True]
    assert list(c.timed_iter(iter(range(3)), "read_s")) == [0, 1, 2] and c.seconds["read_s"] >= 0
