"""What a Dagster power user expects of the assets: column lineage, column
descriptions, owners and tags set where views are declared, a named job per
source table. Real catalogs (the demo's) and Dagster's own definitions."""

import dagster as dg
import pyarrow as pa
import pytest
from dagster_helpers import apply_partition_requests, column_lineage, evaluate_sensor, run_log, ui_graphql

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.demo import seed

K = dg.AssetKey


@mv.udtf(output_schema=pa.schema([("lang", pa.string()), ("n", pa.int64())]), input_columns=["lang"],
         partition_by="lang")
def per_lang(t: pa.Table) -> pa.Table:
    return pa.table({"lang": [t.column("lang")[0].as_py()], "n": [t.num_rows]})


def _demo(tmp_path) -> mv.Connection:
    """The demo's catalog (documents with a computed column checksum, doc_features
    with SQL and UDF columns, long_docs over it, the chunk view doc_chunks, the
    aggregate corpus_stats), plus a view reading the computed column and a
    table-function view."""
    db = seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    docs = db.open_table("documents")
    db.create_materialized_view("checked", docs.search(None).select({"doc_id": "doc_id", "sum": "checksum",
                                                                   "tagged": "concat(lang, '-', doc_id)"}))
    db.create_udtf_view("langs", docs.search(None), per_lang)
    return db


def _defs(db, **kwargs):
    return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), **kwargs)


def _spec_metadata(defs, key: dg.AssetKey) -> dict:
    return dict(defs.get_repository_def().asset_graph.get(key).metadata)


def _lineage(defs, name: str) -> dict[str, set[tuple[str, str]]]:
    return column_lineage(_spec_metadata(defs, K([name]))["dagster/column_lineage"])


def test_each_view_asset_carries_its_column_lineage(tmp_path):
    db = _demo(tmp_path)
    defs = _defs(db)
    # a copied column <- itself, a SQL column <- the columns it names, a UDF column <- its inputs
    assert _lineage(defs, "doc_features") == {
        "doc_id": {("documents", "doc_id")}, "chars": {("documents", "body")},
        "words": {("documents", "body")}, "embedding": {("documents", "body")}, "summary": {("documents", "body")},
    }
    # a computed column of the source table is read from that column's asset
    assert _lineage(defs, "checked") == {
        "doc_id": {("documents", "doc_id")}, "sum": {("documents/checksum", "checksum")},
        "tagged": {("documents", "lang"), ("documents", "doc_id")},
    }
    # a view over a view: the upstream's UDF columns are assets of their own
    assert _lineage(defs, "long_docs") == {
        "doc_id": {("doc_features", "doc_id")}, "words": {("doc_features/words", "words")},
    }
    # a chunk view: inherited columns <- the parent column, the chunker's outputs <- its inputs
    assert _lineage(defs, "doc_chunks") == {
        "doc_id": {("documents", "doc_id")}, "text": {("documents", "body")},
        "word_offset": {("documents", "body")},
    }
    # an aggregate view: each output <- its aggregated column (count(*) reads none), keys <- themselves
    assert _lineage(defs, "corpus_stats") == {
        "avg_words": {("doc_features/words", "words")}, "max_words": {("doc_features/words", "words")},
        "p90_words": {("doc_features/words", "words")}, "chars": {("doc_features", "chars")},
    }
    # a table-function view: its outputs <- the UDTF's inputs
    assert _lineage(defs, "langs") == {"lang": {("documents", "lang")}, "n": {("documents", "lang")}}
    # every asset a column comes from is one the view depends on
    graph = defs.get_repository_def().asset_graph
    for name in ("doc_features", "checked", "long_docs", "doc_chunks", "corpus_stats", "langs"):
        parents = {k.to_user_string() for k in graph.get(K([name])).parent_keys}
        assert {a for deps in _lineage(defs, name).values() for a, _ in deps} <= parents, name


