"""The local Spark Connect server (``mv_assets.execution.connect_server``) on
every pyspark the project allows (4.0-4.3).

pyspark's PyPI packages ship ``sbin/start-connect-server.sh`` and
``stop-connect-server.sh`` from 4.3.0 on; 4.0-4.2 ship ``spark-daemon.sh``
and the server's jar without them, and ``start`` failed there (exit 127).
Checked with this machine's pyspark laid out as those packages are: a real
server starts, answers a client, and stops leaving nothing behind."""

import os
import subprocess
import sys
import time

import pyspark

from mv_assets.dagster.devserver import free_port
from mv_assets.execution import connect_server

_CLIENT = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(spark.range(5).selectExpr("sum(id) AS s").collect()[0]["s"])
"""


def _package_without_the_connect_scripts(root) -> str:
    """A pyspark package tree as 4.0-4.2 lay it out: this one's files, linked,
    but ``sbin/*-connect-server.sh``."""
    real = os.path.dirname(pyspark.__file__)
    home = root / "pyspark"
    home.mkdir()
    for entry in os.listdir(real):
        if entry != "sbin":
            (home / entry).symlink_to(os.path.join(real, entry))
    (home / "sbin").mkdir()
    for entry in os.listdir(os.path.join(real, "sbin")):
        if not entry.endswith("-connect-server.sh"):
            (home / "sbin" / entry).symlink_to(os.path.join(real, "sbin", entry))
    return str(home)


def test_a_pyspark_without_the_connect_server_scripts_starts_and_stops_the_server(tmp_path, monkeypatch):
    home = _package_without_the_connect_scripts(tmp_path)
    monkeypatch.setattr(connect_server, "_spark_home", lambda: home)
    assert connect_server._server_command("start")[:3] == ["bash", os.path.join(home, "sbin", "spark-daemon.sh"),
                                                          "submit"]
    state = str(tmp_path / "state")
    port = free_port()
    url = connect_server.start(port=port, master="local[1]", state_dir=state)
    try:
        pid = connect_server._owned_pid(state)
        assert pid is not None and connect_server.is_listening(port)
        script = tmp_path / "client.py"
        script.write_text(_CLIENT)
        out = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().splitlines()[-1] == "10"
    finally:
        connect_server.stop(state)
    deadline = time.monotonic() + 60
    while connect_server.is_listening(port) or connect_server._owned_pid(state) is not None:
        assert time.monotonic() < deadline, "the server is still running after stop"
        time.sleep(0.5)


def test_a_spark_connect_url_nobody_answers_fails_in_seconds_in_words(tmp_path):
    """A refresh on Spark Connect at a URL where no server runs (a typo, a
    server not started): pyspark retried its first call for about ten
    minutes, saying nothing. Now: a clear error at once, the lock released,
    the failure in the view's status, nothing committed; a second refresh
    says the same."""
    port = free_port()  # nothing listens there
    code = f"""
import sys, mv_assets as mv
db = mv.connect(sys.argv[1], runner=mv.SparkRunner(remote="sc://127.0.0.1:{port}", local_below_rows=0))
t = db.create_table("t", [{{"id": i, "x": i}} for i in range(10)])
v = db.create_materialized_view("v", t.search(None).select({{"id": "id", "y": "x * 2"}}))
for _ in range(2):
    try:
        v.refresh(lock_timeout=5)
    except ConnectionError as exc:
        print("refused:", exc)
st = v.status()
print("error:", st.last_error)
print("status:", st.load_state, v.count_rows())
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cat")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    refused = [line for line in lines if line.startswith("refused:")]
    assert len(refused) == 2
    assert f"no Spark Connect server answers at sc://127.0.0.1:{port}" in refused[0]
    assert "spark_remote / MV_ASSETS_SPARK_REMOTE" in refused[0]
    assert lines[-1] == "status: FAILED_LOAD 0"
    assert "no Spark Connect server answers" in lines[-2]


def test_a_spark_connect_token_is_never_stored_or_said_and_a_bad_timeout_is_named(tmp_path):
    """A Spark Connect URL carrying its token (``;token=...``, pyspark's way)
    and no server there: the error says where (host, port, the other
    parameters) with the token as ***, and neither the view's status nor any
    file of the catalog holds the token (before: the whole URL, token and all,
    in the error and in the status file). $MV_ASSETS_SPARK_CONNECT_TIMEOUT
    written with a unit is named in words (before: "could not convert string
    to float: '10s'"), nothing committed."""
    port = free_port()  # nothing listens there
    code = f"""
import os, sys, mv_assets as mv
db = mv.connect(sys.argv[1], runner=mv.InlineRunner())
t = db.create_table("t", [{{"id": i, "x": i}} for i in range(10)])
db.create_materialized_view("v", t.search(None).select({{"id": "id", "y": "x * 2"}}))
db = mv.connect(sys.argv[1], runner=mv.SparkRunner(remote="sc://127.0.0.1:{port}/;use_ssl=true;token=SECRET123",
                                                  local_below_rows=0))
v = db.open_view("v")
try:
    v.refresh(lock_timeout=5)
except ConnectionError as exc:
    print("refused:", exc)
print("error:", v.status().last_error)
os.environ["MV_ASSETS_SPARK_CONNECT_TIMEOUT"] = "10s"
try:
    v.refresh(lock_timeout=5)
except ValueError as exc:
    print("timeout:", exc)
print("status:", v.status().load_state, v.count_rows(), v.version)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cat")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SECRET123" not in out.stdout + out.stderr
    lines = out.stdout.splitlines()
    (refused,) = [line for line in lines if line.startswith("refused:")]
    assert f"no Spark Connect server answers at sc://127.0.0.1:{port}/;use_ssl=true;token=*** " in refused
    (error,) = [line for line in lines if line.startswith("error:")]
    assert "token=***" in error
    (timeout,) = [line for line in lines if line.startswith("timeout:")]
    assert "$MV_ASSETS_SPARK_CONNECT_TIMEOUT must be a number of seconds above 0 (e.g. 10 or 2.5), got '10s'" in timeout
    assert lines[-1] == "status: FAILED_LOAD 0 1"
    for path in (tmp_path / "cat").rglob("*"):
        if path.is_file():
            assert b"SECRET123" not in path.read_bytes(), path


def test_redact_hides_credential_values_only():
    from mv_assets.model.secrets import redact

    assert redact("sc://h:1/;use_ssl=true;token=abc;user_id=me") == "sc://h:1/;use_ssl=true;token=***;user_id=me"
    assert redact("s3://b/k?aws_secret_access_key=XYZ&region=us") == "s3://b/k?aws_secret_access_key=***&region=us"
    assert redact("PASSWORD=hunter2 and Token=t") == "PASSWORD=*** and Token=***"
    assert redact("no secrets: tokens counted 3") == "no secrets: tokens counted 3"
