"""Seed a demo catalog and keep its views fresh: ``python -m mv_assets.demo``.

The catalog (``$MV_ASSETS_DB``, default ``.demo/catalog``) holds a ``documents``
source table, a small ``authors`` table and five views: ``doc_features`` (a
filter, SQL columns and UDF columns doing real text work), ``long_docs`` (a
view over that view), ``doc_chunks`` (each English document split into
passages by a chunker, with an ``embedding`` column computed for new
passages), ``corpus_stats`` (an aggregate view over ``doc_features``:
documents, words per document (mean, max, 90th percentile) from the
``word_count`` UDF, kept from the change feed) and ``doc_authors`` (a join
view: documents left-joined to their authors, with a ``byline`` UDF column
reading the author's name, so a change of either table refreshes it).

``python -m mv_assets.demo seed`` only creates the catalog (``make demo`` does
this, then starts the Dagster UI, whose sensors refresh the views). Without
arguments the demo refreshes from Python on Spark, appends, updates and
deletes source rows, and refreshes again to show that only changed rows are
computed.
"""

import os
import sys
import typing
import zlib

import pyarrow as pa
import pyarrow.compute as pc

import mv_assets as mv

WORDS = (
    "lance spark dagster arrow view column refresh fragment version row delta "
    "model embed token sensor asset lineage partition checkpoint commit"
).split()


AUTHORS = [  # (name, affiliation): the authors table, author_id = position
    ("Ada Lovelace", "Analytical Engine"), ("Alan Turing", "Bletchley Park"), ("Grace Hopper", "Harvard Mark I"),
    ("Edsger Dijkstra", "Eindhoven"), ("Barbara Liskov", "MIT"), ("Donald Knuth", "Stanford"),
]


def _documents(start: int, n: int, authors: bool = False) -> list[dict]:
    """Demo documents; ``authors``: with an ``author_id`` (every 11th has none:
    the join keeps it, without an author)."""
    rows = []
    for i in range(start, start + n):
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(5 + i % 40)]
        row = {"doc_id": i, "lang": "en" if i % 5 else "de", "body": " ".join(words)}
        if authors:
            row["author_id"] = None if i % 11 == 0 else i % len(AUTHORS)
        rows.append(row)
    return rows


@mv.udf
def word_count(body: str) -> int:
    """Scalar UDF: one Python call per row."""
    return len(body.split())


@mv.udf(data_type=pa.list_(pa.float32()))
def embedding(body: pa.Array) -> pa.Array:
    """Batched UDF: a tiny deterministic hashing 'embedding' (8 dims)."""
    out = []
    for text in body.to_pylist():
        vec = [0.0] * 8
        for w in text.split():
            vec[zlib.crc32(w.encode()) % 8] += 1.0
        norm = sum(v * v for v in vec) ** 0.5 or 1.0
        out.append([v / norm for v in vec])
    return pa.array(out, pa.list_(pa.float32()))


@mv.udf(data_type=pa.string())
def summary(body: pa.Array) -> pa.Array:
    return pc.utf8_slice_codeunits(body, 0, 24)  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)


class Passage(typing.NamedTuple):
    text: str
    word_offset: int  # where in the document the passage starts (in words)


@mv.chunker
def passages(body: str) -> typing.Iterator[Passage]:
    """Chunker: a document's body in passages of 12 words (RAG-style splitting)."""
    words = body.split()
    for start in range(0, len(words), 12):
        yield Passage(" ".join(words[start:start + 12]), start)


@mv.udf
def byline(name: str, body: str) -> str:
    """A UDF over both sides of the join: the author's name (joined) and the document's body."""
    return f"{name}: {' '.join(body.split()[:4])}..."


@mv.udf(on_error="skip")
def checksum(body: str) -> int:
    """A computed column of the source table, filled by backfill."""
    return zlib.crc32(body.encode())


def views(db: mv.Connection) -> dict:
    """The demo's views, declared in code (``MV_ASSETS_VIEWS=mv_assets.demo``).

    Edit a UDF above (say ``word_count``), click "Reload definitions" in the
    Dagster UI: its column asset shows the new code version, and materializing
    it recomputes that column only, with the new code stored in the view.
    """
    docs = db.open_table("documents")
    out = {
        "doc_features": docs.search(None)
        .where("lang = 'en'")
        .select(
            {
                "doc_id": "doc_id",
                "chars": "length(body)",
                "words": word_count,
                "embedding": embedding,
                "summary": summary,
            }
        )
    }
    if "doc_features" in db:
        feats = db.open_table("doc_features")
        out["long_docs"] = feats.search(None).where("words >= 30").select({"doc_id": "doc_id", "words": "words"})
    if "authors" in db and "author_id" in docs.schema.names:  # two sources, one view (its byline's code checked)
        out["doc_authors"] = docs.search(None).join(db.open_table("authors"), on="author_id", how="left").select(
            {"doc_id": "doc_id", "author": "authors.name", "affiliation": "affiliation",
             "byline": (byline, ["authors.name", "body"])})
    return out


