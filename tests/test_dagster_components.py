"""Dagster Components (mv_assets/dagster/components.py): a dg project built in a
tmp dir with the real `dg` CLI (scaffold, check, list), the graph its defs.yaml
files load to, one materialization through Dagster, and the demo's views as
components (examples/components) giving the Python module way's assets."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import lance
import pyarrow.compute as pc
import pytest

import mv_assets as mv
from mv_assets.dagster import build_definitions
from mv_assets.dagster.components import CatalogComponent, ComponentError, ViewComponent, parse_policy
from mv_assets.dagster.definitions import partitions_def_name

K = dg.AssetKey
REPO = Path(__file__).resolve().parent.parent
DG = shutil.which("dg", path=os.path.dirname(sys.executable)) or "dg"

UDFS = '''
import mv_assets as mv


@mv.udf
def double(x: int) -> int:
    return 2 * x
'''

DEFINITIONS = '''
from pathlib import Path

import dagster as dg


@dg.definitions
def defs():
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent.parent)
'''


def _project(root: Path, module: str) -> Path:
    """A minimal dg project (what create-dagster writes, less the venv)."""
    root.mkdir()
    (root / "pyproject.toml").write_text(textwrap.dedent(f'''
        [project]
        name = "{module}"
        version = "0.1.0"

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "{module}"
    '''))
    pkg = root / module
    (pkg / "defs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "defs" / "__init__.py").write_text("")
    (pkg / "definitions.py").write_text(DEFINITIONS)
    (pkg / "udfs.py").write_text(UDFS)
    return pkg


def _dg(project: Path, *args: str, uri: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MV_ASSETS_DB": uri, "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), "COLUMNS": "200"}
    return subprocess.run([DG, *args], cwd=project, env=env, capture_output=True, text=True, timeout=120)


def _catalog(path: Path) -> mv.Connection:
    db = mv.connect(str(path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i, "s": f"r{i}"} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i, "s": f"r{i}"} for i in range(6, 10)])
    return db


def _files(path: Path) -> dict[str, float]:
    """Every file of the catalog with its modification time, but the
    catalog's summaries: a cache of what each dataset is, which a load may
    write (storage.summaries), never a table or a view."""
    return {str(p): p.stat().st_mtime for p in path.rglob("*") if p.is_file() and p.name != "summaries.json"}


def _load(project: Path, module: str) -> dg.Definitions:
    """The project's definitions loaded in this process, as `dg` and `dagster dev` load them."""
    sys.path.insert(0, str(project))
    try:
        return dg.load_from_defs_folder(path_within_project=project / module)
    finally:
        sys.path.remove(str(project))


def _load_error(project: Path, module: str) -> str:
    """What loading the project says (the component tree's error, then its causes)."""
    try:
        _load(project, module)
    except Exception as exc:  # (dagster's ComponentTreeException, raised from ours)
        said, cause = [], exc
        while cause is not None:
            said.append(str(cause))
            cause = cause.__cause__
        return "\n".join(said)
    raise AssertionError("the project loaded")


def _fill(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip())


