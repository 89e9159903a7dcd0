"""More of Geneva's documentation pages, their code blocks run with only the import changed.

Pages (lancedb/docs, ``docs/geneva/``): ``jobs/contexts.mdx``, ``jobs/advanced-job-configuration.mdx``,
``jobs/troubleshooting.mdx``, ``jobs/conflicts.mdx``, ``end-to-end.mdx``,
``udfs/advanced-configuration.mdx`` and ``jobs/bulk-load-columns.mdx``, with the conventions of
``tests/test_geneva_docs.py``: each block is copied as written with ``import geneva`` -> ``import
mv_assets as geneva`` (``from geneva... import`` -> ``from mv_assets... import``); a model is a
cheap deterministic stand-in of the same calls (``sentence_transformers`` as a stand-in module,
so the UDFs' own ``from sentence_transformers import SentenceTransformer`` runs), and so is
``geneva.manifest.GenevaManifest``'s builder, which mv_assets does not ship (its manifests are
Ray runtime environments: ``@udf(manifest=)`` is accepted with a ``GenevaCompatWarning``); ``...``
bodies are given one; the docs' URIs are ``tmp_path``. Each block is checked against an
expectation computed here in plain Python. Inline runs, real Lance files.

Changes beyond the import: ``end-to-end.mdx`` connects to LanceDB Enterprise (``db://my-db``,
``host_override``, ``api_key``): a local catalog here. ``bulk-load-columns.mdx`` imports ``lancedb``
(``import mv_assets as lancedb``: its ``load_columns`` is Geneva's) and reads ``s3://bucket/...``
folders: the same folder URIs with ``file://`` over ``tmp_path``. ``troubleshooting.mdx``'s
``@geneva.udf(num_gpus=1) def my_udf(x): ...`` has no return type, so it is refused when decorated
(as by Geneva 0.17); it runs with ``-> int`` and a body.

What the pages found (fixed; each test failed before): ``from geneva.db import Connection`` had
no counterpart in ``mv_assets.db``, and ``Connection.local_ray_context()``, called on the class as
the contexts page does (a static method in Geneva), wanted ``self``; lancedb's builder
``tbl.merge_insert("id").when_not_matched_insert_all().execute(rows)`` (conflicts page: Geneva's
``Table`` is a ``LanceTable``) was refused ("unsupported data of type str": ``merge_insert`` took
only the rows to upsert); ``load_columns(source="s3://bucket/embeddings/")``, a folder URI without
a suffix, was refused ("cannot tell the format"), where Geneva reads it as Parquet.

Not applicable (no block of them runs here, by design; docs/geneva.md):

- ``jobs/contexts.mdx`` but its "Local Ray" block: the KubeRay and external-cluster definitions
  (``geneva.cluster.GenevaCluster``, ``KubeRayClusterBuilder``, ``db.define_cluster``, the
  ``ray_init_kwargs`` tip, worker images), the manifests (``GenevaManifest.create_pip / create_conda /
  create_site``, ``db.define_manifest``) and the execution contexts using them (``db.context(cluster=,
  manifest=, on_exit=ExitMode...)``, entered with ``with`` or ``__enter__``): they provision Ray
  clusters on Kubernetes; jobs here run on the connection's runner (inline or Spark), and the local
  equivalent, ``local_ray_context()``, is the block that runs. (Those blocks' ``db.get_table`` is no
  method of Geneva 0.17's ``Connection`` either: ``open_table``.)
- ``jobs/advanced-job-configuration.mdx``'s ``capture_local_environment`` block: a LanceDB
  Enterprise connection (``db://`` with ``host_override``, ``api_key``) uploading the workspace.
- ``jobs/troubleshooting.mdx``'s ``bash`` (kubectl) and ``KubeRayClusterBuilder`` blocks.
- ``udfs/advanced-configuration.mdx``: its blocks set the checkpoint location of Geneva's jobs
  (``JOB__CHECKPOINT__OBJECT_STORE__PATH``, ``geneva.config.override_config_kv``); checkpoints here
  live in the catalog's own folder (``<catalog>/_mv_assets/checkpoints/``) and no ``GENEVA_*`` variable
  is read.
"""

