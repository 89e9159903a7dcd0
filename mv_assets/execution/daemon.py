"""A Spark Python daemon that keeps idle Python workers, and their models, alive.

Spark forks its Python workers from a daemon process (``pyspark.daemon``), one
per executor, and reuses a worker for the next task while it is idle
(``spark.python.worker.reuse``). But the executor closes every idle worker once
it has started no Python worker for a minute (``PythonWorkerFactory``: a fixed
``IDLE_WORKER_TIMEOUT``, no setting), and a worker whose socket is closed exits.
A model column's stateful UDF is set up once per worker process (a torch import,
a CUDA context, a model load: seconds each), so every refresh more than a
minute after the last one paid every worker's set-up again.

This daemon speaks the same protocol to the executor (``spark.python.daemon.module
= mv_assets.execution.daemon``) and runs tasks with pyspark's own ``worker``.
One thing differs: a worker whose socket the executor closes between tasks is
*parked* instead of exiting, and the daemon hands it the next connection the
executor opens (the socket passed over a Unix socket pair, ``SCM_RIGHTS``)
instead of forking a fresh process. The worker keeps its imports and its
UDF instances (mv_assets caches them per process), so the refresh after a pause
finds its models set up.

- A parked worker is kept ``$MV_ASSETS_PYTHON_WORKER_KEEP_S`` seconds (900 by
  default; ``0`` parks nothing: pyspark's behaviour), then told to exit. The
  daemon alone decides when one expires, so a connection is never handed to a
  worker on its way out.
- Only a worker whose last task ended cleanly is parked: one whose task failed
  (a non-zero exit code from pyspark's worker), or that the executor killed,
  exits as before.
- The most recently parked worker is handed out first; when none is parked, a
  worker is forked as pyspark's daemon does.
- Stopping the executor stops the daemon, which hangs up its process group:
  parked workers exit with the rest.

This module imports nothing but the standard library, ``mv_assets.model.idle``
and ``pyspark.daemon`` before it forks (no thread may run in a process that forks):
``mv_assets``'s own imports are lazy for this reason.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import time
import traceback
from errno import EAGAIN, EINTR
from typing import NoReturn

from mv_assets.model.idle import DEFAULT_KEEP_S, KEEP_ENV, keep_seconds

__all__ = ["DEFAULT_KEEP_S", "KEEP_ENV", "MODULE", "importable", "keep_seconds", "manager", "settings_for", "spark_settings"]

MODULE = "mv_assets.execution.daemon"
_PARKED = b"P"


def spark_settings(keep: float) -> dict[str, str]:
    """The Spark settings that run this daemon, keeping idle workers ``keep`` seconds."""
    return {"spark.python.daemon.module": MODULE, f"spark.executorEnv.{KEEP_ENV}": f"{keep:g}"}


def settings_for(keep: float | None, local: bool, python: str, environ=os.environ) -> dict[str, str]:
    """The Spark settings of a session (``SparkRunner``) or Connect server
    whose idle Python workers are kept ``keep`` seconds: none when ``keep`` is
    0 or None, nor on a local master whose executors' interpreter (``python``, in
    ``environ``) cannot import this module: every task would fail, so Spark's
    own daemon runs and the log says why. (A cluster's executors are not this
    machine's: the setting is only used there when asked for.)"""
    if not keep:
        return {}
    if local and not importable(python, environ):
        import logging

        logging.getLogger(__name__).warning(
            "idle Python workers are not kept past Spark's one-minute limit: the executors' Python %s cannot import "
            "%s (install mv_assets there, or put it on PYTHONPATH)", python, MODULE)
        return {}
    return spark_settings(keep)


def importable(python: str, environ=os.environ) -> bool:
    """Whether ``python`` -- the executors' interpreter, in this environment --
    can import this module (``spark.python.daemon.module``): if it cannot,
    every task would fail, so the runner keeps Spark's own daemon then."""
    import subprocess

    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({MODULE!r}) is None)"
    try:
        return subprocess.run([python, "-c", probe], env=dict(environ), capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _closed_between_tasks(sock: socket.socket) -> bool:
    """Block until the executor sends the next task or closes the socket:
    True when it closed it (or reset it), False when a task is coming."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _serve(sock: socket.socket, authenticated: bool, reuse: bool) -> bool:
    """One connection's life in a worker: say the worker's pid, run tasks
    while the executor reuses it. True when the executor closed the socket
    between tasks (the worker may be parked), False when it must exit."""
    from pyspark.daemon import worker
    from pyspark.serializers import write_int

    with sock.makefile(mode="wb") as outfile:  # the executor reads the worker's pid first
        write_int(os.getpid(), outfile)
    while True:
        if authenticated and _closed_between_tasks(sock):
            return True
        code = worker(sock, authenticated)
        if code == 0:
            authenticated = True
        if not reuse or code:
            try:  # wait for the executor to close, as pyspark's daemon does
                while sock.recv(1024):
                    pass
            except Exception:
                pass
            return False
        gc.collect()


def _release_device_caches() -> None:
    """A worker being parked (idle a minute at least) gives back the device
    memory its framework caches but does not use: torch's CUDA caching
    allocator's free blocks (the last batches' activations), so a parked
    worker holds its model and CUDA context, not its peak. The next task
    allocates again (milliseconds). Nothing when torch has not set CUDA up."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            gc.collect()  # tensors only cycles still hold
            torch.cuda.empty_cache()
    except Exception:  # a parked worker's tidying never fails it
        pass


