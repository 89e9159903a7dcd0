"""Views declared in code (a user module), reconciled with the catalog, and the
UDF-change workflow: edit the code, reload definitions, materialize the column."""

import os
import textwrap

import dagster as dg
import lance
import pytest
from dagster_helpers import evaluate_sensor
from oracle import count_calls

import mv_assets as mv
from mv_assets.api.declare import apply, load_declared, reconcile
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name

K = dg.AssetKey

MODULE = '''
import mv_assets as mv
from oracle import record_call

CALLS = {calls!r}


@mv.udf
def score(x: int) -> int:
    record_call(CALLS, "score", x)
    return {body}


@mv.udf
def other(x: int) -> int:
    record_call(CALLS, "other", x)
    return x - 1


def views(db):
    src = db.open_table("src")
    return {{"v": src.search(None).where("{where}").select({{"id": "id", "score": score, "other": other}})}}
'''


def _write(path, calls, body="x * 10", where="x >= 0"):
    path.write_text(textwrap.dedent(MODULE.format(calls=calls, body=body, where=where)))
    return str(path)


@pytest.fixture
def catalog(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    calls = tmp_path / "calls"
    calls.mkdir()
    return db, str(calls)


def _defs(db, module):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), views=module)


def _all_partitions(db, instance):
    frags = [str(f.fragment_id) for f in lance.dataset(db.table_uri("src")).get_fragments()]
    instance.add_dynamic_partitions(partitions_def_name("src"), frags)
    return {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}


def test_reconcile_and_apply(catalog, tmp_path):
    db, calls = catalog
    module = _write(tmp_path / "views1.py", calls)
    declared = load_declared(module, db)
    assert reconcile(db, "v", declared["v"]).create
    apply(db, "v", declared["v"])
    assert reconcile(db, "v", declared["v"]).in_sync
    changed = load_declared(_write(tmp_path / "views2.py", calls, body="x * 100"), db)
    diff = reconcile(db, "v", changed["v"])
    assert diff.altered == ["score"] and not diff.problems
    apply(db, "v", changed["v"])
    assert db.open_table("v").definition.udf_columns[0].udf.fingerprint == changed["v"].to_definition().udf_columns[0].udf.fingerprint
    refiltered = load_declared(_write(tmp_path / "views3.py", calls, body="x * 100", where="x > 2"), db)
    assert "differ from the stored view" in reconcile(db, "v", refiltered["v"]).problems[0]
    with pytest.raises(ValueError, match="drop it"):
        apply(db, "v", refiltered["v"])
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="has no views"):
        load_declared(str(tmp_path / "empty.py"), db)


