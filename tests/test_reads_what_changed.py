"""One answer to "does this view read what changed?": the planner, the status
(``versions_behind``), the refresh policy's decision (what the Dagster sensor
asks) and ``pending_source_versions`` agree for every kind of view.

A backfill rewrites a computed column's values without moving row versions.
Query views keep a copy of the markers of the computed source columns they
read; aggregate, chunk and table-function views keep none. Whatever the
kind, a backfill (after a UDF code change by ``alter_columns``) of a column
the view reads makes the view due, and one of a column it does not read
leaves it current. Checked against an oracle: plain Python over the source.
"""

from collections.abc import Iterator
from typing import NamedTuple

import lance
import pyarrow as pa
import pytest

import mv_assets as mv


@mv.udf
def words(body: str) -> int:
    return len(body.split())


@mv.udf
def words_v2(body: str) -> int:  # "the UDF was edited": counts words of 4+ letters
    return sum(len(w) >= 4 for w in body.split())


@mv.udf
def shout(body: str) -> str:
    return body.upper()


class Piece(NamedTuple):
    word: str


@mv.chunker
def split_words(body: str) -> Iterator[Piece]:
    for w in body.split():
        yield Piece(w)


@mv.udtf(output_schema=pa.schema([("total", pa.int64())]), input_columns=["n_words"])
def total_words(rows: pa.Table) -> pa.Table:
    return pa.table({"total": [sum(v for v in rows.column("n_words").to_pylist() if v is not None)]})


BODIES = ["alpha beta", "the quick brown fox", "a bb ccc dddd eeeee", "lorem ipsum dolor sit amet"]


def _catalog(db):
    docs = db.create_table("docs", pa.table({"id": list(range(len(BODIES))), "body": BODIES}), primary_key="id")
    docs.add_columns({"n_words": words, "loud": shout})
    docs.backfill("n_words")
    docs.backfill("loud")
    views = {
        "per_len": db.create_materialized_view(
            "per_len", docs.search(None).group_by().agg({"total": "sum(n_words)", "hi": "max(n_words)"})),
        "pieces": db.create_udtf_view("pieces", docs.search(None).select(["id", "n_words"]), split_words),
        "totals": db.create_udtf_view("totals", docs.search(None), total_words),
        "plain": db.create_materialized_view("plain", docs.search(None).select(["id", "n_words"])),
        # a join view naming the computed column qualified (its names are resolved once, by table)
        "joined": db.create_materialized_view("joined", docs.search(None).join(
            db.create_table("tags", pa.table({"id": list(range(len(BODIES))), "tag": list("wxyz")})), on="id")
            .select({"id": "id", "n": "docs.n_words", "tag": "tag"})),
    }
    db.refresh(list(views))
    return docs, views


def _oracle_total(docs) -> int:
    return sum(lance.dataset(docs.uri).to_table(columns=["n_words"]).column("n_words").to_pylist())


@pytest.mark.parametrize("name", ["per_len", "pieces", "totals", "plain", "joined"])
def test_a_backfill_of_a_column_a_view_reads_makes_it_due_everywhere(db, name):
    docs, views = _catalog(db)
    view = views[name]
    assert view.pending_source_versions() == [] and view.status().versions_behind == 0
    # an edit of a column the view does not read: nothing is due
    docs.alter_columns({"path": "loud", "udf": mv.udf(lambda body: body.lower(), data_type=pa.string())})
    docs.backfill("loud")
    assert view.pending_source_versions() == [], name
    assert view.status().versions_behind == 0 and not view.refresh_decision().refresh, name
    unread = view.plan_refresh()
    assert unread.is_noop and not unread.full and not any(unread.udf_rows.values()), (name, unread)
    # an edit of the UDF of a column the view reads: due for the planner, the status and the policy
    docs.alter_columns({"path": "n_words", "udf": words_v2})
    docs.backfill("n_words")
    pending = view.pending_source_versions()
    assert pending == [docs.version], name
    assert view.status().versions_behind == 1, name
    decision = view.refresh_decision()
    assert decision.refresh, (name, decision)
    plan = view.plan_refresh()
    assert plan.to_version == docs.version, (name, plan)
    # a query view compares the markers it keeps, row by row; the others recompute
    assert (plan.rows_to_update == len(BODIES)) if name == "plain" else (plan.full and "backfill" in plan.reason), plan
    view.refresh()
    assert view.status().versions_behind == 0 and view.pending_source_versions() == []
    if name == "per_len":
        got = view.to_arrow().to_pylist()[0]
        vals = lance.dataset(docs.uri).to_table(columns=["n_words"]).column("n_words").to_pylist()
        assert (got["total"], got["hi"]) == (_oracle_total(docs), max(vals))
    elif name == "totals":
        assert view.to_arrow().column("total").to_pylist() == [_oracle_total(docs)]
    elif name == "plain":
        got = sorted(view.to_arrow().select(["id", "n_words"]).to_pylist(), key=lambda r: r["id"])
        assert got == [{"id": i, "n_words": words_v2.func(b)} for i, b in enumerate(BODIES)]
    elif name == "joined":
        got = sorted(view.to_arrow().select(["id", "n"]).to_pylist(), key=lambda r: r["id"])
        assert got == [{"id": i, "n": words_v2.func(b)} for i, b in enumerate(BODIES)]
    else:
        got = sorted(view.to_arrow().select(["id", "n_words", "word"]).to_pylist(), key=lambda r: (r["id"], r["word"]))
        want = sorted(({"id": i, "n_words": words_v2.func(b), "word": w} for i, b in enumerate(BODIES)
                       for w in b.split()), key=lambda r: (r["id"], r["word"]))
        assert got == want


