"""Indexes and search on tables and views (Geneva's calls), kept covering every
row across incremental refreshes, full rebuilds, backfills and optimize().

Search results are checked against an oracle computed with numpy / Python over
the source rows at the version the view reflects (exact search: IVF_FLAT with
every partition probed), never against Lance's own flat search.
"""

import warnings

import lance
import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv

DIM = 16


def rows(a: int, b: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed + a)
    v = rng.random((b - a, DIM), dtype=np.float32)
    ids = np.arange(a, b)
    return pa.table({
        "id": ids,
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), DIM),
        "text": [f"w{i % 50} doc{i}" + (" rare" if i % 97 == 0 else "") for i in ids],
        "k": ids % 7,
    })


def lance_coverage(uri: str) -> dict[str, tuple[int, int]]:
    """{index name: (indexed rows, unindexed rows)} as Lance itself reports them."""
    ds = lance.dataset(uri)
    out = {}
    for ix in ds.describe_indices():
        st = ds.stats.index_stats(ix.name)
        out[ix.name] = (st["num_indexed_rows"], st["num_unindexed_rows"])
    return out


def oracle_rows(db, view) -> list[dict]:
    """The view's rows recomputed from the source at the version it reflects (filter k != 3)."""
    src = db.open_table(view.source)
    t = lance.dataset(src.uri, version=view.source_version).to_table()
    return [r for r in t.to_pylist() if r["k"] != 3]


def nearest_ids(rs: list[dict], q: np.ndarray, k: int) -> list[int]:
    d = np.array([float(np.sum((np.asarray(r["emb"], dtype=np.float32) - q) ** 2)) for r in rs])
    return [rs[i]["id"] for i in np.argsort(d, kind="stable")[:k]]


@pytest.fixture
def view(db):
    src = db.create_table("src", rows(0, 2000), primary_key="id")
    v = db.create_materialized_view("v", src.search(None).where("k != 3").select(["id", "emb", "text", "k"]))
    return v


def test_indexes_declared_on_an_empty_view_are_built_by_its_first_refresh(db, view):
    info = view.create_index(num_partitions=4, vector_column_name="emb", index_type="IVF_FLAT", metric="l2")
    assert info.pending and info.name == "emb_idx"
    (fts,) = view.create_fts_index("text")
    assert fts.pending
    assert view.create_scalar_index("k", index_type="BITMAP").pending
    assert lance_coverage(view.uri) == {}  # nothing built yet: no rows
    r = db.refresh("v")
    assert sorted(r.indexes["rebuilt"]) == ["emb_idx", "k_idx", "text_idx"]
    n = view.count_rows()
    assert lance_coverage(view.uri) == {"emb_idx": (n, 0), "text_idx": (n, 0), "k_idx": (n, 0)}
    assert {i.name: (i.num_indexed_rows, i.num_unindexed_rows, i.pending) for i in view.list_indices()} == {
        "emb_idx": (n, 0, False), "text_idx": (n, 0, False), "k_idx": (n, 0, False)}