def test_edit_the_udf_reload_and_materialize_only_that_column(catalog, tmp_path):
    db, calls = catalog
    module = tmp_path / "my_views.py"
    _write(module, calls)
    defs = _defs(db, str(module))
    graph = defs.get_repository_def().asset_graph
    assert K(["v", "score"]) in graph.get_all_asset_keys()  # declared, not created yet
    old_version = graph.get(K(["v", "score"])).code_version
    other_version = graph.get(K(["v", "other"])).code_version
    with dg.instance_for_test() as instance:
        tags = _all_partitions(db, instance)
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[K(["v"]), K(["v", "score"]), K(["v", "other"])], tags=tags).success
        assert (count_calls(calls, "score"), count_calls(calls, "other")) == (10, 10)
        first = evaluate_sensor(
            defs.get_repository_def().get_sensor_def("src_changes"), instance=instance, definitions=defs,
            resources=defs.resources,
        )
        assert {e.passed for e in first.asset_events if isinstance(e, dg.AssetCheckEvaluation)} == {True}
        cursor = first.cursor
        assert sorted(r["score"] for r in db.open_table("v").to_arrow().to_pylist()) == [10 * i for i in range(10)]
        # the user edits the UDF and clicks "Reload definitions"
        _write(module, calls, body="x * 10 + 7")
        defs = _defs(db, str(module))
        graph = defs.get_repository_def().asset_graph
        new_version = graph.get(K(["v", "score"])).code_version
        assert new_version != old_version
        assert graph.get(K(["v", "other"])).code_version == other_version
        # descriptions hold no state as of the load (it would read wrong after the recompute): the code
        # version (staleness "has a new code version") and the udf_code_current check say what changed
        for key in (K(["v"]), K(["v", "score"]), K(["v", "other"])):
            assert "differed" not in graph.get(key).description and "Code changed for" not in graph.get(key).description
        assert f"Code fingerprint {new_version}" in graph.get(K(["v", "score"])).description
        # the sensor marks the column itself: a failed udf_code_current check (once)
        sensor = defs.get_repository_def().get_sensor_def("src_changes")
        tick = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        verdicts = {(e.asset_key, e.passed) for e in tick.asset_events if isinstance(e, dg.AssetCheckEvaluation)}
        assert verdicts == {(K(["v", "score"]), False)}
        cursor = tick.cursor
        again = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        assert not [e for e in again.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
        # "Materialize" on the column asset: all partitions, only that column
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, asset_selection=[K(["v", "score"])], tags=tags)
        assert result.success
        assert [(e.asset_key, e.check_name, e.passed) for e in result.get_asset_check_evaluations()] == [
            (K(["v", "score"]), "udf_code_current", True)]
        tick = evaluate_sensor(sensor, instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
        assert {(e.asset_key, e.passed) for e in tick.asset_events if isinstance(e, dg.AssetCheckEvaluation)} == {
            (K(["v", "score"]), True)}
        assert (count_calls(calls, "score"), count_calls(calls, "other")) == (20, 10)  # other untouched
        view = db.open_table("v")
        assert sorted(r["score"] for r in view.to_arrow().to_pylist()) == [10 * i + 7 for i in range(10)]
        assert view.definition.udf_columns[0].udf.fingerprint == new_version  # the new code is stored
        # materializing it again has nothing to do
        assert job.execute_in_process(instance=instance, asset_selection=[K(["v", "score"])], tags=tags).success
        assert count_calls(calls, "score") == 20
        # a change the catalog cannot follow fails clearly, writing nothing
        _write(module, calls, body="x * 10 + 7", where="x > 2")
        defs = _defs(db, str(module))
        job = defs.resolve_implicit_global_asset_job_def()
        before = view.version
        with pytest.raises(dg.Failure, match="cannot follow its code"):
            job.execute_in_process(instance=instance, asset_selection=[K(["v"])], tags=tags)
        assert db.open_table("v").version == before


def test_alter_columns_from_python_shows_as_a_new_code_version(catalog, tmp_path):
    db, calls = catalog
    src = db.open_table("src")

    @mv.udf
    def inc(x: int) -> int:
        return x + 1

    view = db.create_materialized_view("w", src.search(None).select({"id": "id", "y": inc}))
    view.refresh()
    key = K(["w", "y"])
    before = build_definitions(db).get_repository_def().asset_graph.get(key).code_version
    view.alter_columns({"path": "y", "udf": mv.udf(lambda x: x + 2, data_type=inc.data_type, name="inc2", input_columns=["x"])})
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    assert defs.get_repository_def().asset_graph.get(key).code_version != before
    with dg.instance_for_test() as instance:
        tags = _all_partitions(db, instance)
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[key], tags=tags).success
    assert sorted(r["y"] for r in db.open_table("w").to_arrow().to_pylist()) == [i + 2 for i in range(10)]


def test_demo_declares_its_views_in_code(tmp_path):
    from mv_assets.demo import seed

    db = seed(str(tmp_path / "demo"))
    declared = load_declared("mv_assets.demo", db)
    assert set(declared) == {"doc_features", "long_docs", "doc_authors"}
    assert all(reconcile(db, name, q).in_sync for name, q in declared.items())
    assert os.path.basename(declared["doc_features"].to_definition().udf_columns[0].udf.code_location()[0]) == "demo.py"


def _code_check(events, key):
    found = [e for e in events if isinstance(e, dg.AssetCheckEvaluation) and e.asset_key == key]
    return found[-1] if found else None