def test_scaffold_check_list_load_and_materialize_views_declared_in_yaml(tmp_path, monkeypatch):
    db = _catalog(tmp_path / "cat")
    project, module = tmp_path / "proj", "mv_components_proj"
    pkg = _project(project, module)
    # the real dg: scaffold the catalog and a view (commented templates)
    for kind, name in (("CatalogComponent", "catalog"), ("ViewComponent", "big")):
        out = _dg(project, "scaffold", "defs", f"mv_assets.{kind}", name, uri=db.uri)
        assert out.returncode == 0, out.stdout + out.stderr
    template = (pkg / "defs" / "big" / "defs.yaml").read_text()
    assert template.startswith("type: mv_assets.ViewComponent") and "name: big" in template
    assert "udf: mv_assets.demo:word_count" in template and "# refresh_policy: eager" in template
    assert "type: mv_assets.CatalogComponent" in (pkg / "defs" / "catalog" / "defs.yaml").read_text()
    # the user fills them in: two views over one source, a UDF of the project's own module
    _fill(pkg / "defs" / "catalog" / "defs.yaml", """
        type: mv_assets.CatalogComponent
        attributes:
          runner: inline
    """)
    _fill(pkg / "defs" / "big" / "defs.yaml", f"""
        type: mv_assets.ViewComponent
        attributes:
          name: big
          source: src
          filter: "x > 2"
          columns:
            id: id
            label: upper(s)
            y:
              udf: {module}.udfs:double
          refresh_policy: {{kind: cron, cron: "0 6 * * *"}}
          owners: ["team:ml"]
          tags: {{domain: demo}}
    """)
    (pkg / "defs" / "small").mkdir()
    _fill(pkg / "defs" / "small" / "defs.yaml", """
        type: mv_assets.ViewComponent
        attributes:
          name: small
          source: src
          filter: "x <= 2"
          refresh_policy: manual
    """)
    before = _files(tmp_path / "cat")
    check = _dg(project, "check", "defs", uri=db.uri)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "All definitions loaded successfully" in check.stdout + check.stderr
    listed = _dg(project, "list", "defs", "--json", uri=db.uri)
    assert listed.returncode == 0, listed.stderr
    defs_json = json.loads(listed.stdout)
    keys = [a["asset_key"] for a in defs_json["assets"]]
    assert sorted(keys) == ["big", "big/y", "small", "src"]  # the shared source once
    # the lineage's refresh job, and its full checks (a checks-only job, run on demand or daily)
    assert sorted(j["name"] for j in defs_json["jobs"]) == ["full_checks_src", "refresh_src"]
    assert {s["name"] for s in defs_json["sensors"]} == {"src_changes"}
    # big's cron policy, and the daily full checks (stopped unless asked for)
    assert sorted(s["name"] for s in defs_json["schedules"]) == ["big_schedule", "full_checks_src_daily"]
    # in process: the same graph, with what the yaml said
    monkeypatch.setenv("MV_ASSETS_DB", db.uri)
    defs = _load(project, module)
    graph = defs.get_repository_def().asset_graph
    assert graph.get_all_asset_keys() == {K("big"), K(["big", "y"]), K("small"), K("src")}
    big = graph.get(K("big"))
    assert big.owners == ["team:ml"] and big.tags["domain"] == "demo" and big.tags["mv_assets/policy"] == "cron"
    assert graph.get(K("small")).tags["mv_assets/policy"] == "manual"
    assert set(graph.get(K("big")).parent_keys) == {K("src")}
    assert _files(tmp_path / "cat") == before  # loading wrote nothing (the views are not created yet)
    assert "big" not in db.table_names()
    # one materialization creates the view from its yaml and fills it
    with dg.instance_for_test() as instance:
        frags = [str(f.fragment_id) for f in lance.dataset(db.table_uri("src")).get_fragments()]
        instance.add_dynamic_partitions(partitions_def_name("src"), frags)
        tags = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[K("big"), K(["big", "y"])], tags=tags).success
    src = db.open_table("src").to_arrow()
    want = src.filter(pc.greater(src["x"], 2))
    expected = sorted(zip(want["id"].to_pylist(), [s.upper() for s in want["s"].to_pylist()],
                          [2 * x for x in want["x"].to_pylist()], strict=True))
    got = db.open_table("big").to_arrow()
    assert sorted(zip(got["id"].to_pylist(), got["label"].to_pylist(), got["y"].to_pylist(), strict=True)) == expected
    view = db.open_table("big")
    assert view.refresh_policy == mv.RefreshPolicy.cron_schedule("0 6 * * *")  # type: ignore[attr-defined]
    assert view.owners == ["team:ml"] and view.tags == {"domain": "demo"}  # type: ignore[attr-defined]
    # a bad yaml fails `dg check defs`, naming the file and saying what is wrong
    _fill(pkg / "defs" / "small" / "defs.yaml", f"""
        type: mv_assets.ViewComponent
        attributes:
          name: small
          source: src
          columns:
            y:
              udf: {module}.udfs:triple
    """)
    bad = _dg(project, "check", "defs", uri=db.uri)
    text = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "small" in text and "defs.yaml (ViewComponent) (error)" in text
    assert f"column 'y': module '{module}.udfs' has no 'triple' (UDF '{module}.udfs:triple')" in text