def _child(sock: socket.socket, channel: socket.socket | None, authenticated: bool, reuse: bool) -> int:
    """A forked worker: serve connections until one ends in a way that must
    not be parked, or the daemon does not hand it another."""
    while True:
        try:
            parkable = _serve(sock, authenticated, reuse)
        finally:
            sock.close()
        if not parkable or channel is None:
            return 0
        _release_device_caches()
        try:
            channel.sendall(_PARKED)
            _msg, fds, _flags, _addr = socket.recv_fds(channel, 1, 1)
        except OSError:
            return 0
        if not fds:  # the daemon closed the channel: expired, or shutting down
            return 0
        sock = socket.socket(fileno=fds[0])
        authenticated = os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "false").lower() == "true"


def _listen():
    """The daemon's listening socket, as pyspark's daemon opens it, and what
    to tell the executor about it."""
    if os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "false").lower() == "true":
        import uuid

        path = os.path.join(os.environ["PYTHON_WORKER_FACTORY_SOCK_DIR"], f".{uuid.uuid4()}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(max(1024, socket.SOMAXCONN))
        return sock, path, path
    if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true":
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.bind(("::1", 0, 0, 0))
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    sock.listen(max(1024, socket.SOMAXCONN))
    return sock, sock.getsockname()[1], None


class _Daemon:
    """The daemon's state: the workers' channels and which are parked."""

    def __init__(self, keep_s: float, poller) -> None:
        self.keep_s = keep_s
        self.poller = poller
        self.channels: dict[int, tuple[int, socket.socket]] = {}  # channel fd -> (worker pid, channel)
        self.parked: list[tuple[float, int]] = []  # (when, channel fd), oldest first

    def add(self, pid: int, channel: socket.socket) -> None:
        self.channels[channel.fileno()] = (pid, channel)
        self.poller.register(channel, select.POLLIN)

    def forget(self, fd: int) -> None:
        _pid, channel = self.channels.pop(fd)
        self.parked = [(t, f) for t, f in self.parked if f != fd]
        self.poller.unregister(fd)
        channel.close()  # a parked worker reads EOF and exits

    def on_channel(self, fd: int) -> None:
        """A worker parked itself, or exited (its channel closed)."""
        _pid, channel = self.channels[fd]
        try:
            data = channel.recv(16)
        except OSError:
            data = b""
        if data == _PARKED:
            self.parked.append((time.monotonic(), fd))
        else:
            self.forget(fd)

    def expire(self) -> None:
        now = time.monotonic()
        for when, fd in list(self.parked):
            if now - when >= self.keep_s:
                self.forget(fd)

    def hand_to_parked(self, conn: socket.socket) -> bool:
        """Give the connection to the most recently parked worker that takes it."""
        while self.parked:
            _when, fd = self.parked.pop()
            _pid, channel = self.channels[fd]
            try:
                socket.send_fds(channel, [b"S"], [conn.fileno()])
                return True
            except OSError:
                self.forget(fd)
        return False


def manager() -> None:
    """pyspark's daemon loop (``pyspark.daemon.manager``), with parking."""
    from pyspark.serializers import read_int, write_int, write_with_length

    try:
        from pyspark.util import enable_faulthandler
    except ImportError:  # a pyspark whose daemon has none
        from contextlib import nullcontext as enable_faulthandler

    os.setpgid(0, 0)
    listen_sock, listen_port, socket_path = _listen()
    stdin_bin = os.fdopen(sys.stdin.fileno(), "rb", 4)
    stdout_bin = os.fdopen(sys.stdout.fileno(), "wb", 4)
    if socket_path is not None:
        write_with_length(socket_path.encode("utf-8"), stdout_bin)
    else:
        write_int(listen_port, stdout_bin)
    stdout_bin.flush()

    def shutdown(code: int) -> NoReturn:
        if socket_path is not None and os.path.exists(socket_path):
            os.remove(socket_path)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(0, signal.SIGHUP)  # the workers, parked ones too, exit
        sys.exit(code)

    signal.signal(signal.SIGTERM, lambda *_: shutdown(1))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        keep_s = keep_seconds()
    except ValueError as exc:  # the driver checks it first; never fail every task for it here
        print(f"mv_assets daemon: {exc}; idle workers are not kept", file=sys.stderr)
        keep_s = 0.0
    park = bool(os.environ.get("SPARK_REUSE_WORKER")) and keep_s > 0
    poller = select.poll()
    poller.register(0, select.POLLIN)
    poller.register(listen_sock, select.POLLIN)
    state = _Daemon(keep_s, poller)
    try:
        while True:
            events = poller.poll(1000)
            state.expire()
            # workers parking themselves first: a connection that comes at once then finds them
            for fd, event in sorted(events, key=lambda e: e[0] == listen_sock.fileno()):
                if not event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    continue
                if fd == 0:
                    try:
                        worker_pid = read_int(stdin_bin)
                    except EOFError:  # the executor told us to exit by closing stdin
                        shutdown(0)
                    try:
                        os.kill(worker_pid, signal.SIGKILL)
                    except OSError:
                        pass
                elif fd == listen_sock.fileno():
                    try:
                        conn, _ = listen_sock.accept()
                    except OSError as e:
                        if e.errno == EINTR:
                            continue
                        raise
                    if state.hand_to_parked(conn):
                        conn.close()  # the worker holds its own copy
                        continue
                    forked = _fork_worker(conn, listen_sock, poller, park, enable_faulthandler,
                                          [c for _pid, c in state.channels.values()])
                    if forked is not None:
                        state.add(*forked)
                elif fd in state.channels:
                    state.on_channel(fd)
    finally:
        shutdown(1)


def _fork_worker(conn, listen_sock, poller, park: bool, enable_faulthandler,
                 others) -> tuple[int, socket.socket] | None:
    """Fork a worker for the connection (as pyspark's daemon does); with
    ``park`` it gets a channel to the daemon. Returns (pid, the daemon's end)
    or None when the fork failed (the executor is told)."""
    from pyspark.serializers import write_int

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if park else (None, None)
    try:
        pid = os.fork()
    except OSError as e:
        if e.errno in (EAGAIN, EINTR):
            time.sleep(1)
            pid = os.fork()
        else:
            with conn.makefile(mode="wb") as outfile:
                write_int(e.errno, outfile)
            conn.close()
            for s in (ours, theirs):
                if s is not None:
                    s.close()
            return None
    if pid == 0:
        code = 1
        try:
            with enable_faulthandler():
                poller.unregister(0)
                poller.unregister(listen_sock)
                listen_sock.close()
                for channel in [theirs, *others]:  # else a channel the daemon closes stays open here
                    if channel is not None:
                        channel.close()
                devnull = open(os.devnull, encoding="utf-8")  # SPARK-26175: fd 0 stays taken
                os.dup2(devnull.fileno(), 0)
                devnull.close()
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
                authenticated = os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "false").lower() == "true"
                code = _child(conn, ours, authenticated, bool(os.environ.get("SPARK_REUSE_WORKER")))
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(code)
    conn.close()
    if ours is None or theirs is None:
        return None
    ours.close()
    return pid, theirs


if __name__ == "__main__":
    manager()
