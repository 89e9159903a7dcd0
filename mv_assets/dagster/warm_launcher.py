"""The run launcher of the demo's ``dagster.yaml``: each run's process is
forked from one that has already imported dagster, lance and mv_assets.

Dagster's ``DefaultRunLauncher`` asks the code server to start each run in a
new Python (``multiprocessing`` "spawn"), which imports dagster, pyarrow,
pandas, lance and mv_assets again before the run can start: ~2.7 s of CPU on
an idle core, most of a click's wait for its run and several seconds on a busy
machine (docs/dagster.md, "Timings"). :class:`WarmRunLauncher` keeps one
helper process per launching process (the daemon, or the webserver without a
run queue) that imports those modules once (nothing else: no instance, no
definitions, no Lance dataset opened, no thread started) and forks a child for
each run. The child runs what ``dagster api execute_run`` runs (the public
command Dagster's Docker and Kubernetes launchers start), with the run's own
``ExecuteRunArgs``: it loads the instance and the run's code from the run's
origin (so a changed ``definitions.py`` is read as with a new process), then
executes the run. Every run is still a process of its own.

Python's ``multiprocessing`` "forkserver" does the same for the processes of
one program, and is what Lance asks for ("lance is not fork-safe ... use spawn
or forkserver"): the helper never uses Lance before it forks (it checks that
no Lance thread runs after its imports and that it has no more threads before
each fork, and is started anew if not), so each child starts Lance's runtime
itself.

It falls back to ``DefaultRunLauncher`` (the code server) for a run it cannot
start this way: a code location on another Python (``executable_path``), one
with a container image, no ``fork`` (Windows), or a helper that failed to
start. ``terminate`` interrupts the run's process as the code server does
(SIGINT, after the run is marked canceling), having checked by its start time
that the process id is still the run's. Modules imported by the helper are
those of the moment it started: after upgrading mv_assets or dagster, restart
``dagster dev`` (the helper is started again with the daemon).
"""

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence

from dagster import Array, Field, StringSource
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext

__all__ = ["WarmRunLauncher", "PRELOAD", "RUN_PROCESS_TAG", "forkable", "warm_runs_yaml"]

# What the helper imports before it forks: what every run process imports
# before it can start (the instance, the run's code, then the run).
# Then the modules the instance's dagster.yaml names (its storage, run coordinator...: with
# SQLite storage, sqlalchemy and alembic come with them), imported, never instantiated:
# loading the instance in a run's process took ~1.0 s without them, ~0.15 s with them.
PRELOAD = ("dagster", "dagster._cli.api", "dagster._core.execution.api", "dagster._core.instance.factory",
           "upath", "pyarrow", "pyarrow.compute", "pyarrow.dataset", "pandas", "lance", "sqlglot",
           "sqlglot.dialects.spark", "mv_assets", "mv_assets.dagster")
RUN_PROCESS_TAG = "mv_assets/run_process"  # "<pid>:<start time in clock ticks>" of a forked run
_STDOUT_FD = "MV_ASSETS_WARM_STDOUT_FD"