def test_an_aggregate_views_keys_come_from_themselves(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("ev", [{"id": i, "g": i % 3, "x": i} for i in range(9)], primary_key="id")
    db.create_materialized_view("by_g", src.search(None).group_by("g").agg({"n": "count(*)", "total": "sum(x)"}))
    assert _lineage(_defs(db), "by_g") == {"g": {("ev", "g")}, "total": {("ev", "x")}}


def _columns(defs, key: dg.AssetKey) -> dict[str, tuple[str, str | None]]:
    schema = _spec_metadata(defs, key)["dagster/column_schema"]
    if not isinstance(schema, dg.TableSchema):
        schema = schema.schema
    return {c.name: (c.type, c.description) for c in schema.columns}


def test_view_and_table_assets_describe_each_visible_column(tmp_path):
    from mv_assets.demo import word_count

    db = _demo(tmp_path)
    defs = _defs(db)
    feats = _columns(defs, K(["doc_features"]))
    assert set(feats) == {"doc_id", "chars", "words", "embedding", "summary"}  # no internal column
    assert feats["doc_id"] == ("int64", "Copied from `documents`.`doc_id`.")
    assert feats["chars"][1] == "SQL: `length(body)`."
    assert feats["words"] == ("int64", f"UDF `word_count`(body) -> int64; code fingerprint {word_count.fingerprint}.")
    assert feats["embedding"][0] == "list<item: float>"
    stats = _columns(defs, K(["corpus_stats"]))
    assert stats["avg_words"][1] == "Aggregate: avg(words) over each group's rows of `doc_features`."
    assert stats["documents"][1] == "Aggregate: count(*) over each group's rows of `doc_features`."
    assert stats["p90_words"] == ("double", "Aggregate: approx_quantile(words, 0.9) over each group's rows of "
                                            "`doc_features`.")
    chunks = _columns(defs, K(["doc_chunks"]))
    assert chunks["doc_id"][1] == "Inherited from the parent row: `documents`.`doc_id`."
    assert chunks["text"][1].startswith("Output of chunker `passages`(body); code fingerprint ")
    assert chunks["embedding"][1].startswith("Computed from the view's rows: UDF `embedding`(text) -> ")
    assert _columns(defs, K(["langs"]))["n"][1].startswith("Output of UDTF `per_lang`(lang); ")
    # a table: plain columns with their types, computed ones described
    docs = _columns(defs, K(["documents"]))
    assert set(docs) == {"doc_id", "lang", "body", "author_id", "checksum"}
    assert docs["lang"] == ("string", None)
    assert docs["checksum"][1].startswith("Computed column: UDF `checksum`(body) -> int64; code fingerprint ")
    # the column lists hold every visible column and no internal one, on every asset
    for info_name in ("doc_features", "long_docs", "doc_chunks", "corpus_stats", "langs", "checked"):
        cols = _columns(defs, K([info_name]))
        assert cols and not any(n.startswith("__") for n in cols)
        stored = [f.name for f in db.open_table(info_name).schema if not f.name.startswith("__")]
        assert set(cols) == set(stored), info_name
        assert all(description for _, description in cols.values()), info_name  # every view column says what it is


def _node(defs, key: dg.AssetKey):
    return defs.get_repository_def().asset_graph.get(key)


def _small(tmp_path) -> tuple[mv.Connection, mv.Table]:
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    return db, src


@mv.udf
def triple(x: int) -> int:
    return 3 * x


def test_owners_and_tags_given_at_creation_are_the_assets_and_can_change(tmp_path):
    db, src = _small(tmp_path)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "t": triple}),
                                       owners=["team:ml", "alice@example.com"], tags={"domain": "search"})
    assert view.owners == ["team:ml", "alice@example.com"] and view.tags == {"domain": "search"}
    defs = _defs(db)
    for key in (K(["v"]), K(["v", "t"])):  # the view and its UDF column
        assert _node(defs, key).owners == ["team:ml", "alice@example.com"]
        assert _node(defs, key).tags["domain"] == "search"
    assert _node(defs, K(["v"])).tags["mv_assets/policy"] == "eager"  # the wiring's own tags stay
    # changed later, the next load shows them; owners and tags change on their own
    db.open_view("v").set_owners(["team:search"])
    db.open_view("v").set_tags({"domain": "ranking", "tier": "gold"})
    again = db.open_view("v")
    assert again.owners == ["team:search"] and again.tags == {"domain": "ranking", "tier": "gold"}
    defs = _defs(db)
    assert _node(defs, K(["v"])).owners == ["team:search"]
    assert {k: v for k, v in _node(defs, K(["v"])).tags.items() if not k.startswith(("mv_assets/", "dagster/"))} == {
        "domain": "ranking", "tier": "gold"}
    db.open_view("v").set_owners([])
    assert _node(_defs(db), K(["v"])).owners == []
    # a chunk or table-function view takes them too
    db.create_udtf_view("langs", src.search(None), per_count, owners=["team:ml"], tags={"kind": "udtf"})
    assert _node(_defs(db), K(["langs"])).owners == ["team:ml"]