def test_a_view_mistake_only_the_catalog_shows_fails_that_views_defs_yaml(tmp_path):
    """A ViewComponent naming a column its source lacks (found only against
    the catalog): `dg check defs` marks that view's defs.yaml as the error,
    whether its folder comes before or after the catalog's (before: the
    CatalogComponent's defs.yaml was blamed, the view's shown as built)."""
    db = _catalog(tmp_path / "cat")
    for view in ("aaa", "zzz"):  # (folders built before, and after, the catalog's)
        project, module = tmp_path / f"proj_{view}", f"mv_components_{view}"
        pkg = _project(project, module)
        for kind, name in (("CatalogComponent", "catalog"), ("ViewComponent", view)):
            out = _dg(project, "scaffold", "defs", f"mv_assets.{kind}", name, uri=db.uri)
            assert out.returncode == 0, out.stdout + out.stderr
        _fill(pkg / "defs" / "catalog" / "defs.yaml", """
            type: mv_assets.CatalogComponent
            attributes:
              runner: inline
        """)
        _fill(pkg / "defs" / view / "defs.yaml", f"""
            type: mv_assets.ViewComponent
            attributes:
              name: {view}
              source: src
              columns:
                id: id
                z: no_such_column + 1
        """)
        bad = _dg(project, "check", "defs", uri=db.uri)
        text = bad.stdout + bad.stderr
        assert bad.returncode != 0
        assert f"Error while building definitions for {view}" in text, text
        assert "defs.yaml (ViewComponent) (error)" in text and "defs.yaml (CatalogComponent) (error)" not in text
        assert f"view '{view}' (mv_assets.ViewComponent): invalid query over 'src'" in text
        assert "No field named no_such_column" in text
    assert db.table_names() == ["src"]


def _view(**kw) -> ViewComponent:
    return ViewComponent(**{"name": "v", "source": "src", **kw})


def test_yaml_mistakes_are_said_clearly_before_anything_is_written(tmp_path):
    db = _catalog(tmp_path / "cat")
    with pytest.raises(ValueError, match=r"a UDF is referenced as 'module:function'.*got 'double'"):
        _view(columns={"y": {"udf": "double"}})
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module' of UDF 'no_such_module:f'"):
        _view(columns={"y": {"udf": "no_such_module:f"}})
    with pytest.raises(ValueError, match=r"'mv_assets.demo:WORDS' is a list, not a UDF: decorate it with @mv.udf"):
        _view(columns={"y": {"udf": "mv_assets.demo:WORDS"}})
    with pytest.raises(ValueError, match=r"a column is a source column name, a SQL expression or"):
        _view(columns={"y": {"sql": "x + 1"}})
    with pytest.raises(ValueError, match=r"refresh_policy kind must be one of eager, ttl, cron, staleness, manual"):
        _view(refresh_policy="hourly")
    with pytest.raises(ValueError, match=r"refresh_policy of kind 'ttl' takes \['kind', 'ttl_seconds'\]"):
        _view(refresh_policy={"kind": "ttl", "cron": "0 * * * *"})
    assert parse_policy({"kind": "ttl", "ttl_seconds": 60}, "x") == mv.RefreshPolicy.ttl(60)
    assert parse_policy({"kind": "staleness", "max_staleness_pct": 10}, "x") == mv.RefreshPolicy.staleness(10)
    with pytest.raises(ValueError, match=r"owner"):
        _view(owners=[""])
    # against the catalog (at load, before any write)
    with pytest.raises(ComponentError, match=r"source 'nope' is not a table or view of .*\(it has src\)"):
        _view(source="nope").declared(db)
    with pytest.raises(ComponentError, match=r"view 'v' \(mv_assets.ViewComponent\): .*no_such_column"):
        _view(columns={"id": "id", "z": "no_such_column + 1"}).declared(db)
    with pytest.raises(ComponentError, match=r"view 'v' \(mv_assets.ViewComponent\): .*"):
        _view(columns={"y": {"udf": "mv_assets.demo:word_count"}}).declared(db)  # the source has no body
    bound = _view(columns={"id": "id", "n": {"udf": "mv_assets.demo:word_count", "inputs": ["s"]}}).declared(db)
    assert [c.name for c in bound.to_definition().udf_columns] == ["n"]  # word_count(body) reads s
    with pytest.raises(ValueError, match=r"automation must be one of sensor, conditions, got 'cron'"):
        CatalogComponent(catalog=db.uri, automation="cron")
    with pytest.raises(ValueError, match=r"runner must be 'spark' or 'inline', got 'ray'"):
        CatalogComponent(catalog=db.uri, runner="ray")
    assert db.table_names() == ["src"]


