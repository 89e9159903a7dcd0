"""The inline runner with ``threads``: several tasks of one refresh or
backfill at once in this process, sharing its stateful UDF instances (one
model per process, fed by every task's thread). Checked here: ``concurrently``
keeps order, bounds the threads, raises the first failure after the running
calls end, never starts the rest and leaves no thread behind; a real refresh
and backfill on threads equal an oracle computed with plain pyarrow, run their
tasks at once and set a stateful UDF up once; a UDF failure part way commits
nothing, and the next refresh completes."""

import contextvars
import threading
import time

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mv_assets as mv
from mv_assets.execution.spark import InlineRunner, concurrently
from mv_assets.model.errors import UdfError
from mv_assets.model.udf import UDF

WAIT_S = 10.0


def _task_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("mv_assets-task") and t.is_alive()]


# -- concurrently -----------------------------------------------------------------


def test_concurrently_keeps_the_items_order_and_runs_them_at_once():
    barrier = threading.Barrier(3, timeout=WAIT_S)  # fails unless three calls run at the same time

    def call(i):
        barrier.wait()
        time.sleep(0.01 * (3 - i))  # the first item finishes last
        return i * 10

    assert concurrently(call, [0, 1, 2], threads=3) == [0, 10, 20]
    assert not _task_threads()


def test_concurrently_runs_at_most_threads_calls_at_once():
    running, peak, lock = [0], [0], threading.Lock()
    first = threading.Barrier(3, timeout=WAIT_S)  # the first three run at once, however busy the machine

    def call(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        if i < 3:
            first.wait()
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return i

    assert concurrently(call, list(range(12)), threads=3) == list(range(12))
    assert peak[0] == 3


def test_concurrently_with_one_thread_runs_in_the_callers_thread():
    seen = []
    concurrently(lambda i: seen.append(threading.current_thread()), [1, 2], threads=1)
    assert seen == [threading.current_thread()] * 2


def test_concurrently_carries_the_callers_context():
    var = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    assert concurrently(lambda _: var.get(), [0, 1, 2], threads=2) == ["the caller's"] * 3


def test_concurrently_raises_the_first_failure_after_running_calls_end_and_starts_no_more():
    started, ended = [], []
    release = threading.Event()

    def call(i):
        started.append(i)
        if i == 1:
            raise KeyError("task 1 failed")
        if i == 0:
            release.wait(0.3)  # still running when task 1 fails
        elif i > 1:
            time.sleep(0.1)  # the rest take a while: they are not all done before the failure is seen
        ended.append(i)
        return i

    with pytest.raises(KeyError, match="task 1 failed"):
        concurrently(call, list(range(20)), threads=2)
    assert 0 in ended, "a call running when another failed was not let finish"
    assert len(started) < 20, "items after the failure were still started"
    assert not _task_threads()


def test_inline_runner_checks_its_threads():
    with pytest.raises(ValueError, match="positive int"):
        InlineRunner(threads=0)
    with pytest.raises(ValueError, match="positive int"):
        InlineRunner(threads=True)  # type: ignore[arg-type]
    assert InlineRunner(threads=4).parallelism() == 4
    assert InlineRunner().parallelism() == 1


# -- refresh and backfill on threads ------------------------------------------------


SEEN_ENV = "MV_ASSETS_TEST_SEEN"


class Seen:
    """What the model's instances did, in files under ``$MV_ASSETS_TEST_SEEN``
    (a UDF's class is stored by value: state kept on a class is reset each
    time the view's definition is loaded): set-ups, and each call's thread and span."""

    @staticmethod
    def record(kind: str, *fields) -> None:
        import os
        import uuid

        with open(os.path.join(os.environ[SEEN_ENV], f"{kind}-{uuid.uuid4().hex}"), "w") as f:
            f.write("\t".join(map(str, fields)))

    @staticmethod
    def read(kind: str) -> list[list[str]]:
        import glob
        import os

        out = []
        for path in glob.glob(os.path.join(os.environ[SEEN_ENV], f"{kind}-*")):
            with open(path) as f:
                out.append(f.read().split("\t"))
        return out

    @staticmethod
    def inits() -> list[str]:
        return [fields[0] for fields in Seen.read("init")]

    @staticmethod
    def call_threads() -> set[str]:
        return {fields[0] for fields in Seen.read("call")}

    @staticmethod
    def peak() -> int:
        """The most calls that ran at the same time."""
        calls = [(float(t0), float(t1)) for _, t0, t1 in Seen.read("call")]
        edges = sorted([(t0, 1) for t0, _ in calls] + [(t1, -1) for _, t1 in calls])
        running = most = 0
        for _, step in edges:
            running += step
            most = max(most, running)
        return most


class Model:
    """A stateful UDF whose set-up is slow (so threads racing for it would all
    construct it) and whose calls record their thread and span."""

    def __init__(self) -> None:
        time.sleep(0.2)
        Seen.record("init", threading.current_thread().name)
        self.scale = 3

    def __call__(self, x: pa.Array) -> pa.Array:
        t0 = time.perf_counter()
        time.sleep(0.02)  # the GIL is free meanwhile, as in a model's call
        Seen.record("call", threading.current_thread().name, t0, time.perf_counter())
        return pc.multiply(x, self.scale)


@pytest.fixture
def seen(tmp_path, monkeypatch):
    where = tmp_path / "seen"
    where.mkdir()
    monkeypatch.setenv(SEEN_ENV, str(where))
    monkeypatch.setattr(UDF, "_instances", {})  # no instance left from an earlier test: set-ups counted from 0


def _source(db, rows: int = 40_000, fragments: int = 4):
    per = rows // fragments
    table = pa.table({"id": pa.array(np.arange(rows)), "x": pa.array(np.arange(rows) % 997, pa.int64())})
    t = db.create_table("src", table.slice(0, per))
    for i in range(1, fragments):
        t.add(table.slice(i * per, per))
    return t


def _oracle(uri: str) -> dict[int, int]:
    t = lance.dataset(uri).to_table(columns=["id", "x"])
    return {i: 3 * x for i, x in zip(t.column("id").to_pylist(), t.column("x").to_pylist(), strict=True)
            if x % 5 != 0}


def test_a_refresh_on_threads_equals_the_oracle_and_sets_the_model_up_once(tmp_path, seen):
    db = mv.connect(str(tmp_path / "cat"), runner=InlineRunner(threads=4))
    src = _source(db)
    udf = mv.udf(Model, data_type=pa.int64(), input_columns=["x"], batch_size=1024)
    db.create_materialized_view("v", src.search(None).where("x % 5 != 0").select({"id": "id", "y": udf}))
    r = db.open_table("v").refresh()
    got = db.open_table("v").to_arrow()
    assert dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True)) == _oracle(src.uri)
    assert r.tasks == 4 and r.runner == "inline[4 threads]"
    assert len(Seen.inits()) == 1, f"the model was set up {len(Seen.inits())} times: {Seen.inits()}"
    assert Seen.peak() >= 2 and len(Seen.call_threads()) >= 2, "the tasks did not compute at once"
    assert not _task_threads()

    # an append, then a delete and an update: each incremental refresh on threads equals the oracle again
    src.add(pa.table({"id": pa.array(np.arange(40_000, 52_000)), "x": pa.array(np.arange(12_000) % 991, pa.int64())}))
    db.open_table("v").refresh()
    src.delete("id % 7 = 0")
    src.update(where="id % 11 = 0", values={"x": 1})
    db.open_table("v").refresh()
    got = db.open_table("v").to_arrow()
    assert dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True)) == _oracle(src.uri)
    assert len(Seen.inits()) == 1