import sys
import time
import types
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mv_assets
from mv_assets.execution.spark import InlineRunner, set_default_runner


@pytest.fixture(autouse=True)
def inline_default():
    """``geneva.connect(uri)`` with no runner (as the docs call it) runs inline."""
    set_default_runner(InlineRunner())
    yield
    set_default_runner(None)


def _embed(text: str, dim: int) -> list[float]:
    """The stand-in model's embedding of ``text`` (float32 values, as a model's)."""
    b = text.encode()
    return [float(np.float32((b[i % len(b)] * (i + 1)) % 97 / 97.0)) for i in range(dim)]


class _SentenceTransformer:
    """Stand-in for ``sentence_transformers.SentenceTransformer`` (its constructor, ``encode``)."""

    loaded: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name
        _SentenceTransformer.loaded.append(name)

    def encode(self, text: str, normalize_embeddings: bool = False) -> np.ndarray:
        return np.array(_embed(text, 384), dtype=np.float32)


class _StandInManifest:
    """Stand-in for ``geneva.manifest.GenevaManifest``'s pip builder (a Ray runtime manifest)."""

    def __init__(self, name: str) -> None:
        self.name, self.pips = name, []

    def pip(self, packages: list[str]) -> "_StandInManifest":
        self.pips = list(packages)
        return self

    def build(self) -> "_StandInManifest":
        return self


@pytest.fixture
def stand_ins(monkeypatch):
    """``sentence_transformers`` and ``mv_assets.manifest`` (Geneva's ``geneva.manifest``) as stand-ins."""
    st = types.ModuleType("sentence_transformers")
    st.SentenceTransformer = _SentenceTransformer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", st)
    manifest_module = types.ModuleType("mv_assets.manifest")

    class GenevaManifest:
        @staticmethod
        def create_pip(name: str) -> "_StandInManifest":
            return _StandInManifest(name)

    manifest_module.GenevaManifest = GenevaManifest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mv_assets.manifest", manifest_module)
    _SentenceTransformer.loaded = []
    return _SentenceTransformer


# -- jobs/contexts.mdx ------------------------------------------------------------------------


def test_contexts_local_ray_context_block(tmp_path):
    import mv_assets as geneva

    db = geneva.connect(tmp_path)
    tbl = db.create_table("files", pa.table({"filename": ["a.mp4", "bb.mp4", "ccc.jpeg"]}))

    # --- "Local Ray", import changed (`Connection.local_ray_context()` is called on the class)
    from mv_assets import udf
    from mv_assets.db import Connection

    @udf
    def filename_len(filename: str) -> int:
        return len(filename)

    tbl.add_columns({"filename_len": filename_len})

    with Connection.local_ray_context():
        tbl.backfill("filename_len")
    # ---
    assert {r["filename"]: r["filename_len"] for r in tbl.to_arrow().to_pylist()} == {
        "a.mp4": 5, "bb.mp4": 6, "ccc.jpeg": 8}
    assert Connection is geneva.Connection
    with db.local_ray_context():  # on a connection too, as before
        pass


# -- jobs/advanced-job-configuration.mdx (Enterprise-only; manifests accepted with a warning) ---