def test_code_check_follows_the_rows_not_the_stored_code(catalog, tmp_path):
    """A recompute that fails (the new code raises on a row) stores the new code
    in the catalog but computes nothing: the check stays red, with the counts."""
    db, calls = catalog
    module = tmp_path / "my_views.py"
    _write(module, calls)
    defs = _defs(db, str(module))
    key = K(["v", "score"])
    with dg.instance_for_test() as instance:
        tags = _all_partitions(db, instance)
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[K(["v"]), key, K(["v", "other"])], tags=tags).success
        # new code that raises on one row; reload; materialize the column: the run fails
        _write(module, calls, body="1 // 0 if x == 3 else x * 10 + 7")
        defs = _defs(db, str(module))
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, asset_selection=[key], tags=tags, raise_on_error=False)
        assert not result.success
        status = {c["column"]: c for c in db.open_table("v").column_status()}["score"]
        assert (status["current"], status["stale"]) == (0, 10)  # the new code is stored, no row computed by it
        sensor = defs.get_repository_def().get_sensor_def("src_changes")
        tick = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        check = _code_check(tick.asset_events, key)
        assert check is not None and not check.passed
        assert "10 of 10 rows are stale" in (check.description or "")
        assert (check.metadata["rows_current"].value, check.metadata["rows_stale"].value) == (0, 10)
        # fixed code: the column is materialized, every row is current, the check passes
        _write(module, calls, body="x * 10 + 7")
        defs = _defs(db, str(module))
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, asset_selection=[key], tags=tags)
        evaluation = [e for e in result.get_asset_check_evaluations() if e.asset_key == key][0]
        assert evaluation.passed and "all 10 rows are current" in (evaluation.description or "")
        assert (evaluation.metadata["rows_current"].value, evaluation.metadata["rows_stale"].value) == (10, 0)


def test_a_declared_view_named_like_a_base_table_is_reported_at_load(catalog, tmp_path, caplog):
    """A view declared in code under the name of an existing base table cannot
    be loaded: a warning says so when the definitions load, and the table's
    asset description carries the problem (where view declarations show theirs)."""
    db, calls = catalog
    module = tmp_path / "clash.py"
    module.write_text(textwrap.dedent('''
        def views(db):
            src = db.open_table("src")
            return {"src": src.search(None).select(["id"]), "v": src.search(None).select(["id", "x"])}
    '''))
    with caplog.at_level("WARNING", logger="mv_assets"):
        defs = _defs(db, str(module))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("view 'src' declared in code is not loaded" in m and "'src' is a table in the catalog" in m for m in warned), warned
    specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    assert K(["v"]) in specs  # the other declared view is loaded as usual
    assert "view 'src' declared in code is not loaded" in (specs[K(["src"])].description or "")


def test_a_declared_view_the_stored_one_cannot_follow_is_reported_at_load(catalog, tmp_path, caplog):
    """A view declared in code with another filter than the stored view's: a
    warning says so when the definitions load (it said nothing; the first run
    applying the code failed), and the view's asset description carries it."""
    db, calls = catalog
    apply(db, "v", load_declared(_write(tmp_path / "views1.py", calls), db)["v"])
    module = _write(tmp_path / "views3.py", calls, where="x > 2")
    with caplog.at_level("WARNING", logger="mv_assets"):
        defs = _defs(db, module)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("view 'v' declared in code cannot be applied" in m and "differ from the stored view" in m
               for m in warned), warned
    specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    assert "The code cannot be applied" in (specs[K(["v"])].description or "")