def test_the_demo_views_as_components_give_the_python_module_assets(tmp_path, monkeypatch):
    """examples/components declares doc_features and long_docs in yaml: the
    same assets (and UDF code versions) as definitions.py's mv_assets.demo."""
    from mv_assets.demo import seed

    db = seed(str(tmp_path / "demo"))
    monkeypatch.setenv("MV_ASSETS_DB", db.uri)
    before = _files(tmp_path / "demo")
    components = _load(REPO / "examples" / "components", "demo_components").get_repository_def()
    module = build_definitions(db, views="mv_assets.demo").get_repository_def()
    assert _files(tmp_path / "demo") == before
    keys = components.asset_graph.get_all_asset_keys()
    assert keys == module.asset_graph.get_all_asset_keys()
    assert {K("doc_features"), K(["doc_features", "words"]), K("long_docs"), K("documents")} <= keys
    for key in keys:
        assert components.asset_graph.get(key).code_version == module.asset_graph.get(key).code_version, key
    # declared (by yaml, by code): the catalog follows them, their UDF columns carry the code check
    check = dg.AssetCheckKey(K(["doc_features", "words"]), "udf_code_current")
    assert check in components.asset_graph.asset_check_keys and check in module.asset_graph.asset_check_keys
    assert check not in build_definitions(db).get_repository_def().asset_graph.asset_check_keys
    assert sorted(j.name for j in components.get_all_jobs() if not j.name.startswith("__")) == sorted(
        j.name for j in module.get_all_jobs() if not j.name.startswith("__"))
    assert sorted(s.name for s in components.sensor_defs) == sorted(s.name for s in module.sensor_defs)
    # and the real dg takes the shipped project as it is
    check = _dg(REPO / "examples" / "components", "check", "defs", uri=db.uri)
    assert check.returncode == 0 and "All definitions loaded successfully" in check.stdout + check.stderr, check.stderr


def test_components_and_a_views_module_make_one_graph(tmp_path, monkeypatch):
    """A CatalogComponent's views_module (the Python way) and ViewComponents
    over the same source: one graph, the source once; a name declared twice,
    or a view without a CatalogComponent, is refused at load."""
    db = _catalog(tmp_path / "cat")
    monkeypatch.setenv("MV_ASSETS_DB", db.uri)
    project, module = tmp_path / "mixed", "mv_components_mixed"
    pkg = _project(project, module)
    (pkg / "defs" / "catalog").mkdir()
    (pkg / "defs" / "catalog" / "views.py").write_text(textwrap.dedent(f'''
        import mv_assets as mv
        from {module}.udfs import double


        def views(db):
            src = db.open_table("src")
            return {{"a": mv.DeclaredView(src.search(None).select({{"id": "id", "y": double}}),
                                         refresh_policy=mv.RefreshPolicy.manual())}}
    '''))
    _fill(pkg / "defs" / "catalog" / "defs.yaml", """
        type: mv_assets.CatalogComponent
        attributes:
          views_module: views.py
    """)
    (pkg / "defs" / "b").mkdir()
    _fill(pkg / "defs" / "b" / "defs.yaml", """
        type: mv_assets.ViewComponent
        attributes:
          name: b
          source: src
          columns: {id: id, x2: x * 2}
    """)
    graph = _load(project, module).get_repository_def().asset_graph
    assert graph.get_all_asset_keys() == {K("src"), K("a"), K(["a", "y"]), K("b")}
    assert graph.get(K("a")).tags["mv_assets/policy"] == "manual" and graph.get(K("b")).tags["mv_assets/policy"] == "eager"
    (pkg / "defs" / "a").mkdir()
    _fill(pkg / "defs" / "a" / "defs.yaml", """
        type: mv_assets.ViewComponent
        attributes: {name: a, source: src}
    """)
    said = _load_error(project, module)
    assert "defs.yaml (CatalogComponent) (error)" in said
    assert "view 'a' is declared twice (two mv_assets.ViewComponents, or a ViewComponent and views_module" in said
    shutil.rmtree(pkg / "defs" / "a")
    shutil.rmtree(pkg / "defs" / "catalog")
    said = _load_error(project, module)
    assert f"view 'b' (mv_assets.ViewComponent) at {pkg / 'defs' / 'b'}: no mv_assets.CatalogComponent for catalog " \
           f"'{db.uri}' in this project builds its assets: scaffold one" in said
    assert db.table_names() == ["src"]