def forkable(job_code_origin, executable: str = sys.executable) -> str | None:
    """Why a run of this code origin cannot be forked from the helper (None:
    it can): its Python must be the one the helper runs, started with
    ``python -m dagster`` or ``dagster`` (no other entry point), and no
    container image."""
    if not hasattr(os, "fork"):
        return "no fork() on this platform"
    if job_code_origin is None:
        return "the run has no code origin"
    repo = job_code_origin.repository_origin
    if getattr(repo, "container_image", None):
        return f"the code location runs in a container image ({repo.container_image})"
    theirs = repo.executable_path or executable
    if os.path.realpath(theirs) != os.path.realpath(executable):
        return f"the code location runs on another Python ({theirs})"
    entry = list(repo.entry_point or [])
    if entry and entry not in (["dagster"], [theirs, "-m", "dagster"]):
        return f"the code location names its own entry point ({' '.join(entry)})"
    return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time, in clock ticks since boot (None: no such
    process): with its id, it names one process (ids are reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class _Helper:
    """The helper process (``python -m mv_assets.dagster.warm_launcher``): one
    request a line on its stdin (the ``execute_run`` arguments and the
    directory to run in), one reply a line on its stdout (the child's id)."""

    def __init__(self, preload: Sequence[str]) -> None:
        out = os.dup(1)  # (the runs print where this process prints)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                pass_fds=(out,), env={**os.environ, _STDOUT_FD: str(out)}, text=True, bufsize=1)
        finally:
            os.close(out)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        start = time.perf_counter()
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready"):
            self.close()
            raise RuntimeError(f"the run helper did not start: {ready.strip() or 'it exited'}")
        self.seconds = time.perf_counter() - start

    def fork(self, payload: str, cwd: str | None) -> tuple[int, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": payload, "cwd": cwd}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline() or '{"error": "the run helper exited"}')
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return int(reply["pid"]), int(reply["ticks"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # (it exits when its stdin closes; its runs go on)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class WarmRunLauncher(DefaultRunLauncher):
    """Dagster's ``DefaultRunLauncher`` whose runs start from a process that
    has imported their modules already (see the module); ``preload``: modules
    the helper imports besides :data:`PRELOAD` (a project's heavy ones)."""

    def __init__(self, inst_data=None, preload: Sequence[str] | None = None) -> None:
        super().__init__(inst_data=inst_data)
        self._preload = (*PRELOAD, *(m for m in preload or () if m not in PRELOAD))
        self._helper: _Helper | None = None
        self._broken: str | None = None  # (why a helper could not start: not tried again by this process)
        self._lock = threading.Lock()  # (the daemon launches runs on threads)
        atexit.register(self._close)

    @classmethod
    def config_type(cls):  # type: ignore[override]
        return {"preload": Field(Array(StringSource), is_required=False,
                                 description="More modules the helper imports before it forks a run (it imports "
                                             "dagster, pyarrow, pandas, lance and mv_assets in any case).")}

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        return cls(inst_data=inst_data, preload=config_value.get("preload"))

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._grpc.types import ExecuteRunArgs
        from dagster._serdes import serialize_value

        run = context.dagster_run
        origin = run.job_code_origin
        why = forkable(origin)
        if origin is None or why is not None:
            self._instance.report_engine_event(f"Run launched by the code server: {why}.", run, cls=self.__class__)
            return super().launch_run(context)
        pointer = origin.repository_origin.code_pointer
        payload = serialize_value(ExecuteRunArgs(job_origin=origin, run_id=run.run_id,
                                                 instance_ref=self._instance.get_ref()))
        start = time.perf_counter()
        try:
            pid, ticks, started = self._fork(payload, getattr(pointer, "working_directory", None))
        except (OSError, RuntimeError, ValueError) as e:
            self._instance.report_engine_event(
                f"Run launched by the code server: the run helper failed ({e}).", run, cls=self.__class__)
            return super().launch_run(context)
        self._instance.add_run_tags(run.run_id, {RUN_PROCESS_TAG: f"{pid}:{ticks}"})
        self._instance.report_engine_event(
            f"Run process {pid} forked from the run helper (dagster, lance and mv_assets imported) in "
            f"{time.perf_counter() - start:.3f} s" + (f" (the helper started first: {started:.2f} s)"
                                                      if started is not None else "") + ".",
            run, cls=self.__class__)

    def _fork(self, payload: str, cwd: str | None) -> tuple[int, int, float | None]:
        """The run's process id and start time, and the helper's import time
        when this call started it."""
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(self._broken)
            started = None
            for attempt in (0, 1):  # (a helper that died, or ran Lance, is started again once)
                if self._helper is None or not self._helper.alive():
                    try:
                        self._helper = _Helper(self._preload)
                    except (OSError, RuntimeError) as e:  # (its imports fail: every later run would pay them)
                        self._broken = f"{e}; not tried again until the daemon restarts"
                        raise RuntimeError(self._broken) from e
                    started = self._helper.seconds
                try:
                    return (*self._helper.fork(payload, cwd), started)
                except (OSError, RuntimeError, ValueError):
                    self._helper.close()
                    self._helper = None
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def _close(self) -> None:
        with self._lock:
            if self._helper is not None:
                self._helper.close()
                self._helper = None

    def dispose(self) -> None:
        self._close()
        super().dispose()

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or RUN_PROCESS_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        pid, ticks = (int(v) for v in run.tags[RUN_PROCESS_TAG].split(":"))
        self._instance.report_run_canceling(run)
        if _start_ticks(pid) != ticks:  # (gone, or its id taken by another process)
            self._instance.report_engine_event(
                f"Run process {pid} is gone; nothing to interrupt.", run, cls=self.__class__)
            return False
        os.kill(pid, signal.SIGINT)  # (as the code server interrupts its run processes)
        return True


def warm_runs_yaml() -> str:
    """The ``run_launcher`` section of a ``dagster.yaml`` with :class:`WarmRunLauncher`."""
    return f"run_launcher:\n  module: {__name__}\n  class: WarmRunLauncher\n"


# -- the helper process ----------------------------------------------------------


def _threads() -> list[str]:
    """The names of this process's threads (Linux; elsewhere none known)."""
    names = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
    return names


def _instance_modules() -> list[str]:
    """The modules of the classes ``$DAGSTER_HOME/dagster.yaml`` names (none
    without it)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or not os.path.exists(os.path.join(home, "dagster.yaml")):
        return []
    from dagster._core.instance.ref import InstanceRef

    ref = InstanceRef.from_dir(home)
    return sorted({str(getattr(v, "module_name")) for v in ref  # noqa: B009 (the fields differ in type)
                   if hasattr(v, "module_name") and hasattr(v, "class_name")})


def _lance_started(names: list[str]) -> bool:
    """Whether Lance's runtime runs in this process (its threads: lance-cpu,
    lance_background..., tokio's workers)."""
    return any(n.startswith(("lance", "tokio")) for n in names)


def _child(request: dict) -> None:
    """In the forked child: what ``dagster api execute_run ARGS`` does, then exit."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (the helper's own setting: its children reaped)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        if request.get("cwd"):
            os.chdir(request["cwd"])
        from dagster._cli.api import api_cli

        try:
            api_cli.main(args=["execute_run", request["args"]], prog_name="dagster api", standalone_mode=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (reported, then the process exits with 1)
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # (a Spark gateway's, logging's)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve(preload: Sequence[str]) -> None:
    """The helper: import ``preload``, then fork a child for each request."""
    import importlib

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    out = os.environ.pop(_STDOUT_FD, None)
    if out is not None:  # (its children print where the launching process prints)
        os.dup2(int(out), 1)
        os.close(int(out))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C on `dagster dev`: its runs are interrupted, not it)
    try:
        for name in [*preload, *_instance_modules()]:
            importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 (said to the launcher, which launches through the code server)
        replies.write(f"failed to import: {type(e).__name__}: {e}\n")
        return
    warnings.filterwarnings("ignore", message="lance is not fork-safe")  # (see the module: it never ran Lance)
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    threads = len(_threads())
    if _lance_started(_threads()):
        replies.write("Lance's runtime started while importing: cannot fork from it\n")
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # (children reaped by the kernel)
    replies.write("ready\n")
    for line in sys.stdin:
        now = _threads()
        if len(now) > threads or _lance_started(now):  # (a thread started since the imports: not forked
            # from; fewer is fine, jemalloc stops its background thread around a fork)
            replies.write(json.dumps({"error": f"the run helper has {len(now)} threads, more than {threads}"})
                          + "\n")
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request)
        replies.write(json.dumps({"pid": pid, "ticks": _start_ticks(pid) or 0}) + "\n")


if __name__ == "__main__":
    _serve(sys.argv[1:])