def test_a_declared_view_over_a_table_without_stable_row_ids_is_reported_at_load(catalog, tmp_path, caplog):
    """A declared view that cannot be built over its source (here a table
    another tool created without stable row ids) does not break the code
    location: that view is not loaded, with the reason logged and on the
    source's asset description; the other views load."""
    import lance
    import pyarrow as pa

    db, calls = catalog
    lance.write_dataset(pa.table({"id": [1, 2]}), db.table_uri("plain"))  # no stable row ids
    module = tmp_path / "plain_views.py"
    module.write_text(textwrap.dedent('''
        def views(db):
            return {"pv": db.open_table("plain").search(None).select(["id"]),
                    "v": db.open_table("src").search(None).select(["id", "x"])}
    '''))
    with caplog.at_level("WARNING", logger="mv_assets"):
        defs = _defs(db, str(module))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("view 'pv' declared in code is not loaded" in m and "stable row ids" in m for m in warned), warned
    specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    assert K(["v"]) in specs and K(["pv"]) not in specs
    assert "view 'pv' declared in code is not loaded" in (specs[K(["plain"])].description or "")


def test_declared_chunk_join_and_aggregate_views_reconcile_and_apply(tmp_path):
    """Views declared in code of every kind: a chunk view (DeclaredView with
    a function), a join view and an aggregate view are created by apply(),
    then found in sync with the code; a changed chunker is reported."""
    import pyarrow as pa

    from mv_assets.api.declare import DeclaredView

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    docs = db.create_table("docs", pa.table({"id": [1, 2], "text": ["a b c", "d e"], "author": [10, 11]}))
    authors = db.create_table("authors", pa.table({"aid": [10, 11], "name": ["x", "y"]}))

    @mv.chunker(output_schema=pa.schema([("word", pa.string())]), input_columns=["text"])
    def words(text):
        for w in text.split():
            yield {"word": w}

    @mv.chunker(output_schema=pa.schema([("word", pa.string())]), input_columns=["text"])
    def upper_words(text):
        for w in text.split():
            yield {"word": w.upper()}

    declared = {
        "words": DeclaredView(docs.search(None).select(["id", "text"]), function=words),
        "by_author": DeclaredView(docs.search(None).join(authors, left_on="author", right_on="aid")
                                  .select({"id": "docs.id", "name": "name"})),
        "per_author": docs.search(None).group_by("author").agg({"n": "count(*)"}),
    }
    for name, q in declared.items():
        assert reconcile(db, name, q).create
        apply(db, name, q)
        assert reconcile(db, name, q).in_sync, name
    db.refresh(["words", "by_author", "per_author"])
    assert sorted(r["word"] for r in db.open_table("words").to_arrow().to_pylist()) == list("abcde")
    assert reconcile(db, "words", DeclaredView(docs.search(None).select(["id", "text"]), function=upper_words)).problems
    with pytest.raises(ValueError, match="takes a @chunker or @udtf"):
        DeclaredView(docs.search(None), function=len)


MANUAL_MODULE = '''
import mv_assets as mv


@mv.udf
def tenfold(x: int) -> int:
    return x * 10


def views(db):
    src = db.open_table("src")
    return {{"v": mv.DeclaredView(src.search(None).select({{"id": "id", "s": tenfold}}),
                                  refresh_policy=mv.RefreshPolicy.{policy})}}
'''


@pytest.mark.parametrize("policy", ["manual()", "cron('0 6 * * *')"])
def test_a_declared_view_whose_policy_is_manual_or_cron_is_not_created_by_the_sensor(catalog, tmp_path, policy):
    """A view declared in code with a manual (or cron) policy, not created
    yet: the sensor's tick requests no run of it (its first tick created it
    and computed every UDF row, though the asset said "refresh only on
    request"); materializing it creates it."""
    db, _ = catalog
    module = tmp_path / "manual_views.py"
    module.write_text(MANUAL_MODULE.format(policy=policy))
    defs = _defs(db, str(module))
    with dg.instance_for_test() as instance:
        tick = evaluate_sensor(defs.get_repository_def().get_sensor_def("src_changes"), instance=instance,
                               definitions=defs, resources=defs.resources)
        assert not [r for r in (tick.run_requests or []) if K(["v"]) in (r.asset_selection or [])]
        assert "v" not in db
        tags = _all_partitions(db, instance)
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[K(["v"]), K(["v", "s"])], tags=tags).success
        assert sorted(r["s"] for r in db.open_table("v").to_arrow().to_pylist()) == [10 * i for i in range(10)]