class Failing:
    """Fails on one batch (a value only one task's rows hold) while another task runs."""

    fail = True

    def __call__(self, x: pa.Array) -> pa.Array:
        if Failing.fail and pc.any(pc.equal(x, 777_777)).as_py():
            raise RuntimeError("the model broke on a batch")
        time.sleep(0.01)
        return pc.multiply(x, 3)


def test_a_failing_task_on_threads_commits_nothing_and_the_next_refresh_completes(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=InlineRunner(threads=3))
    src = _source(db, rows=30_000, fragments=3)
    src.update(where="id = 25000", values={"x": 777_777})  # in the last fragment's task
    udf = mv.udf(Failing, data_type=pa.int64(), input_columns=["x"], batch_size=512)
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": udf}))
    view = db.open_table("v")
    before = lance.dataset(view.uri).version
    Failing.fail = True
    with pytest.raises((UdfError, RuntimeError), match="broke"):
        view.refresh()
    assert lance.dataset(view.uri).version == before, "a failed refresh on threads committed"
    assert not _task_threads()
    Failing.fail = False
    view.refresh()
    got = db.open_table("v").to_arrow()
    t = lance.dataset(src.uri).to_table(columns=["id", "x"])
    want = {i: 3 * x for i, x in zip(t.column("id").to_pylist(), t.column("x").to_pylist(), strict=True)}
    assert dict(zip(got.column("id").to_pylist(), got.column("y").to_pylist(), strict=True)) == want


def test_a_backfill_on_threads_equals_the_oracle(tmp_path, seen):
    db = mv.connect(str(tmp_path / "cat"), runner=InlineRunner(threads=3))
    src = _source(db, rows=30_000, fragments=3)
    src.add_columns({"y": mv.udf(Model, data_type=pa.int64(), input_columns=["x"], batch_size=1024)})
    src.backfill("y")
    t = lance.dataset(src.uri).to_table(columns=["x", "y"])
    assert t.column("y").to_pylist() == [3 * x for x in t.column("x").to_pylist()]
    assert len(Seen.inits()) == 1
    assert not _task_threads()


def test_progress_of_a_refresh_on_threads_counts_every_task_once(tmp_path, seen):
    """Tasks on threads count their batches into one stage at once: the reports
    never go back nor past the rows planned, and the last says all of them."""
    from mv_assets import progress

    db = mv.connect(str(tmp_path / "cat"), runner=InlineRunner(threads=4))
    src = _source(db)
    udf = mv.udf(Model, data_type=pa.int64(), input_columns=["x"], batch_size=1024)
    db.create_materialized_view("v", src.search(None).where("x % 5 != 0").select({"id": "id", "y": udf}))
    reports = []
    with progress.listen(reports.append, every=0.02):
        db.open_table("v").refresh()
    assert len(reports) >= 3, reports
    done = [r.rows_done for r in reports]
    assert done == sorted(done) and all(d <= r.rows_planned for d, r in zip(done, reports, strict=True))
    assert reports[-1].done and reports[-1].rows_done == reports[-1].rows_planned == len(_oracle(src.uri))