def test_every_refresh_leaves_every_index_covering_every_row_and_search_matches_the_oracle(db, view):
    db.refresh("v")
    view.create_index(num_partitions=4, vector_column_name="emb", index_type="IVF_FLAT")
    view.create_fts_index("text")
    view.create_scalar_index("id")
    src = db.open_table("src")
    q = np.random.default_rng(7).random(DIM, dtype=np.float32)
    steps = [
        ("append", lambda: src.add(rows(2000, 2300, seed=1))),
        ("delete", lambda: src.delete("id % 10 = 0")),
        ("update", lambda: src.update("id < 300", values_sql={"k": "(k + 1) % 7"})),  # rows move in and out
        ("merge", lambda: src.merge_insert(rows(2250, 2400, seed=2))),
    ]
    for what, write in steps:
        write()
        r = db.refresh("v")
        assert not r.indexes.get("failed"), what
        n = view.count_rows()
        cov = lance_coverage(view.uri)
        assert cov == {"emb_idx": (n, 0), "text_idx": (n, 0), "id_idx": (n, 0)}, (what, cov)
        expected = oracle_rows(db, view)
        got = view.search(q, vector_column_name="emb").nprobes(4).limit(10).to_list()
        assert [g["id"] for g in got] == nearest_ids(expected, q, 10), what
        assert set(got[0]) == {"id", "emb", "text", "k", "_distance"}  # no internal column
        hits = view.search("rare", query_type="fts").limit(1000).to_list()
        assert sorted(h["id"] for h in hits) == sorted(r["id"] for r in expected if "rare" in r["text"].split()), what
    # a full rebuild replaces every row (a Lance Overwrite drops indexes): all built again
    r = db.refresh("v", mode="full")
    assert sorted(r.indexes["rebuilt"]) == ["emb_idx", "id_idx", "text_idx"]
    n = view.count_rows()
    assert lance_coverage(view.uri) == {"emb_idx": (n, 0), "text_idx": (n, 0), "id_idx": (n, 0)}
    assert view.index_stats("emb_idx")["index_type"] == "IVF_FLAT"
    got = view.search(q, vector_column_name="emb").nprobes(4).limit(5).to_list()
    assert [g["id"] for g in got] == nearest_ids(oracle_rows(db, view), q, 5)


def test_indexes_made_through_lance_directly_on_a_view_are_maintained(db, view):
    """The defect: an index made with pylance on a view's dataset was left
    behind by refreshes (new rows unindexed), by optimize(), and dropped by a
    full refresh."""
    db.refresh("v")
    lance.dataset(view.uri).create_index("emb", index_type="IVF_PQ", num_partitions=4, num_sub_vectors=4)
    lance.dataset(view.uri).create_scalar_index("text", "INVERTED")
    db.open_table("src").add(rows(2000, 2100, seed=3))
    db.refresh("v")
    n = view.count_rows()
    assert lance_coverage(view.uri) == {"emb_idx": (n, 0), "text_idx": (n, 0)}
    # (Lance's own update may re-partition a small index: what it is now is what a rebuild keeps)
    partitions = lance.dataset(view.uri).stats.index_stats("emb_idx")["segments"][0]["num_partitions"]
    db.refresh("v", mode="full")
    n = view.count_rows()
    assert lance_coverage(view.uri) == {"emb_idx": (n, 0), "text_idx": (n, 0)}
    st = lance.dataset(view.uri).stats.index_stats("emb_idx")
    assert st["index_type"] == "IVF_PQ" and st["segments"][0]["num_partitions"] == partitions  # rebuilt as it was


def test_optimize_brings_a_tables_indexes_up_to_date(db):
    t = db.create_table("t", rows(0, 1000), primary_key="id")
    t.create_index(num_partitions=2, num_sub_vectors=2, vector_column_name="emb")
    t.add(rows(1000, 1200, seed=4))
    assert lance_coverage(t.uri)["emb_idx"] == (1000, 200)  # a table's writes are the user's: flat-scanned until...
    t.optimize()
    assert lance_coverage(t.uri)["emb_idx"] == (1200, 0)
    # ...and a view's optimize() does it too
    v = db.create_materialized_view("tv", t.search(None).select(["id", "emb"]))
    db.refresh("tv")
    lance.dataset(v.uri).create_index("emb", index_type="IVF_FLAT", num_partitions=2)
    assert v.optimize() >= 1
    assert lance_coverage(v.uri)["emb_idx"] == (1200, 0)


def test_a_backfilled_column_joins_its_index(db):
    @mv.udf(data_type=pa.list_(pa.float32(), DIM))
    def embed(id: int) -> list:
        return list(np.random.default_rng(id).random(DIM, dtype=np.float32))

    t = db.create_table("docs", rows(0, 600).select(["id", "text"]), primary_key="id")
    t.add_columns({"vec": embed})
    t.backfill("vec")
    t.create_index(num_partitions=2, index_type="IVF_FLAT", vector_column_name="vec")
    t.add(rows(600, 700).select(["id", "text"]))
    result = t.backfill("vec")  # computes the new rows: the engine's commit, then the index catches up
    assert result.udf_rows_computed == 100
    assert lance_coverage(t.uri)["vec_idx"] == (700, 0)
    q = np.random.default_rng(650).random(DIM, dtype=np.float32)
    assert t.search(q).nprobes(2).limit(1).to_list()[0]["id"] == 650