def test_advanced_job_configuration_manifest_on_udf_chunker_and_udtf(tmp_path, stand_ins):
    # --- the page's first block, import changed (GenevaManifest: a stand-in builder)
    import pyarrow as pa  # noqa: F811, I001 (as the page writes it)
    from typing import Iterator, NamedTuple  # noqa: UP035
    from mv_assets import udf, chunker, udtf
    from mv_assets.manifest import GenevaManifest  # pyright: ignore[reportMissingImports]

    # Build a manifest that pins the dependencies these transforms need
    embed_manifest = (
        GenevaManifest.create_pip("embedding-deps")
        .pip(["sentence-transformers==3.3.1", "torch==2.5.1"])
        .build()
    )
    # ---
    assert embed_manifest.pips == ["sentence-transformers==3.3.1", "torch==2.5.1"]

    import mv_assets as geneva

    texts = ["intro\n\nbody one\n\nend", "single part", "a\n\nb"]
    labels = ["doc", "note", "doc"]
    db = geneva.connect(tmp_path)
    tbl = db.create_table("docs", pa.table({"text": texts, "label": labels}))

    # --- "@udf(manifest=...)": manifest= is accepted with one warning (docs/geneva.md)
    with pytest.warns(geneva.GenevaCompatWarning, match="manifest"):
        @udf(data_type=pa.list_(pa.float32(), 384), manifest=embed_manifest)
        def embed(text: str) -> list[float]:
            from sentence_transformers import SentenceTransformer  # pyright: ignore[reportMissingImports]
            model = SentenceTransformer("BAAI/bge-small-en-v1.5")
            return model.encode(text, normalize_embeddings=True).tolist()

    tbl.add_columns({"embedding": embed})
    tbl.backfill("embedding")   # the backfill job runs with embed_manifest
    # ---
    got = {r["text"]: r["embedding"] for r in tbl.to_arrow().to_pylist()}
    assert got == {t: _embed(t, 384) for t in texts}
    assert set(stand_ins.loaded) == {"BAAI/bge-small-en-v1.5"}

    # --- "@chunker(manifest=...)"
    class Chunk(NamedTuple):
        chunk_index: int
        chunk_text: str

    with pytest.warns(geneva.GenevaCompatWarning, match="manifest"):
        @chunker(manifest=embed_manifest)
        def split_document(text: str) -> Iterator[Chunk]:
            for i, part in enumerate(text.split("\n\n")):
                yield Chunk(chunk_index=i, chunk_text=part)

    view = db.create_udtf_view("chunks", source=tbl.search(None), udtf=split_document)
    view.refresh()   # the refresh job runs with embed_manifest
    # ---
    want_chunks = sorted((i, part) for t in texts for i, part in enumerate(t.split("\n\n")))
    assert sorted((r["chunk_index"], r["chunk_text"]) for r in view.to_arrow().to_pylist()) == want_chunks

    # --- "@udtf(manifest=...)"
    with pytest.warns(geneva.GenevaCompatWarning, match="manifest"):
        @udtf(
            output_schema=pa.schema([
                pa.field("label", pa.string()),
                pa.field("count", pa.int64()),
            ]),
            manifest=embed_manifest,
        )
        def group_stats(source) -> Iterator[pa.RecordBatch]:
            df = source.to_pandas()
            agg = df.groupby("label").size().reset_index(name="count")
            yield pa.RecordBatch.from_pandas(agg)

    view = db.create_udtf_view("summaries", source=tbl.search(None), udtf=group_stats)
    view.refresh()   # the refresh job runs with embed_manifest
    # ---
    assert {r["label"]: r["count"] for r in view.to_arrow().to_pylist()} == {"doc": 2, "note": 1}


# -- jobs/troubleshooting.mdx -----------------------------------------------------------------


def test_troubleshooting_gpu_udf_and_concurrency_blocks(tmp_path):
    import mv_assets as geneva

    # --- "Check your UDF:", import changed: as written (no return annotation, `...` body) it is
    # refused when decorated, as by Geneva 0.17 (no data_type to infer)
    with pytest.raises(ValueError, match="cannot infer the output type"):
        @geneva.udf(num_gpus=1)  # This requires GPUs
        def my_udf(x): ...
    # ---

    # the same UDF with a return annotation and a body (inline, its tasks run as CPU tasks, with a warning)
    @geneva.udf(num_gpus=1)  # This requires GPUs
    def my_udf(x) -> int:  # noqa: F811
        return x * 3

    db = geneva.connect(tmp_path)
    table = db.create_table("t", pa.table({"x": list(range(20))}))
    table.add(pa.table({"x": list(range(20, 40))}))
    table.add_columns({"col": my_udf})

    # --- "Fix: Lower concurrency", import changed
    with pytest.warns(UserWarning, match=r"'num_gpus': 1\.0.*run as CPU tasks"):
        # Before: backfill with `num_gpus(1)` needs 8 GPUs
        table.backfill("col", concurrency=8)
    # ---
    assert {r["x"]: r["col"] for r in table.to_arrow().to_pylist()} == {x: 3 * x for x in range(40)}
    # ---
    table.add(pa.table({"x": list(range(40, 50))}))  # rows for the "After" call to compute
    with pytest.warns(UserWarning, match="run as CPU tasks"):
        # After: cap at 4 GPUs
        res = table.backfill("col", concurrency=4)
    # ---
    assert res.rows_written == 10
    assert {r["x"]: r["col"] for r in table.to_arrow().to_pylist()} == {x: 3 * x for x in range(50)}

    # --- "Fix options": 1. `@geneva.udf(num_gpus=0)` (no warning: nothing to reserve)
    with warnings.catch_warnings():
        warnings.simplefilter("error", geneva.GenevaCompatWarning)

        @geneva.udf(num_gpus=0)
        def on_cpu(x) -> int:
            return x + 1

    table.add_columns({"cpu_col": on_cpu})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        table.backfill("cpu_col")
    assert [str(w.message) for w in seen if "run as CPU tasks" in str(w.message)] == []  # nothing unscheduled
    assert {r["x"]: r["cpu_col"] for r in table.to_arrow().to_pylist()} == {x: x + 1 for x in range(50)}


