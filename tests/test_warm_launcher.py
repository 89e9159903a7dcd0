"""The demo's run launcher (mv_assets.dagster.warm_launcher): each run's
process forked from a helper that imported dagster, lance and mv_assets once.

A real `dagster dev` on 127.0.0.1 with the demo's dagster.yaml (the run queue,
so the daemon launches) and a small code location: a run's process is a child
of the helper, reads the code location's file as it is at launch, fails with
its own error, is interrupted by "Terminate", and a run after each still
starts from the same helper; a helper killed is replaced at the next launch.
"""

import json
import os
import signal
import sys
import textwrap

import pytest

from mv_assets.dagster.devserver import dagster_dev, graphql, wait_until
from mv_assets.dagster.warm_launcher import RUN_PROCESS_TAG, forkable

pytestmark = [pytest.mark.e2e]

CODE = '''
import json, os, time
import dagster as dg

VALUE = {value!r}


@dg.asset
def where():
    """Where this run's process came from, and which VALUE it read."""
    with open(f"/proc/{{os.getppid()}}/cmdline", "rb") as f:
        parent = f.read().replace(b"\\0", b" ").decode()
    with open(os.environ["WARM_TEST_OUT"], "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "parent": parent, "value": VALUE,
                            "lance_loaded": "lance" in __import__("sys").modules}}) + "\\n")


@dg.asset
def slow():
    time.sleep(300)


@dg.asset
def broken():
    raise ValueError("broken on purpose")


defs = dg.Definitions(assets=[where, slow, broken], jobs=[
    dg.define_asset_job("where_job", [where]), dg.define_asset_job("slow_job", [slow]),
    dg.define_asset_job("broken_job", [broken])], executor=dg.in_process_executor)
'''


def _origin(executable=sys.executable, entry_point=None, container_image=None):
    from dagster._core.code_pointer import FileCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin

    repo = RepositoryPythonOrigin(executable_path=executable, code_pointer=FileCodePointer("defs.py", "defs"),
                                  container_image=container_image, entry_point=entry_point)
    return JobPythonOrigin("where_job", repo)


def test_which_runs_are_forked():
    assert forkable(_origin()) is None
    assert forkable(_origin(entry_point=[sys.executable, "-m", "dagster"])) is None
    assert forkable(_origin(entry_point=["dagster"])) is None
    assert "another Python" in forkable(_origin(executable="/usr/bin/python3.9"))
    assert "container image" in forkable(_origin(container_image="img:1"))
    assert "entry point" in forkable(_origin(entry_point=["my-dagster-wrapper"]))
    assert "no code origin" in forkable(None)


