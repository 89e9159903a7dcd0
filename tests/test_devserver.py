"""What mv_assets.dagster.devserver prepares before `dagster dev` starts: the
bytecode of mv_assets cached, so that a run's process (a new Python each run)
does not compile every module again where the environment forbids Python to
write bytecode itself (PYTHONDONTWRITEBYTECODE=1)."""

import importlib.util
import os
import subprocess
import sys

from mv_assets.dagster.devserver import cache_bytecode


def test_the_bytecode_is_cached_whatever_the_environment_says(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    assert cache_bytecode(str(package))
    modules = [package / "__init__.py", package / "sub" / "__init__.py", package / "sub" / "mod.py"]
    cached = [importlib.util.cache_from_source(str(m)) for m in modules]
    assert all(os.path.exists(c) for c in cached), cached
    # a new process that may not write bytecode imports the module from what was cached
    code = "import importlib.util, sys, pkg.sub.mod as m; print(m.__spec__.cached, sys.flags.dont_write_bytecode)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [cached[2], "1"]
    # a module changed since is compiled again, the others are left as they are
    before = os.stat(cached[0]).st_mtime_ns
    (package / "sub" / "mod.py").write_text("VALUE = 2  # changed\n")
    later = os.stat(package / "sub" / "mod.py").st_mtime + 2  # (bytecode records its source's time in seconds)
    os.utime(package / "sub" / "mod.py", (later, later))
    stale = os.stat(cached[2]).st_mtime_ns
    assert cache_bytecode(str(package))
    assert os.stat(cached[2]).st_mtime_ns > stale and os.stat(cached[0]).st_mtime_ns == before


def test_a_module_that_does_not_compile_is_reported_and_the_others_are_cached(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "good.py").write_text("VALUE = 1\n")
    (package / "bad.py").write_text("def broken(:\n")
    assert cache_bytecode(str(package)) is False
    assert os.path.exists(importlib.util.cache_from_source(str(package / "good.py")))
