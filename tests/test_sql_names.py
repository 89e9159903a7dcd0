"""Which columns a view's SQL reads: one answer, from a SQL parser
(mv_assets.model.sql_names), for what makes a view stale, the Dagster column
lineage and the columns an aggregate's removed rows are taken with. A name
inside a string literal is not read (before: three regex copies counted it,
so a backfill of a column named only in a literal made the view due and drew
a lineage edge to it)."""

import dagster as dg
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.model.sql_names import columns_read


@pytest.mark.parametrize(("sql", "read"), [
    ("kind = 'words' AND n > 1", ["kind", "n"]),
    ("kind = 'it''s words'", ["kind"]),
    ("`words` > 0", ["words"]),
    ("WORDS > 0", ["words"]),  # unquoted names fold to lower case, as DataFusion does
    ("concat(kind, '-words')", ["kind"]),
    ("n > 1 -- words", ["n"]),
    ("length(`my col`) > 2", ["my col"]),
])
def test_columns_read_by_a_sql_expression(sql, read):
    assert columns_read(sql, ["kind", "n", "words", "my col"]) == read


def test_a_column_named_only_in_a_string_literal_is_not_read(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", pa.table({"id": [1, 2, 3], "kind": ["a", "words", "b"], "body": ["x y", "z", "w"]}),
                          primary_key="id")
    src.add_columns({"words": mv.udf(lambda body: len(body.split()), data_type=pa.int64(), name="wc",
                                     input_columns=["body"])})
    src.backfill("words")
    view = db.create_materialized_view("v", src.search(None).where("kind != 'words'").select(
        {"id": "id", "tag": "concat(kind, ':words')"}))
    view.refresh()
    src.alter_columns({"path": "words", "udf": mv.udf(lambda body: 2 * len(body.split()), data_type=pa.int64(),
                                                      name="wc2", input_columns=["body"])})
    src.backfill("words")
    assert view.status().versions_behind == 0 and view.pending_source_versions() == []
    assert not view.refresh_decision().refresh
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    node = defs.get_repository_def().asset_graph.get(dg.AssetKey(["v"]))
    assert dg.AssetKey(["src", "words"]) not in node.parent_keys  # no lineage edge to a column it does not read
    agg = db.create_materialized_view("per_kind", src.search(None).where("kind != 'words'").group_by("kind").agg(
        {"n": "count(*)"}))
    agg.refresh()
    src.delete("id = 1")
    agg.refresh()
    assert sorted((r["kind"], r["n"]) for r in agg.to_arrow().to_pylist()) == [("b", 1)]