def test_the_demos_word_count_edit_refreshes_the_aggregate_over_it(tmp_path):
    """The demo's story, through Dagster: the sensor's first run, then edit
    ``word_count`` in the views module, reload, materialize
    ``doc_features/words`` over every partition. The next sensor tick must
    refresh ``corpus_stats`` (an aggregate of ``words``) as well as
    ``long_docs``; before, only ``long_docs`` was refreshed while
    ``corpus_stats`` kept the old code's averages and said "behind 0"."""
    import inspect
    import sys

    import dagster as dg
    from dagster_helpers import evaluate_sensor, run_requested

    import mv_assets.demo as demo
    from mv_assets.dagster import MvAssetsResource, build_definitions
    from mv_assets.dagster.definitions import job_name, partitions_def_name

    db = demo.seed(str(tmp_path / "demo"))
    db.runner = mv.InlineRunner()
    module = tmp_path / "demo_views_edited.py"
    source = inspect.getsource(demo)
    module.write_text(source)

    def defs_of(path):
        sys.modules.pop(path.stem, None)
        return build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"), views=str(path))

    defs = defs_of(module)
    with dg.instance_for_test() as instance:
        sensor = defs.get_repository_def().get_sensor_def("documents_changes")
        first = evaluate_sensor(sensor, instance=instance, definitions=defs, resources=defs.resources)
        assert all(r.success for r in run_requested(defs, instance, first))
        old = db.open_table("corpus_stats").to_arrow().to_pylist()[0]
        # the user edits word_count and clicks "Reload definitions"
        edited = source.replace("    return len(body.split())\n", "    return len(body.split()) // 2 + 1\n", 1)
        assert edited != source
        module.write_text(edited)
        defs = defs_of(module)
        frags = [str(f.fragment_id) for f in lance.dataset(db.table_uri("documents")).get_fragments()]
        instance.add_dynamic_partitions(partitions_def_name("documents"), frags)
        recompute = defs.resolve_job_def(job_name("documents")).execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey(["doc_features", "words"])],
            tags={"dagster/asset_partition_range_start": frags[0], "dagster/asset_partition_range_end": frags[-1]})
        assert recompute.success
        words_now = db.open_table("doc_features").to_arrow().column("words").to_pylist()
        stats = db.open_table("corpus_stats")
        assert stats.status().versions_behind == 1  # the status tells: corpus_stats reads words
        sensor = defs.get_repository_def().get_sensor_def("documents_changes")
        tick = evaluate_sensor(sensor, instance=instance, cursor=first.cursor, definitions=defs,
                               resources=defs.resources)
        (run,) = tick.run_requests
        selected = {k.to_user_string() for k in run.asset_selection}
        assert {"corpus_stats", "long_docs"} <= selected, selected
        assert all(r.success for r in run_requested(defs, instance, tick))
        new = stats.to_arrow().to_pylist()[0]
        assert new["max_words"] == max(words_now) != old["max_words"]
        assert abs(new["avg_words"] - sum(words_now) / len(words_now)) < 1e-9
        assert stats.status().versions_behind == 0
