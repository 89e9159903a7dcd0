import atexit
import os
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("LANCE_LOG", "error")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# join views' arrangements saved between processes: a directory of this session's, not ~/.cache
if "MV_ASSETS_ARRANGEMENT_DIR" not in os.environ:
    os.environ["MV_ASSETS_ARRANGEMENT_DIR"] = tempfile.mkdtemp(prefix="mv-arrangements-")
    atexit.register(shutil.rmtree, os.environ["MV_ASSETS_ARRANGEMENT_DIR"], True)  # (removed with the session)
sys.path.insert(0, os.path.dirname(__file__))

import mv_assets  # noqa: E402
from mv_assets.execution.spark import SparkRunner, set_default_runner  # noqa: E402


@pytest.fixture(scope="session")
def spark_runner():
    """One local Spark (2 cores) for the whole run; started on first use."""
    runner = SparkRunner(master=os.environ.get("MV_ASSETS_SPARK_MASTER", "local[2]"), local_below_rows=0)  # always a Spark job
    yield runner
    runner.stop()


@pytest.fixture(autouse=True)
def _no_global_runner():
    """Tests pick their runner explicitly; nothing leaks between tests."""
    set_default_runner(None)
    yield
    set_default_runner(None)


@pytest.fixture
def db(tmp_path):
    """A catalog whose refreshes run inline (no JVM): for engine semantics."""
    return mv_assets.connect(str(tmp_path / "catalog"), runner=mv_assets.InlineRunner())


@pytest.fixture
def spark_db(tmp_path, spark_runner):
    """A catalog whose refreshes run on real Spark."""
    return mv_assets.connect(str(tmp_path / "catalog"), runner=spark_runner)


@pytest.fixture
def call_log(tmp_path):
    """A directory where UDFs record each call, one file per worker process."""
    d = tmp_path / "calls"
    d.mkdir()
    return str(d)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Expose each phase's report to fixtures (``request.node.rep_call``), so
    the browser test keeps its screenshots when it fails."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole run (started on first use)."""
    from s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()