def test_a_failed_index_build_never_fails_the_refresh_and_is_tried_again(db):
    # no vector to train on yet (NULL embeddings): the build fails, the refresh does not
    first = rows(0, 40).set_column(1, "emb", pa.nulls(40, pa.list_(pa.float32(), DIM)))
    src = db.create_table("src", first, primary_key="id")
    v = db.create_materialized_view("v", src.search(None).select(["id", "emb"]))
    v.create_index(num_partitions=2, index_type="IVF_FLAT", vector_column_name="emb")  # pending: no rows
    with pytest.warns(UserWarning, match="index 'emb_idx' .* was not brought up to date .*cannot train"):
        r = db.refresh("v")
    assert "emb_idx" in r.indexes["failed"]
    assert v.count_rows() == 40  # the rows were committed
    (info,) = v.list_indices()
    assert info.pending
    src.add(rows(40, 1000, seed=5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = db.refresh("v")
    assert r.indexes["rebuilt"] == ["emb_idx"]
    assert lance_coverage(v.uri) == {"emb_idx": (1000, 0)}
    q = np.asarray(rows(40, 1000, seed=5).column("emb")[460].as_py(), dtype=np.float32)
    assert v.search(q).nprobes(2).limit(1).to_list()[0]["id"] == 500


def test_a_dropped_index_stays_dropped(db, view):
    db.refresh("v")
    view.create_scalar_index("k")
    view.drop_index("k_idx")
    db.refresh("v", mode="full")
    assert view.list_indices() == [] and lance_coverage(view.uri) == {}
    with pytest.raises(ValueError, match="has no index named 'k_idx'"):
        view.drop_index("k_idx")


def test_bad_index_requests_are_refused_before_anything_is_written(db, view):
    db.refresh("v")
    before = lance.dataset(view.uri).version
    with pytest.raises(ValueError, match="needs a fixed-size list of floats.*v.text is string"):
        view.create_index(vector_column_name="text")
    with pytest.raises(ValueError, match="has no column 'nope' to index"):
        view.create_scalar_index("nope")
    with pytest.raises(ValueError, match="has no column '__source_row_id' to index"):
        view.create_scalar_index("__source_row_id")
    with pytest.raises(ValueError, match="full-text index needs a string column; v.k is int64"):
        view.create_fts_index(["text", "k"])  # checked before the first one is built
    with pytest.raises(ValueError, match="unknown scalar index type 'HASH'"):
        view.create_scalar_index("k", index_type="HASH")
    with pytest.raises(ValueError, match="unknown metric 'manhattan'"):
        view.create_index(metric="manhattan", vector_column_name="emb")
    with pytest.raises(ValueError, match="unknown index type 'IVF_MAGIC'"):
        view.create_index(vector_column_name="emb", index_type="IVF_MAGIC")
    view.create_scalar_index("k")
    with pytest.raises(ValueError, match="already has an index named 'k_idx'; pass replace=True"):
        view.create_fts_index("text", name="k_idx")
    assert [i.name for i in view.list_indices()] == ["k_idx"]
    assert lance.dataset(view.uri).version == before + 2  # the one index built (and declared), nothing else


def test_search_calls_as_geneva_spells_them(db, view):
    db.refresh("v")
    view.create_fts_index("text")
    expected = oracle_rows(db, view)
    q = np.asarray(expected[5]["emb"], dtype=np.float32)
    # the only vector column is found; lists, numpy and Arrow arrays are vectors
    for query in (q, list(map(float, q)), pa.array(q)):
        assert view.search(query).limit(1).to_list()[0]["id"] == expected[5]["id"]
    # a where() applies before the search by default: every result matches
    got = view.search(q).where("k = 2").limit(20).to_arrow()
    assert got.num_rows == 20 and set(got.column("k").to_pylist()) == {2}
    assert [r["id"] for r in got.to_pylist()] == nearest_ids([r for r in expected if r["k"] == 2], q, 20)
    # select / with_row_id / to_pandas / offset
    sel = view.search(q).select(["id"]).with_row_id(True).limit(3).to_arrow()
    assert sel.column_names == ["id", "_distance", "_rowid"]
    assert list(view.search(q).limit(4).offset(2).to_pandas()["id"]) == nearest_ids(expected, q, 6)[2:]  # SQL: 4 after 2
    # full text: "auto" picks it for a string; columns named with fts_columns
    hits = view.search("w7", fts_columns="text").limit(100).to_list()
    assert sorted(h["id"] for h in hits) == sorted(r["id"] for r in expected if "w7" in r["text"].split())
    assert all(h["_score"] > 0 for h in hits)
    # hybrid: the vector's nearest and the text's matches fused by reciprocal rank
    hyb = view.search(query_type="hybrid").vector(q).text("rare").limit(5).to_list()
    assert hyb[0]["id"] in {expected[5]["id"]} | {r["id"] for r in expected if "rare" in r["text"]}
    assert all("_relevance_score" in h for h in hyb)
    assert [h["_relevance_score"] for h in hyb] == sorted((h["_relevance_score"] for h in hyb), reverse=True)
    # search(None) is still the view-declaring query builder
    assert isinstance(view.search(None), mv.Query)


def test_search_refuses_what_it_cannot_answer(db, view):
    db.refresh("v")
    with pytest.raises(ValueError, match="has no full-text index: create one with create_fts_index"):
        view.search("w1").to_list()
    with pytest.raises(ValueError, match="the query vector has 3 values; 'emb' holds 16"):
        view.search([1.0, 2.0, 3.0]).to_list()
    with pytest.raises(ValueError, match="has no vector column 'text'"):
        view.search([0.0] * DIM, vector_column_name="text").to_list()
    with pytest.raises(ValueError, match="query_type must be 'auto', 'vector', 'fts' or 'hybrid'"):
        view.search("x", query_type="semantic")
    with pytest.raises(ValueError, match="a hybrid search needs both"):
        view.search(query_type="hybrid").vector([0.0] * DIM).to_list()
    with pytest.raises(ValueError, match="search\\(\\) takes a vector .* or a text string, got dict"):
        view.search({"a": 1})


def test_indexes_on_a_view_refreshed_on_spark(spark_db):
    src = spark_db.create_table("src", rows(0, 1500), primary_key="id")
    v = spark_db.create_materialized_view("v", src.search(None).where("k != 3").select(["id", "emb", "text", "k"]))
    v.create_index(num_partitions=2, index_type="IVF_FLAT", vector_column_name="emb")
    spark_db.refresh("v")
    src.add(rows(1500, 1600, seed=6))
    r = spark_db.refresh("v")
    assert r.indexes == {"updated": ["emb_idx"], "rebuilt": [], "failed": {}}
    n = v.count_rows()
    assert lance_coverage(v.uri) == {"emb_idx": (n, 0)}


def test_query_results_as_geneva_reads_them(db):
    t = db.create_table("t", rows(0, 50), primary_key="id")
    q = t.search(None).where("k = 1", prefilter=True).select(["id", "k"])
    expected = [{"id": i, "k": 1} for i in range(50) if i % 7 == 1]
    assert q.to_list() == expected
    assert q.to_pandas().to_dict("records") == expected
    batches = q.to_batches(batch_size=3)
    assert [b.num_rows for b in batches] == [3, 3, 1] and pa.Table.from_batches(batches).to_pylist() == expected
    with pytest.raises(ValueError, match="prefilter is True or False, got 'yes'"):
        t.search(None).where("k = 1", prefilter="yes")