def test_a_declared_refresh_policy_is_followed_by_the_catalog(tmp_path):
    from mv_assets.api.declare import apply, reconcile

    db = _catalog(tmp_path / "cat")
    query = db.open_table("src").search(None).select({"id": "id"})
    apply(db, "v", mv.DeclaredView(query, refresh_policy=mv.RefreshPolicy.ttl(60)))
    assert db.open_table("v").refresh_policy == mv.RefreshPolicy.ttl(60)  # type: ignore[attr-defined]
    cron = mv.DeclaredView(query, refresh_policy=mv.RefreshPolicy.cron_schedule("0 6 * * *"))
    diff = reconcile(db, "v", cron)
    assert diff.policy and not diff.in_sync and not diff.problems
    apply(db, "v", cron)
    assert db.open_table("v").refresh_policy == mv.RefreshPolicy.cron_schedule("0 6 * * *")  # type: ignore[attr-defined]
    assert reconcile(db, "v", cron).in_sync and reconcile(db, "v", query).in_sync  # a bare query says nothing of it
    with pytest.raises(ValueError, match=r"DeclaredView\(refresh_policy=\) takes a RefreshPolicy, got 'eager': build one with"):
        mv.DeclaredView(query, refresh_policy="eager")  # type: ignore[arg-type]


def test_view_components_declare_join_aggregate_and_chunk_views(tmp_path):
    """ViewComponent's joins, group_by + aggregates and function make a join,
    an aggregate and a chunk view, equal to the same views made in Python;
    mistakes in them are said before anything is written."""
    db = _catalog(tmp_path / "cat")
    db.create_table("kinds", [{"k": i % 3, "label": f"k{i % 3}"} for i in range(3)])
    db.create_table("texts", [{"id": i, "body": "a b c " * (i + 1)} for i in range(3)])
    joined = _view(name="j", joins=[{"table": "kinds", "left_on": "x", "right_on": "k", "how": "left"}],
                   filter="src.x < 5", columns={"id": "src.id", "label": "kinds.label",
                                                "n": {"udf": "mv_assets.demo:word_count", "inputs": ["label"]}})
    per = _view(name="per", group_by=["s"], aggregates={"n": "count(*)", "total": "sum(x)"})
    chunks = ViewComponent(name="chunks", source="texts", columns={"id": "id"}, function="mv_assets.demo:passages")
    from mv_assets.api.declare import apply

    for comp in (joined, per, chunks):
        apply(db, comp.name, comp.declared(db))
    db.refresh(["j", "per", "chunks"])
    by_k = {0: "k0", 1: "k1", 2: "k2"}
    assert sorted((r["id"], r["label"], r["n"]) for r in db.open_table("j").to_arrow().to_pylist()) == [
        (i, by_k.get(i), None if i not in by_k else 1) for i in range(5)]
    assert db.open_table("per").count_rows() == 10
    assert db.open_table("chunks").count_rows() == 3 and "word_offset" in db.open_table("chunks").schema.names
    with pytest.raises(ValueError, match=r"each join is \{table, on \| left_on \+ right_on, how\}"):
        _view(joins=[{"tables": "kinds"}])
    with pytest.raises(ValueError, match=r"group_by and aggregates go together"):
        _view(group_by=["s"])
    with pytest.raises(ValueError, match=r"'mv_assets.demo:word_count' is a UDF, not a @chunker or @udtf"):
        _view(function="mv_assets.demo:word_count")
    with pytest.raises(ComponentError, match=r"joined table 'nope' is not a table or view"):
        _view(joins=[{"table": "nope", "on": "x"}]).declared(db)
    with pytest.raises(ComponentError, match=r"how='outer' is not supported"):
        _view(joins=[{"table": "kinds", "left_on": "x", "right_on": "k", "how": "outer"}]).declared(db)