# -- jobs/conflicts.mdx -----------------------------------------------------------------------


class _Gate:
    """A UDF's first call waits here until the test opens it (files: a UDF runs from its stored copy)."""

    def __init__(self, path) -> None:
        self.started, self.go = str(path / "started"), str(path / "go")

    def wait_in_udf(self) -> None:
        import os
        import time

        if not os.path.exists(self.started):
            open(self.started, "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(self.go) and time.monotonic() < deadline:
            time.sleep(0.01)

    def wait_started(self) -> None:
        import os

        deadline = time.monotonic() + 30
        while not os.path.exists(self.started):
            assert time.monotonic() < deadline, "the backfill never called its UDF"
            time.sleep(0.01)

    def open(self) -> None:
        open(self.go, "w").close()


def _calls(path) -> list[int]:
    import os

    return [int(line) for line in open(path).read().split()] if os.path.exists(path) else []


def test_conflicts_recovery_rerun_after_compaction_computes_only_the_rest(tmp_path):
    import mv_assets as geneva

    log = str(tmp_path / "calls.txt")

    @geneva.udf
    def doubled(x: int) -> int:
        with open(log, "a") as f:
            f.write(f"{x}\n")
        return 2 * x

    db = geneva.connect(tmp_path / "db")
    tbl = db.create_table("t", pa.table({"x": list(range(0, 10))}))
    for lo in (10, 20):
        tbl.add(pa.table({"x": list(range(lo, lo + 10))}))  # three fragments
    tbl.add_columns({"column_name": doubled})
    tbl.backfill("column_name", num_frags=1)  # a partial backfill: the first fragment
    assert sorted(_calls(log)) == list(range(10))
    tbl.compact_files()  # "Compaction Between Backfills"
    assert len(tbl.to_lance().get_fragments()) == 1

    # --- "Recovery Steps", 2. Re-run the backfill
    tbl.backfill("column_name")
    # ---
    # 3. Only uncomputed rows are processed
    assert sorted(_calls(log)) == list(range(30))
    assert {r["x"]: r["column_name"] for r in tbl.to_arrow().to_pylist()} == {x: 2 * x for x in range(30)}
    tbl.backfill("column_name")  # nothing left
    assert len(_calls(log)) == 30

    # the page's table: "Backfill, alter_columns (new UDF), re-backfill": full reprocessing
    @geneva.udf
    def tripled(x: int) -> int:
        return 3 * x

    tbl.alter_columns({"path": "column_name", "udf": tripled})
    tbl.backfill("column_name")
    assert {r["x"]: r["column_name"] for r in tbl.to_arrow().to_pylist()} == {x: 3 * x for x in range(30)}


def test_conflicts_insert_only_merge_insert_during_a_backfill(tmp_path):
    import mv_assets as geneva

    gate, log = _Gate(tmp_path), str(tmp_path / "calls.txt")

    @geneva.udf
    def doubled(x: int) -> int:
        gate.wait_in_udf()
        with open(log, "a") as f:
            f.write(f"{x}\n")
        return 2 * x

    db = geneva.connect(tmp_path / "db")
    tbl = db.create_table("t", pa.table({"id": list(range(6)), "x": list(range(6))}), primary_key="id")
    tbl.add_columns({"y": doubled})
    fut = tbl.backfill_async("y")
    gate.wait_started()  # the backfill is computing, from its snapshot

    try:
        # --- "Use Insert-Only Operations During Backfill"
        new_data = pa.table({"id": [0, 100, 101], "x": [50, 100, 101]})  # id 0 exists: not inserted, not updated
        # Safe: INSERT-only merge_insert
        tbl.merge_insert("id").when_not_matched_insert_all().execute(new_data)
        # ---
    finally:
        gate.open()
    fut.result(timeout=60)
    rows = {r["id"]: (r["x"], r["y"]) for r in tbl.to_arrow().to_pylist()}
    assert rows == {**{i: (i, 2 * i) for i in range(6)}, 100: (100, None), 101: (101, None)}
    tbl.backfill("y")  # the rows inserted meanwhile
    assert {r["id"]: r["y"] for r in tbl.to_arrow().to_pylist()} == {
        **{i: 2 * i for i in range(6)}, 100: 200, 101: 202}
    assert sorted(_calls(log)) == [*range(6), 100, 101]


def test_conflicts_updating_merge_insert_during_a_backfill_then_rerun(tmp_path):
    import mv_assets as geneva

    gate = _Gate(tmp_path)

    @geneva.udf
    def doubled(x: int) -> int:
        gate.wait_in_udf()
        return 2 * x

    db = geneva.connect(tmp_path / "db")
    tbl = db.create_table("t", pa.table({"id": list(range(6)), "x": list(range(6))}), primary_key="id")
    tbl.add_columns({"y": doubled})
    fut = tbl.backfill_async("y")
    gate.wait_started()

    try:
        # --- "Unsafe: Updates to existing rows"
        data = pa.table({"id": [1, 4], "x": [10, 40]})
        tbl.merge_insert("id").when_matched_update_all().execute(data)  # May conflict
        # ---
    finally:
        gate.open()
    # the page: "affected fragments fail gracefully", to be re-run. Here the backfill sees, when it
    # commits, that the update rewrote its fragment after it read it, and computes it again from
    # the updated rows: the job ends DONE, no value computed from an old x is committed
    res = fut.result(timeout=60)
    want = {0: (0, 0), 1: (10, 20), 2: (2, 4), 3: (3, 6), 4: (40, 80), 5: (5, 10)}
    assert res.rows_written == 6 and res.udf_rows_computed > 6  # (some rows computed twice)
    assert {r["id"]: (r["x"], r["y"]) for r in tbl.to_arrow().to_pylist()} == want
    # "Re-run the backfill": nothing is left to do
    assert tbl.backfill("y").rows_written == 0
    assert {r["id"]: (r["x"], r["y"]) for r in tbl.to_arrow().to_pylist()} == want
    # when_matched_update_all() alone inserts nothing
    tbl.merge_insert("id").when_matched_update_all().execute(pa.table({"id": [9], "x": [9]}))
    assert tbl.count_rows() == 6


def test_conflicts_monitor_backfill_progress_block(tmp_path):
    import mv_assets as geneva

    @geneva.udf
    def doubled(x: int) -> int:
        return 2 * x

    db = geneva.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": list(range(8))}))
    tbl.add_columns({"column_name": doubled})

    # --- "Monitor Backfill Progress"
    fut = tbl.backfill_async("column_name")
    while not fut.done():
        time.sleep(1)
    # Check for errors before subsequent operations
    result = fut.result()
    # ---
    assert result.status == "DONE" and result.rows_written == 8
    assert {r["x"]: r["column_name"] for r in tbl.to_arrow().to_pylist()} == {x: 2 * x for x in range(8)}


# -- end-to-end.mdx (written for LanceDB Enterprise: connected to a local catalog here) ---------


def test_end_to_end_example(tmp_path, stand_ins):
    # --- "1. Connect and create a table", import changed; the `db://` Enterprise connection
    # (host_override, api_key) is a local catalog here
    import os  # noqa: F401 (as the page writes it: its db:// connection read the environment)

    import pyarrow as pa  # noqa: F811 (as the page writes it)

    import mv_assets as geneva

    # Connect to LanceDB Enterprise
    db = geneva.connect(uri=str(tmp_path / "my-db"))  # the page's "db://my-db", host_override, api_key

    # Create a raw product table
    schema = pa.schema([
        pa.field("product_id", pa.int64()),
        pa.field("title", pa.string()),
        pa.field("description", pa.string()),
        pa.field("category", pa.string()),
        pa.field("price", pa.float64()),
    ])

    data = pa.table({
        "product_id": [1, 2, 3, 4, 5],
        "title": ["Chainmail Coif", "Jousting Lance Grip Tape", "Dragon-Repellent Spray", "Sword Squeegee", "Visor Windshield Wipers"],  # noqa: E501
        "description": [
            "Premium riveted chainmail head covering. Breathable enough for dragon fire, probably.",
            "Non-slip grip tape for jousting lances. 3000 PSI tensile strength. Void where tilting is prohibited.",
            "All-natural herbal spray. Dragons hate it. Effectiveness not guaranteed against actual dragons.",
            "Ergonomic squeegee fits all standard broadswords. Removes blood, mud, and existential dread.",
            "Hand-cranked windshield wipers for full-face visors. Never ride blind into battle again.",
        ],
        "category": ["armor", "tournament", "defense", "maintenance", "armor"],
        "price": [129.99, 45.00, 59.99, 34.99, 24.99],
    })

    try:
        db.drop_table("products_raw")
    except Exception:
        pass
    table = db.create_table("products_raw", data=data, schema=schema)
    # ---

    # --- "2. Define UDFs", import changed
    import pyarrow as pa  # noqa: F811

    from mv_assets import udf

    @udf(data_type=pa.int32())
    def word_count(description: str) -> int:
        """Count words in the description."""
        return len(description.split())

    @udf(data_type=pa.string())
    def price_tier(price: float) -> str:
        """Bucket price into tiers."""
        if price < 30:
            return "budget"
        elif price < 75:
            return "mid-range"
        else:
            return "premium"
    # ---

    # --- "3. Register columns and run a backfill"
    # Add computed columns
    table.add_columns({
        "word_count": word_count,
        "price_tier": price_tier,
    })

    # Run the backfills
    table.backfill("word_count")
    table.backfill("price_tier")
    # ---

    def tier(price: float) -> str:
        return "budget" if price < 30 else "mid-range" if price < 75 else "premium"

    def raw_rows(d: pa.Table) -> dict:
        return {r["product_id"]: (len(r["description"].split()), tier(r["price"])) for r in d.to_pylist()}

    assert {r["product_id"]: (r["word_count"], r["price_tier"]) for r in table.to_arrow().to_pylist()} == raw_rows(data)

    # --- "4. Create a materialized view with embeddings", import changed (GenevaManifest and
    # sentence_transformers: stand-ins; manifest= is accepted with a warning)
    from mv_assets import udf  # noqa: F811
    from mv_assets.manifest import GenevaManifest  # pyright: ignore[reportMissingImports]

    # Bundle the embedding model's dependencies and attach them to the UDF
    embed_manifest = (
        GenevaManifest.create_pip("embedding-deps")
        .pip(["sentence-transformers==3.3.1", "torch==2.5.1"])
        .build()
    )

    with pytest.warns(geneva.GenevaCompatWarning, match="manifest"):
        @udf(data_type=pa.list_(pa.float32(), 384), manifest=embed_manifest)
        class EmbedDescription:
            def __init__(self):
                self.model = None

            def __call__(self, description: str) -> list[float]:
                if self.model is None:
                    from sentence_transformers import SentenceTransformer  # pyright: ignore[reportMissingImports]
                    self.model = SentenceTransformer("BAAI/bge-small-en-v1.5")
                return self.model.encode(description, normalize_embeddings=True).tolist()

    # Build a query that selects search columns plus the derived embedding
    query = table.search(None).select({
        "product_id": "product_id",
        "title": "title",
        "description": "description",
        "category": "category",
        "word_count": "word_count",
        "embedding": EmbedDescription(),
    })

    # Create the materialized view and populate it — the embedding UDF runs on refresh
    db.create_materialized_view("products_enriched", query)
    enriched = db.open_table("products_enriched")
    enriched.refresh()  # pyright: ignore[reportAttributeAccessIssue]  (open_table gives the MaterializedView)
    # ---

    def view_rows(d: pa.Table) -> dict:
        return {r["product_id"]: (r["title"], r["category"], len(r["description"].split()), _embed(r["description"], 384))
                for r in d.to_pylist()}

    def got_view() -> dict:
        return {r["product_id"]: (r["title"], r["category"], r["word_count"], r["embedding"])
                for r in enriched.to_arrow().to_pylist()}

    assert got_view() == view_rows(data)
    assert enriched.schema.names == ["product_id", "title", "description", "category", "word_count", "embedding"]

    # --- "5. Query the enriched table"
    enriched = db.open_table("products_enriched")

    # Vector search
    results = (
        enriched.search([0.1] * 384, vector_column_name="embedding")
        .limit(3)
        .to_arrow()
    )

    # Filtered search — armor category only
    armor_results = (
        enriched.search([0.1] * 384, vector_column_name="embedding")
        .where("category = 'armor'")
        .limit(3)
        .to_arrow()
    )
    # ---

    def nearest(rows: list[dict], k: int) -> list[int]:
        def dist(r: dict) -> float:
            return float(sum((np.float32(v) - np.float32(0.1)) ** 2 for v in _embed(r["description"], 384)))
        return [r["product_id"] for r in sorted(rows, key=dist)[:k]]

    rows = data.to_pylist()
    assert results.column("product_id").to_pylist() == nearest(rows, 3)
    assert armor_results.column("product_id").to_pylist() == nearest([r for r in rows if r["category"] == "armor"], 3)
    assert armor_results.num_rows == 2

    # --- "6. Incremental refresh"
    # Append new products
    new_data = pa.table({
        "product_id": [6, 7],
        "title": ["Moat Floaties", "Knight-Night Sleep Mask"],
        "description": [
            "Inflatable arm floaties in battleship grey. Because even knights can't always swim in full plate.",
            "Padded silk sleep mask embroidered with your coat of arms. Blocks out 100% of torchlight.",
        ],
        "category": ["defense", "armor"],
        "price": [29.99, 19.99],
    })
    table.add(new_data)

    # Only null/new values are computed
    table.backfill("word_count")
    table.backfill("price_tier")

    # Incrementally materialize the new rows (including their embeddings) into the view
    enriched.refresh()  # pyright: ignore[reportAttributeAccessIssue]
    # ---
    all_rows = pa.concat_tables([data, new_data])
    assert {r["product_id"]: (r["word_count"], r["price_tier"]) for r in table.to_arrow().to_pylist()} == raw_rows(all_rows)
    assert got_view() == view_rows(all_rows)
    assert stand_ins.loaded == ["BAAI/bge-small-en-v1.5"]  # one model per process: the stateful UDF's instance


# -- jobs/bulk-load-columns.mdx ---------------------------------------------------------------


def _write_embeddings(folder, ids: list[int], salt: int, files: int = 2) -> None:
    """Parquet files of (document_id, embedding) under ``folder``, ``files`` of them."""
    import os
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for n in range(files):
        part = ids[n::files]
        pq.write_table(pa.table({"document_id": part, "embedding": [_vec(i, salt) for i in part]}),
                       os.path.join(folder, f"part-{n}.parquet"))


def _vec(i: int, salt: int) -> list[float]:
    return [i + salt / 10, -float(i)]


def test_bulk_load_columns_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the page's "my_db" is relative
    ids = [1, 2, 3, 4, 5, 6]
    mv_assets.connect("my_db").create_table(
        "my_table", pa.table({"document_id": ids, "col_a": list("xyzuvw")}), primary_key="document_id")
    # the page's s3://bucket/... prefixes: the same URIs (a scheme, folders of Parquet files) over a local folder
    bucket = f"file://{tmp_path}/bucket"
    _write_embeddings(tmp_path / "bucket/embeddings", ids, salt=1)
    _write_embeddings(tmp_path / "bucket/embeddings_v2", ids, salt=2)

    def embeddings() -> dict:
        return {r["document_id"]: r["embedding"] for r in table.to_arrow().to_pylist()}

    # --- "Basic usage", `import lancedb` -> `import mv_assets as lancedb` (the page's load_columns
    # is Geneva's Table method), the URIs under `bucket`
    import mv_assets as lancedb

    db = lancedb.connect("my_db")
    table = db.open_table("my_table")

    # Add a new embedding column from a Parquet source
    table.load_columns(
        source=f"{bucket}/embeddings/",
        pk="document_id",
        columns=["embedding"],
    )
    assert embeddings() == {i: _vec(i, 1) for i in ids}  # (checked between the page's two calls)

    # Later, update the same column with refreshed embeddings
    table.load_columns(
        source=f"{bucket}/embeddings_v2/",
        pk="document_id",
        columns=["embedding"],
    )
    # ---
    assert embeddings() == {i: _vec(i, 2) for i in ids}
    assert {r["document_id"]: r["col_a"] for r in table.to_arrow().to_pylist()} == dict(zip(ids, "xyzuvw", strict=True))

    # --- "Handling missing keys"
    _write_embeddings(tmp_path / "bucket/partial_embeddings", [1, 2, 3], salt=3)
    # Default: unmatched rows keep their current value
    table.load_columns(
        source=f"{bucket}/partial_embeddings/",
        pk="document_id",
        columns=["embedding"],
        on_missing="carry",
    )
    assert embeddings() == {i: _vec(i, 3 if i <= 3 else 2) for i in ids}

    # Strict mode: fail if source doesn't cover all rows
    table.load_columns(
        source=f"{bucket}/embeddings/",
        pk="document_id",
        columns=["embedding"],
        on_missing="error",
    )
    # ---
    assert embeddings() == {i: _vec(i, 1) for i in ids}
    with pytest.raises(ValueError, match="3 rows of 'my_table' have no match in the source"):
        table.load_columns(source=f"{bucket}/partial_embeddings/", pk="document_id", columns=["embedding"],
                           on_missing="error")
    assert embeddings() == {i: _vec(i, 1) for i in ids}  # nothing written

    # --- "Concurrency" and "Commit visibility": accepted with a warning (one pass, one commit here)
    _write_embeddings(tmp_path / "bucket/embeddings", ids, salt=4)
    with pytest.warns(lancedb.GenevaCompatWarning, match="concurrency=16"):
        table.load_columns(
            source=f"{bucket}/embeddings/",
            pk="document_id",
            columns=["embedding"],
            concurrency=16,
        )
    assert embeddings() == {i: _vec(i, 4) for i in ids}
    _write_embeddings(tmp_path / "bucket/embeddings", ids, salt=5)
    with pytest.warns(lancedb.GenevaCompatWarning, match="commit_granularity=10"):
        table.load_columns(
            source=f"{bucket}/embeddings/",
            pk="document_id",
            columns=["embedding"],
            commit_granularity=10,
        )
    # ---
    assert embeddings() == {i: _vec(i, 5) for i in ids}

    # --- "Multi-pass loads for large sources" (five files, four passes)
    _write_embeddings(tmp_path / "bucket/embeddings", ids, salt=6, files=5)
    versions = []
    import pyarrow.dataset as pads

    # Discover source files (metadata only, no data I/O)
    source_files = pads.dataset(f"{bucket}/embeddings/", format="parquet").files

    # Split into N chunks and run sequentially
    N = 4
    total = len(source_files)
    for i in range(N):
        chunk = source_files[i * total // N : (i + 1) * total // N]
        table.load_columns(
            source=chunk,
            pk="document_id",
            columns=["embedding"],
        )
        versions.append(table.version)
    # ---
    assert embeddings() == {i: _vec(i, 6) for i in ids}
    assert len(set(versions)) == N  # one commit per pass, each carrying the others' rows

    # --- "If the source is already partitioned into subdirectories"
    for shard in range(4):
        _write_embeddings(tmp_path / f"bucket/embeddings/shard_{shard}", ids[shard::4], salt=7 + shard, files=1)
    for shard in range(4):
        table.load_columns(
            source=f"{bucket}/embeddings/shard_{shard}/",
            pk="document_id",
            columns=["embedding"],
        )
    # ---
    assert embeddings() == {i: _vec(i, 7 + ids.index(i) % 4) for i in ids}
