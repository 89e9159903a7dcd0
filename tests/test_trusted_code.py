"""Which code a refresher runs (docs/deploy.md, "Security"): by default the
code stored with a view (its pickled UDFs); under ``MV_ASSETS_CODE=declared``
only code the process declared, taken by fingerprint from the modules it
imported, and a stored pickle is never loaded.

The attacker here can write the catalog: they replace a view's stored UDF
pickle with one whose unpickling writes a file. A refresher that loads the
stored code runs it; one that runs declared code only never does, computes
the view with the declared UDF, and refuses a view whose code it was not
given, naming the UDF and what to do.
"""

import base64
import json
import os
import subprocess
import sys
import textwrap

import cloudpickle
import lance
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.model.definition import VIEW_METADATA_KEY

MODULE = textwrap.dedent('''
    import mv_assets as mv

    @mv.udf
    def triple(x: int) -> int:
        return 3 * x

    @mv.udf
    def scaled(x: int, factor: int = 5) -> int:
        return factor * x
''')


class _Planted:
    """What the attacker stores: unpickling it writes a file (any code could run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(view_uri: str, marker: str) -> None:
    """Replace every stored UDF pickle of the view with the attacker's (a plain
    Lance metadata commit: anyone who can write the bucket can make it)."""
    ds = lance.dataset(view_uri)
    md = dict(ds.schema.metadata)
    d = json.loads(md[VIEW_METADATA_KEY.encode()])
    for c in d["columns"]:
        if "udf" in c:
            c["udf"]["pickle"] = base64.b64encode(cloudpickle.dumps(_Planted(marker))).decode("ascii")
    md[VIEW_METADATA_KEY.encode()] = json.dumps(d).encode()
    ds.replace_schema_metadata({k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                                for k, v in md.items()})


def _refresh_in_process(catalog: str, env: dict) -> subprocess.CompletedProcess:
    code = ("import sys, mv_assets as mv; db = mv.connect(sys.argv[1], runner=mv.InlineRunner()); "
            "r = db.open_view('v').refresh(); print('inserted', r.rows_inserted); "
            "print(sorted((row['id'], row['y']) for row in db.open_table('v').to_arrow().to_pylist()))")
    return subprocess.run([sys.executable, "-c", code, catalog], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.fixture
def planted(tmp_path):
    module = tmp_path / "team_udfs.py"
    module.write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import team_udfs  # noqa: PLC0415 - the team's module, as a code location imports it
    finally:
        sys.path.remove(str(tmp_path))
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": team_udfs.triple}))
    src.add([{"id": 5, "x": 5}])
    marker = tmp_path / "planted-code-ran"
    _plant(view.uri, str(marker))
    sys.modules.pop("team_udfs", None)
    return db, module, marker


def test_a_refresher_that_trusts_the_catalog_runs_the_code_stored_there(planted):
    db, _, marker = planted
    out = _refresh_in_process(db.uri, {"MV_ASSETS_CODE": "stored"})
    assert out.returncode != 0 and marker.exists()  # the planted code ran: why the setting exists


def test_declared_code_only_never_loads_a_stored_pickle_and_computes_with_the_declared_udf(planted):
    db, module, marker = planted
    out = _refresh_in_process(db.uri, {"MV_ASSETS_CODE": "declared", "MV_ASSETS_CODE_MODULES": str(module)})
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert out.stdout.splitlines() == ["inserted 6", str([(i, 3 * i) for i in range(6)])]


def test_declared_code_only_refuses_a_view_whose_code_was_not_declared(planted, tmp_path):
    db, module, marker = planted
    out = _refresh_in_process(db.uri, {"MV_ASSETS_CODE": "declared", "MV_ASSETS_CODE_MODULES": ""})
    assert out.returncode != 0 and not marker.exists()
    assert "UDF 'triple' (code fingerprint " in out.stderr and "is not declared in this process" in out.stderr
    assert "MV_ASSETS_CODE_MODULES" in out.stderr
    # other code under the same name is not the declared code either
    other = tmp_path / "other" / "team_udfs.py"
    other.parent.mkdir()
    other.write_text(MODULE.replace("3 * x", "4 * x"))
    out = _refresh_in_process(db.uri, {"MV_ASSETS_CODE": "declared", "MV_ASSETS_CODE_MODULES": str(other)})
    assert out.returncode != 0 and "is not declared in this process" in out.stderr and not marker.exists()
    assert lance.dataset(db.table_uri("v")).count_rows() == 0  # nothing was written


def test_declared_code_matches_captured_values_and_column_bindings(tmp_path, monkeypatch):
    """In process: the UDF objects made here are the declared code; a
    ``(udf, [columns])`` binding and a UDF capturing other values are told
    apart; the stored pickle is never loaded (cloudpickle.loads fails here)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i, "z": 10 * i} for i in range(4)], primary_key="id")

    def times(k):
        @mv.udf(data_type=pa.int64(), name="times")
        def f(x: int) -> int:
            return k * x
        return f

    two, seven = times(2), times(7)
    db.create_materialized_view("v", src.search(None).select({"id": "id", "a": (two, ["z"]), "b": seven}))
    import mv_assets.model.udf as udf_module

    def never(*_a, **_k):
        raise AssertionError("a stored pickle was loaded")

    monkeypatch.setenv("MV_ASSETS_CODE", "declared")
    monkeypatch.setattr(udf_module.cloudpickle, "loads", never)
    db.refresh("v")
    got = sorted((r["id"], r["a"], r["b"]) for r in db.open_table("v").to_arrow().to_pylist())
    assert got == [(i, 2 * 10 * i, 7 * i) for i in range(4)]
    monkeypatch.setenv("MV_ASSETS_CODE", "sometimes")
    with pytest.raises(ValueError, match=r"\$MV_ASSETS_CODE must be one of stored, declared, got 'sometimes'"):
        db.open_view("v").plan_refresh()