@mv.udtf(output_schema=pa.schema([("n", pa.int64())]), input_columns=["x"])
def per_count(t: pa.Table) -> pa.Table:
    return pa.table({"n": [t.num_rows]})


def test_invalid_owners_and_tags_are_refused_before_anything_is_written(tmp_path):
    db, src = _small(tmp_path)
    query = src.search(None).select({"id": "id"})
    with pytest.raises(ValueError, match=r"invalid owner 'ml': an owner is an email address or a team name"):
        db.create_materialized_view("v", query, owners=["ml"])
    with pytest.raises(ValueError, match=r"owners must be a list of strings"):
        db.create_materialized_view("v", query, owners="team:ml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"invalid tag key 'a b'"):
        db.create_materialized_view("v", query, tags={"a b": "x"})
    with pytest.raises(ValueError, match=r"invalid value 'two words' of tag 'domain'"):
        db.create_materialized_view("v", query, tags={"domain": "two words"})
    with pytest.raises(ValueError, match=r"tag key 'mv_assets/policy': the prefixes dagster/, mv_assets/ are reserved"):
        db.create_materialized_view("v", query, tags={"mv_assets/policy": "manual"})
    with pytest.raises(ValueError, match=r"invalid owner 'team:'"):
        db.create_udtf_view("u", src.search(None), per_count, owners=["team:"])
    assert "v" not in db and "u" not in db  # nothing written
    view = db.create_materialized_view("v", query, owners=["team:ml"])
    with pytest.raises(ValueError, match=r"invalid owner 'bob@'"):
        view.set_owners(["bob@"])
    with pytest.raises(ValueError, match=r"tags must be a dict"):
        view.set_tags(["x"])  # type: ignore[arg-type]
    assert db.open_view("v").owners == ["team:ml"] and db.open_view("v").tags == {}  # unchanged
    # every accepted owner and tag is one Dagster accepts
    db.open_view("v").set_owners(["team:ml", "a.b+c@mail.example.org"])
    db.open_view("v").set_tags({"team.io/area": "x-1", "empty": ""})
    assert _node(_defs(db), K(["v"])).owners == ["team:ml", "a.b+c@mail.example.org"]


def _run(defs, instance, db, selection):
    """A run over every partition of src's lineage, as "Materialize" in the UI."""
    frags = [str(f) for f in db.open_table("src").fragment_ids()]
    instance.add_dynamic_partitions(partitions_def_name("src"), frags)
    tags = {"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]}
    return defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance, asset_selection=selection, tags=tags)


DECLARED = '''
import mv_assets as mv


@mv.udf
def quad(x: int) -> int:
    return 4 * x


def views(db):
    src = db.open_table("src")
    return {{"d": mv.DeclaredView(src.search(None).select({{"id": "id", "q": quad}}), owners={owners!r},
                                  tags={tags!r})}}
'''


def test_views_declared_in_code_carry_their_owners_and_tags_into_the_catalog(tmp_path):
    db, _src = _small(tmp_path)
    module = tmp_path / "declared_views.py"
    module.write_text(DECLARED.format(owners=["team:ml"], tags={"domain": "search"}))
    defs = _defs(db, views=str(module))
    # before the view exists, from the code
    assert _node(defs, K(["d"])).owners == ["team:ml"] and _node(defs, K(["d"])).tags["domain"] == "search"
    assert _node(defs, K(["d", "q"])).owners == ["team:ml"]
    assert "d" not in db  # loading wrote nothing
    with dg.instance_for_test() as instance:
        assert _run(defs, instance, db, [K(["d"])]).success
        view = db.open_view("d")
        assert view.owners == ["team:ml"] and view.tags == {"domain": "search"}  # created with them
        # the code changes them: the next load shows the code's, the next materialization stores them
        module.write_text(DECLARED.format(owners=["bob@example.com"], tags={}))
        defs = _defs(db, views=str(module))
        assert _node(defs, K(["d"])).owners == ["bob@example.com"]
        assert "domain" not in _node(defs, K(["d"])).tags
        assert db.open_view("d").owners == ["team:ml"]  # loading wrote nothing
        result = _run(defs, instance, db, [K(["d"])])
        assert result.success
        assert any("d: applied the code: set its owners and tags" in m for m in run_log(instance, result))
        view = db.open_view("d")
        assert view.owners == ["bob@example.com"] and view.tags == {}
    # owners the code gets wrong are refused when the definitions load, before anything is written
    module.write_text(DECLARED.format(owners=["nobody"], tags={}))
    with pytest.raises(ValueError, match=r"invalid owner 'nobody'"):
        _defs(db, views=str(module))
    assert db.open_view("d").owners == ["bob@example.com"]
    # a bare query says nothing of them: the catalog's stand (set from Python, say)
    module.write_text(DECLARED.replace("mv.DeclaredView(", "(lambda q, owners, tags: q)(").format(owners=[], tags={}))
    db.open_view("d").set_tags({"tier": "gold"})
    defs = _defs(db, views=str(module))
    assert _node(defs, K(["d"])).owners == ["bob@example.com"] and _node(defs, K(["d"])).tags["tier"] == "gold"


def test_each_source_table_has_a_named_job_its_sensor_and_schedules_launch(tmp_path):
    db = _demo(tmp_path)
    other = db.create_table("events", [{"id": i, "x": i} for i in range(4)], primary_key="id")
    db.create_materialized_view("cron_events", other.search(None).select({"id": "id", "t": triple}),
                                refresh_policy=mv.RefreshPolicy.cron_schedule("0 * * * *"))
    defs = _defs(db)
    repo = defs.get_repository_def()
    docs_job = defs.resolve_job_def("refresh_documents")
    # a table's job: its computed columns, its views (views over views too) with their column assets and checks
    assert sorted(k.to_user_string() for k in docs_job.asset_layer.selected_asset_keys) == [
        "checked", "corpus_stats", "doc_authors", "doc_authors/byline", "doc_chunks", "doc_chunks/embedding",
        "doc_features", "doc_features/embedding", "doc_features/summary", "doc_features/words", "documents/checksum",
        "langs", "long_docs",
    ]
    assert dg.AssetCheckKey(K(["doc_features"]), "matches_source_query") in docs_job.asset_layer.asset_graph.asset_check_keys
    assert docs_job.partitions_def.name == partitions_def_name("documents")
    events_job = defs.resolve_job_def("refresh_events")
    assert sorted(k.to_user_string() for k in events_job.asset_layer.selected_asset_keys) == [
        "cron_events", "cron_events/t"]
    # the sensors and the cron schedule launch their runs in their table's job
    assert repo.get_sensor_def("documents_changes").job_name == "refresh_documents"
    assert repo.get_sensor_def("events_changes").job_name == "refresh_events"
    assert repo.get_schedule_def("cron_events_schedule").job_name == "refresh_events"
    sensor = repo.get_sensor_def("documents_changes")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        apply_partition_requests(instance, first)
        (run,) = first.run_requests
        result = defs.resolve_job_def(sensor.job_name).execute_in_process(
            instance=instance, asset_selection=run.asset_selection, tags=run.tags)
        assert result.success and result.dagster_run.job_name == "refresh_documents"
        assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} == {
            k.to_user_string() for k in run.asset_selection}
    for name in ("doc_features", "long_docs", "doc_chunks", "corpus_stats", "checked", "langs"):
        assert db.open_table(name).status().versions_behind == 0, name