def test_runs_forked_from_the_helper(tmp_path):
    code = tmp_path / "defs.py"
    code.write_text(CODE.format(value="A"))
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(textwrap.dedent("""\
        load_from:
          - python_file:
              relative_path: defs.py
              location_name: warm
    """))
    out = tmp_path / "out.jsonl"
    home = tmp_path / "home"
    env = {"WARM_TEST_OUT": str(out)}
    with dagster_dev(str(workspace), str(home), env, str(tmp_path / "dagster_dev.log"), immediate_runs=True) as base:
        assert "mv_assets.dagster.warm_launcher" in (home / "dagster.yaml").read_text()

        def gql(query, **variables):
            return graphql(base, query, **variables)

        repo = wait_until(
            lambda: (gql("{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }")
                     ["repositoriesOrError"].get("nodes") or [None])[0],
            60, "the code location",
        )

        def launch(job):
            got = gql("""mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
                           ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
                      p={"selector": {"repositoryLocationName": repo["location"]["name"],
                                      "repositoryName": repo["name"], "jobName": job}, "runConfigData": {}})
            assert got["launchRun"]["__typename"] == "LaunchRunSuccess", got
            return got["launchRun"]["run"]["runId"]

        def run_of(run_id):
            return gql("""query($id: ID!) { runOrError(runId: $id) { ... on Run { status tags { key value }
                            eventConnection { events { __typename ... on MessageEvent { message } } } } } }""",
                       id=run_id)["runOrError"]

        def finished(run_id, status):
            def done():
                run = run_of(run_id)
                return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None
            run = wait_until(done, 180, f"run {run_id}", 0.5)
            assert run["status"] == status, run
            return run

        def process(run):
            (tag,) = [t["value"] for t in run["tags"] if t["key"] == RUN_PROCESS_TAG]
            return int(tag.split(":")[0])

        # A run: its process is a child of the helper, which had imported lance already.
        first = finished(launch("where_job"), "SUCCESS")
        record = json.loads(out.read_text().splitlines()[-1])
        assert record["pid"] == process(first)
        assert "mv_assets.dagster.warm_launcher" in record["parent"], record
        assert record["value"] == "A" and record["lance_loaded"]
        assert any("forked from the run helper" in (e.get("message") or "")
                   for e in first["eventConnection"]["events"])

        # The code location's file changed (no reload): the next run reads it as it is now.
        code.write_text(CODE.format(value="B"))
        second = finished(launch("where_job"), "SUCCESS")
        record2 = json.loads(out.read_text().splitlines()[-1])
        assert record2["value"] == "B" and record2["ppid"] == record["ppid"]  # (the same helper)
        assert process(second) != process(first)

        # A failing run fails with its own error; the helper serves the next run.
        failed = finished(launch("broken_job"), "FAILURE")
        assert any("broken on purpose" in (e.get("message") or "") for e in failed["eventConnection"]["events"]) \
            or "broken on purpose" in (tmp_path / "dagster_dev.log").read_text()

        # Terminate: the run's process is interrupted and the run ends CANCELED.
        slow = launch("slow_job")
        wait_until(lambda: run_of(slow)["status"] == "STARTED", 120, "the slow run to start", 0.5)
        pid = process(run_of(slow))
        got = gql("""mutation($id: String!) { terminateRun(runId: $id) { __typename
                       ... on TerminateRunFailure { message } ... on PythonError { message } } }""", id=slow)
        assert got["terminateRun"]["__typename"] == "TerminateRunSuccess", got
        finished(slow, "CANCELED")
        wait_until(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 30, "the run's process to end", 0.5)

        third = finished(launch("where_job"), "SUCCESS")
        assert json.loads(out.read_text().splitlines()[-1])["ppid"] == record["ppid"]
        assert process(third) not in (process(first), process(second))

        # The helper gone (killed): the next run starts another and runs from it.
        os.kill(record["ppid"], signal.SIGKILL)
        fourth = finished(launch("where_job"), "SUCCESS")
        record4 = json.loads(out.read_text().splitlines()[-1])
        assert record4["ppid"] != record["ppid"] and "mv_assets.dagster.warm_launcher" in record4["parent"]
        assert any("the helper started first" in (e.get("message") or "")
                   for e in fourth["eventConnection"]["events"])


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_helper_that_cannot_serve_says_why(tmp_path, monkeypatch):
    """A helper whose imports fail, or that would fork a process already
    running Lance's runtime, never says ready: the launcher then launches
    through the code server (launch_run's fallback), with this message."""
    from mv_assets.dagster.warm_launcher import _Helper

    with pytest.raises(RuntimeError, match="did not start: failed to import: ModuleNotFoundError"):
        _Helper(("no_such_module_for_the_helper",))
    (tmp_path / "uses_lance.py").write_text(
        "import lance, pyarrow as pa\n"
        f"lance.write_dataset(pa.table({{'a': [1]}}), {str(tmp_path / 't.lance')!r})\n"
        f"lance.dataset({str(tmp_path / 't.lance')!r}).to_table()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="Lance's runtime started while importing"):
        _Helper(("uses_lance",))
    helper = _Helper(("json",))  # (and one that can: forks, reports the child)
    try:
        pid, ticks = helper.fork('{"not": "run args"}', str(tmp_path))
        assert pid > 0 and ticks > 0
    finally:
        helper.close()
    assert not helper.alive()


def test_a_launcher_whose_helper_cannot_start_stops_trying(monkeypatch):
    """Each later run would pay the failing imports again: after one failure
    the launcher goes straight to the code server (launch_run's fallback)."""
    from mv_assets.dagster import warm_launcher

    made = []

    class Counted(warm_launcher._Helper):
        def __init__(self, preload):
            made.append(preload)
            super().__init__(preload)

    monkeypatch.setattr(warm_launcher, "_Helper", Counted)
    launcher = warm_launcher.WarmRunLauncher(preload=["no_such_module_for_the_helper", "dagster"])
    assert launcher._preload == (*warm_launcher.PRELOAD, "no_such_module_for_the_helper")  # (added, not replaced)
    with pytest.raises(RuntimeError, match="failed to import"):
        launcher._fork("{}", None)
    with pytest.raises(RuntimeError, match="not tried again until the daemon restarts"):
        launcher._fork("{}", None)
    assert len(made) == 1