def seed(uri: str) -> mv.Connection:
    """Create the demo catalog at ``uri`` (idempotent)."""
    db = mv.connect(uri)
    if "documents" not in db:
        schema = pa.schema(
            [
                pa.field("doc_id", pa.int64(), nullable=False),
                pa.field("lang", pa.string()),
                pa.field("body", pa.string()),
                pa.field("author_id", pa.int64()),
            ]
        )
        docs = db.create_table("documents", schema=schema, primary_key="doc_id")
        for start in range(0, 2000, 500):  # four appends -> four source fragments
            docs.add(_documents(start, 500, authors=True))
    if "authors" not in db:
        db.create_table("authors", [{"author_id": i, "name": name, "affiliation": where}
                                    for i, (name, where) in enumerate(AUTHORS)], primary_key="author_id")
    docs = db.open_table("documents")
    if "checksum" not in docs.schema.names:  # filled by the documents_columns sensor's backfill
        docs.add_columns({"checksum": checksum})
    for _ in range(2):  # long_docs reads doc_features: declared once doc_features exists
        for name, query in views(db).items():
            if name not in db:
                db.create_materialized_view(name, query)
    if "doc_chunks" not in db:  # documents -> passages -> their embeddings
        chunks = db.create_udtf_view("doc_chunks", docs.search(None).where("lang = 'en'").select(["doc_id"]), passages)
        chunks.add_columns({"embedding": (embedding, ["text"])})  # filled by backfill, for new passages only
    if "corpus_stats" not in db and "doc_features" in db:  # an aggregate of a UDF's output
        db.create_materialized_view("corpus_stats", db.open_table("doc_features").search(None).group_by().agg(
            {"documents": "count(*)", "avg_words": "avg(words)", "max_words": "max(words)",
             "p90_words": "approx_quantile(words, 0.9)", "chars": "sum(chars)"}))
    # (doc_authors is one of views(): a catalog seeded before documents had authors has no join:
    # remove it to seed it anew)
    return db


def _refresh_all(db: mv.Connection) -> None:
    names = [n for n in ("doc_features", "long_docs", "doc_chunks", "corpus_stats", "doc_authors") if n in db]
    for r in db.refresh(names):
        print(f"  {r.view:<13} src v{r.from_version}->v{r.to_version}: +{r.rows_inserted} ~{r.rows_updated} -{r.rows_deleted}  UDF rows {r.udf_rows_computed}  {r.seconds:.1f}s")
    b = db.open_view("doc_chunks").backfill("embedding")
    print(f"  doc_chunks.embedding: {b.udf_rows_computed} new passages embedded")


def main() -> int:
    uri = os.environ.get("MV_ASSETS_DB", os.path.join(".demo", "catalog"))
    if sys.argv[1:] == ["change"]:
        db = seed(uri)
        docs = db.open_table("documents")
        start = int(docs.to_arrow().column("doc_id").to_numpy().max()) + 1
        docs.add(_documents(start, 50, authors="author_id" in docs.schema.names))
        docs.update(f"doc_id = {start - 1}", values_sql={"body": "concat(body, ' edited')"})
        docs.delete("doc_id % 97 = 0")
        print(f"documents is now at version {docs.version}: appended 50 rows, edited 1, deleted some")
        authors = db.open_table("authors")
        who = start % len(AUTHORS)
        authors.update(f"author_id = {who}", values_sql={"name": "concat(name, ' Jr.')"})
        print(f"authors is now at version {authors.version}: renamed author {who} (doc_authors' bylines follow)")
        return 0
    if sys.argv[1:] == ["seed"]:
        db = seed(uri)
        print(f"demo catalog ready at {db.uri}: {db.table_names()}")
        return 0
    db = seed(uri)
    print(f"demo catalog: {db.uri}  tables: {db.table_names()}")
    print("refreshing in lineage order on Spark (first run starts the JVM)...")
    _refresh_all(db)
    docs = db.open_table("documents")
    next_id = docs.count_rows() + 10_000
    docs.add(_documents(next_id, 20, authors=True))
    docs.update("doc_id < 3", values_sql={"body": "concat(body, ' refresh')"})
    docs.delete("doc_id >= 100 AND doc_id < 110")
    db.open_table("authors").update("author_id = 0", values_sql={"name": "'Augusta Ada King'"})
    print("appended 20, updated 3, deleted 10 source rows, renamed an author; refreshing again...")
    _refresh_all(db)
    feats = db.open_table("doc_features")
    print(f"doc_features: {feats.count_rows()} rows; sample: {feats.to_arrow().slice(0, 1).to_pylist()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