def test_the_ui_loads_the_definitions_with_their_jobs(tmp_path):
    """The webserver's workspace loads the definitions (a job's graph and the
    lineage's op have distinct names) and lists each table's job."""
    db = _demo(tmp_path)
    with dg.instance_for_test() as instance, ui_graphql(instance, tmp_path, db.uri) as query:
        data = query("{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }")
        (repo,) = data["repositoriesOrError"]["nodes"]
        assert "refresh_documents" in {j["name"] for j in repo["jobs"]}


@mv.udf(num_gpus=0.5, num_cpus=2)
def _on_gpu(x: int) -> int:
    return x + 1


def test_resource_hints_read_in_the_columns_description_and_the_cli_plan(tmp_path):
    """A column's @udf(num_cpus=, num_gpus=) hints are said where users look:
    the asset's column description, the UDF column asset's description, and
    `mv-assets plan` (text and JSON)."""
    import json

    from click.testing import CliRunner

    from mv_assets.cli import main

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("ev", [{"id": i, "x": i} for i in range(4)], primary_key="id")
    view = db.create_materialized_view("g", src.search(None).select({"id": "id", "y": _on_gpu}))
    assert view.resource_request() is not None and view.resource_request().num_gpus == 0.5
    defs = _defs(db)
    _, text = _columns(defs, K(["g"]))["y"]
    assert "asks for num_cpus=2, num_gpus=0.5 per task" in (text or "")
    column_asset = defs.get_repository_def().asset_graph.get(K(["g", "y"]))
    assert "It asks for num_cpus=2, num_gpus=0.5 per task" in (column_asset.description or "")
    run = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "plan", "g"], catch_exceptions=False)
    assert "each task asks for num_cpus=2, num_gpus=0.5" in run.output
    run = CliRunner().invoke(main, ["--db", db.uri, "--runner", "inline", "plan", "g", "--json"],
                             catch_exceptions=False)
    assert json.loads(run.output)["resources"] == {"y": {"num_cpus": 2.0, "num_gpus": 0.5, "memory": None}}
    # a view without hints says nothing of them
    plain = db.create_materialized_view("p", src.search(None).select({"id": "id"}))
    assert plain.resource_request() is None


def test_a_udf_reading_a_struct_field_is_described_by_the_field(tmp_path):
    """Geneva's dot notation (``input_columns=["info.vals"]``): the descriptions name the field
    the UDF reads; lineage (column to column) is the struct column."""
    info = pa.struct([("vals", pa.list_(pa.int64())), ("tag", pa.string())])
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", pa.table({"id": [1, 2], "info": pa.array([{"vals": [1], "tag": "a"}, None], info)}))

    @mv.udf(data_type=pa.int64(), input_columns=["info.vals"])
    def total(vals: list | None) -> int | None:
        return sum(vals or [])

    db.create_materialized_view("v", src.search(None).select({"id": "id", "total": total}))
    src.add_columns({"first": mv.udf(data_type=pa.int64(), input_columns=["info.vals"])(lambda vals: (vals or [0])[0])})
    defs = _defs(db)
    assert _columns(defs, K(["v"]))["total"][1] == (
        f"UDF `total`(info.vals) -> int64; code fingerprint {total.fingerprint}.")
    assert _columns(defs, K(["src"]))["first"][1].startswith("Computed column: UDF `<lambda>`(info.vals) -> int64")
    assert _lineage(defs, "v")["total"] == {("src", "info")}
