"""Geneva's official examples run with only the import changed (inline runner, real Lance files).

The programs are lancedb/geneva-examples' ``text/enrich``, ``images/lightweight``,
``debugging/seed_errors``, ``pdf/chunk`` and ``video/chunk`` (each ``run()`` and the shared
helpers it calls from ``core/``: ``connect``, ``backfill_column``, ``runtime_session``, ...),
and the getting-started page of Geneva's docs. Each is copied as written, with
``import geneva`` -> ``import mv_assets as geneva`` and ``from geneva... import`` ->
``from mv_assets... import``; only what calls a model or a media library (sentence-transformers,
PIL, PyAV, pypdf and LangChain's splitter) is a cheap deterministic stand-in of the same
signature, and each program runs in local mode (``Config`` below) on small data the test makes.
``pdf/chunk`` takes Geneva's ready-made ``geneva.udfs.document`` UDFs, which mv_assets does not
ship (docs/geneva.md): stand-ins of the same name, signature and type are built with
``@udf(manifest=, version=)`` where the example ``attrs.evolve``s Geneva's objects.

Every test checks the rows against an expectation computed here in plain Python.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import mv_assets
from mv_assets.execution.spark import InlineRunner, set_default_runner

logger = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def inline_default():
    """``geneva.connect(uri=...)`` with no runner (as the examples call it) runs inline."""
    set_default_runner(InlineRunner())
    with warnings.catch_warnings():
        # local mode passes _admission_check=False, max_checkpoint_size=...: accepted, each with its warning
        warnings.simplefilter("ignore", mv_assets.GenevaCompatWarning)
        yield
    set_default_runner(None)


@dataclass
class Config:
    """geneva_examples.core.config.Config, local mode (what the examples read of it)."""

    local_db_path: str
    mode: str = "local"
    db_uri: str = ""

    @property
    def is_local(self) -> bool:
        return self.mode == "local"

    def storage_options(self) -> dict[str, str]:
        return {}


# -- geneva_examples/core (as written; `import geneva` -> `import mv_assets as geneva`) -----------

_MEMORY_MAX_BYTES = 2**31 - 1


def format_sample(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    cols = columns or list(rows[0].keys())
    return "\n".join("  ".join(str(r.get(c))[:40] for c in cols) for r in rows)


def memory_request_bytes(gib: float) -> int:
    requested = int(gib * 1024**3)
    if requested > _MEMORY_MAX_BYTES:
        return _MEMORY_MAX_BYTES
    return requested


def connect(config: Config) -> Any:
    import mv_assets as geneva

    if config.is_local:
        local_path = Path(config.local_db_path).expanduser()
        logger.info("connecting local geneva at %s", local_path)
        return geneva.connect(
            uri=local_path,
            storage_options=config.storage_options(),
        )

    return geneva.connect(uri=config.db_uri, storage_options=config.storage_options())


OPT_STABLE_ROW_IDS = "new_table_enable_stable_row_ids"


def require_stable_row_ids(table, table_name: str) -> None:
    from mv_assets.db import dataset_uses_stable_row_ids

    if dataset_uses_stable_row_ids(table.to_lance()):
        return
    raise RuntimeError(f"source table {table_name!r} does not have stable row IDs")


def runtime_session(conn: object, config: Config) -> AbstractContextManager:
    if not config.is_local:
        return nullcontext()
    verbose = logging.getLogger("geneva_examples").getEffectiveLevel() <= logging.DEBUG
    try:
        from mv_assets.runners.ray._mgr import ray_cluster  # type: ignore[import-not-found]

        return ray_cluster(
            local=True,
            log_to_driver=verbose,
            logging_level=logging.DEBUG if verbose else logging.WARNING,
        )
    except Exception:  # noqa: BLE001 - degrade to the public (noisier) API
        return conn.local_ray_context()  # type: ignore[attr-defined]


def build_manifest(config: Config, prefix: str, pip: list[str]) -> object | None:
    if config.is_local:
        return None
    raise AssertionError("the examples run in local mode here")


def total_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def resolve_resources(config: Config, *, num_cpus: float, num_gpus: float | None, memory_gib: float):
    memory_bytes = memory_request_bytes(memory_gib)
    if not config.is_local:
        return num_cpus, num_gpus, memory_bytes
    cpu_cap = float(max(1, min(int(num_cpus), os.cpu_count() or 1)))
    ram = total_ram_bytes()
    if ram is not None:
        memory_bytes = min(memory_bytes, max(256 * 1024**2, int(ram * 0.25)))
    return cpu_cap, 0, memory_bytes


def local_or(config: Config, local_value, enterprise_value):
    return local_value if config.is_local else enterprise_value


def local_concurrency(requested: int) -> int:
    return max(1, min(requested, (os.cpu_count() or 1) - 1))


def retry_io(label: str, operation: Callable, attempts: int = 5, sleep_s: float = 2.0) -> Any:
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except Exception:
            if attempt == attempts:
                raise
            time.sleep(sleep_s * attempt)


def wait_for_columns(conn, table_name: str, required: set[str], attempts: int, sleep_s: int) -> Any:
    for _ in range(attempts):
        opened = conn.open_table(table_name)
        if required.issubset(set(opened.schema.names)):
            return opened
        time.sleep(sleep_s)
    raise RuntimeError(f"required columns not visible: {sorted(required)}")


def backfill_column(
    *, conn, table, table_name: str, column: str, udf: object, concurrency: int, task_size: int,
    checkpoint_size: int, flush_interval_s: float, timeout_min: int, wait_attempts: int, wait_sleep_s: int,
    use_cpu_only_pool: bool = False, reset: bool = True,
):
    """geneva_examples.core.backfill.backfill_column, as written."""
    column_exists = column in set(table.schema.names)
    if reset and column_exists:
        try:
            table.drop_columns([column])
        except Exception:  # noqa: BLE001
            pass
        column_exists = False

    if not column_exists:
        table.add_columns({column: udf})
        table = wait_for_columns(
            conn=conn, table_name=table_name, required={column}, attempts=wait_attempts, sleep_s=wait_sleep_s,
        )

    is_remote = bool(conn.is_remote())
    backfill_kwargs: dict = dict(task_size=task_size)
    if is_remote:
        backfill_kwargs.update(checkpoint_size=checkpoint_size, use_cpu_only_pool=use_cpu_only_pool)
    else:
        concurrency = local_concurrency(concurrency)
        backfill_kwargs.update(
            max_checkpoint_size=checkpoint_size,
            _admission_check=False,
        )

    start = time.perf_counter()
    job = table.backfill(
        column,
        concurrency=concurrency,
        batch_checkpoint_flush_interval_seconds=flush_interval_s,
        timeout=timedelta(minutes=timeout_min),
        **backfill_kwargs,
    )
    logger.info("job %s %s", column, job.job_id)
    logger.info("backfill_seconds %s %s", column, round(time.perf_counter() - start, 3))

    table.checkout_latest()
    logger.info("null_%s %s", column, table.count_rows(f"`{column}` IS NULL"))
    return table


# -- text/enrich: a materialized view whose embedding column is a stateful batch UDF ---------------

DIM = 4
_SETUP_LOG = "MV_ASSETS_TEST_SETUP_LOG"  # a file: one line per model loaded (globals travel by value with the UDF)


def _setups() -> int:
    path = Path(os.environ[_SETUP_LOG])
    return len(path.read_text().splitlines()) if path.exists() else 0


def _stand_in_vector(text: str) -> list[float]:
    """The stand-in model's embedding: character codes summed by position mod DIM, L2-normalized."""
    v = [0.0] * DIM
    for i, ch in enumerate(text):
        v[i % DIM] += ord(ch)
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class SentenceTransformer:
    """Stand-in for sentence_transformers.SentenceTransformer (same calls the example makes)."""

    def __init__(self, model_name: str, device: str | None = None) -> None:
        with open(os.environ[_SETUP_LOG], "a") as f:
            f.write(model_name + "\n")
        self.device = device or "cpu"

    def get_embedding_dimension(self) -> int:
        return DIM

    get_sentence_embedding_dimension = get_embedding_dimension  # the older name

    def encode(self, texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False):
        import numpy as np

        return np.array([_stand_in_vector(t) for t in texts], dtype=np.float32)


def build_embed_description_udf(
    *, input_column: str = "description", manifest: Any, model_name: str, dim: int = 0, batch_size: int = 64,
    device: str = "", num_cpus: float = 2.0, num_gpus: float | None = None, memory_bytes: int = 4 * 1024**3,
    checkpoint_size: int = 512, task_size: int = 512,
):
    """geneva_examples/examples/text/embed_description.py (setup()'s model: the stand-in)."""
    import mv_assets as geneva

    _model_name = model_name
    _dim = dim
    _batch_size = max(1, int(batch_size))
    _device = device or None

    @geneva.udf(
        data_type=pa.list_(pa.float32(), _dim),
        input_columns=[input_column],
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        checkpoint_size=checkpoint_size,
        task_size=task_size,
        version=uuid.uuid4().hex,
        manifest=manifest,
        field_metadata={"model": _model_name, "normalized": "l2"},
    )
    class EmbedDescription(Callable):  # pyright: ignore[reportGeneralTypeIssues]  (as written)
        def __init__(self):
            self.is_loaded = False
            self.logged = False
            self.model_name = _model_name
            self.dim = _dim
            self.batch_size = _batch_size
            self.device = _device

        def setup(self):
            self.model = SentenceTransformer(self.model_name, device=self.device)
            reader = getattr(self.model, "get_embedding_dimension", None)
            reported = reader() if reader else self.model.get_sentence_embedding_dimension()
            if reported is not None and int(reported) != self.dim:
                raise ValueError(f"model {self.model_name!r} emits {reported}-dim embeddings")
            self.is_loaded = True

        def __call__(self, col: pa.Array) -> pa.Array:
            import numpy as np
            import pyarrow as pa

            if not self.is_loaded:
                self.setup()

            vector_type = pa.list_(pa.float32(), self.dim)
            texts = col.to_pylist()
            n = len(texts)
            if n == 0:
                return pa.array([], type=vector_type)
            if not self.logged:
                print("embed_description_udf", {"model": self.model_name, "rows": n}, flush=True)
                self.logged = True
            valid = [i for i, text in enumerate(texts) if text and text.strip()]
            if not valid:
                return pa.array([None] * n, type=vector_type)
            vectors = self.model.encode(
                [texts[i] for i in valid],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            vectors = np.asarray(vectors, dtype=np.float32)
            if len(valid) == n:
                return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), self.dim)
            rows: list[Any] = [None] * n
            for position, index in enumerate(valid):
                rows[index] = vectors[position].tolist()
            return pa.array(rows, type=vector_type)

    return EmbedDescription()


PASSTHROUGH_COLUMNS = ("product_id", "title", "description", "category", "word_count")


def run_enrich(
    cfg: Config, *, source_table: str = "products", view_name: str = "products_enriched_mv",
    input_column: str = "description", output_column: str = "embedding", model_name: str = "stand-in-minilm",
    dim: int = DIM, batch_size: int = 64, device: str = "", num_cpus: float = 2.0, num_gpus: float | None = None,
    memory_gib: int = 1, checkpoint_size: int = 512, task_size: int = 512, concurrency: int = 4,
    source_task_size: int | None = None, max_rows_per_fragment: int | None = None, overwrite: bool = True,
    search_demo: bool = True, query_text: str = "a warm layer for hiking in cold weather",
    table_write_retries: int = 5, table_write_retry_sleep_s: float = 2.0,
) -> list[dict]:
    """text/enrich.py's run() (returns the search demo's rows, which the example logs)."""
    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 0.5
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, min(batch_size, 16), batch_size)
    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)

    conn = connect(cfg)
    src = conn.open_table(source_table)
    require_stable_row_ids(src, source_table)

    view: Any = None
    if overwrite:
        try:
            conn.drop_table(view_name)
        except Exception:  # noqa: BLE001
            pass
    else:
        try:
            view = conn.open_table(view_name)
        except Exception:  # noqa: BLE001 - absent view: create it below
            view = None

    if view is None:
        manifest = build_manifest(cfg, "text-embed", [])
        udf = build_embed_description_udf(
            input_column=input_column, manifest=manifest, model_name=model_name, dim=dim, batch_size=batch_size,
            device=device, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes,
            checkpoint_size=checkpoint_size, task_size=task_size,
        )
        projection: dict[str, object] = {name: name for name in PASSTHROUGH_COLUMNS}
        projection[output_column] = udf
        query = src.search(None).select(projection)
        view = retry_io(
            "create_materialized_view",
            lambda: conn.create_materialized_view(view_name, query),
            attempts=table_write_retries,
            sleep_s=table_write_retry_sleep_s,
        )
        logger.info("created_view %s columns %s", view_name, view.schema.names)

    refresh_kwargs: dict = {}
    if source_task_size is not None:
        refresh_kwargs["source_task_size"] = source_task_size
    if max_rows_per_fragment is not None:
        refresh_kwargs["max_rows_per_fragment"] = max_rows_per_fragment
    if cfg.is_local:
        concurrency = local_concurrency(concurrency)
        refresh_kwargs["_admission_check"] = False

    with runtime_session(conn, cfg):
        view.refresh(concurrency=concurrency, **refresh_kwargs)
    view.checkout_latest()

    logger.info("view_rows %s", view.count_rows())
    logger.info("view_columns %s", view.schema.names)
    logger.info("view_sample\n%s", format_sample(
        view.search().select(["product_id", "category", "word_count", output_column]).limit(5).to_list()
    ))
    rows: list[dict] = []
    if search_demo:
        query_vector = _stand_in_vector(query_text)  # encode_query(query_text, model_name=...): the stand-in
        rows = view.search(query_vector, output_column).limit(5).to_list()
        logger.info("search_query %r matches %s", query_text, len(rows))
    return rows


def _products(ids) -> list[dict]:
    cats = ["outdoor", "kitchen", "toys"]
    out = []
    for i in ids:
        desc = "" if i % 5 == 4 else f"product {i} " + "warm " * (i % 3) + cats[i % 3]
        out.append({"product_id": i, "title": f"title {i}", "description": desc, "category": cats[i % 3],
                    "word_count": len(desc.split())})
    return out


def _expected_enriched(products: list[dict]) -> dict[int, dict]:
    out = {}
    for p in products:
        vec = _stand_in_vector(p["description"]) if p["description"].strip() else None
        out[p["product_id"]] = {**p, "embedding": vec}
    return out


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return all(abs(x - y) < 1e-6 for x, y in zip(a, b, strict=True))


def test_text_enrich_example_builds_the_embedding_view_and_refreshes_it_incrementally(tmp_path, monkeypatch):
    monkeypatch.setenv(_SETUP_LOG, str(tmp_path / "setups"))
    cfg = Config(local_db_path=str(tmp_path / "db"))
    products = _products(range(12))
    conn = connect(cfg)
    conn.create_table("products", data=products, mode="overwrite", storage_options={OPT_STABLE_ROW_IDS: "true"})
    hits = run_enrich(cfg, source_task_size=5, max_rows_per_fragment=4)

    view = conn.open_table("products_enriched_mv")
    got = {r["product_id"]: r for r in view.to_arrow().to_pylist()}
    want = _expected_enriched(products)
    assert sorted(got) == sorted(want)
    for pid, w in want.items():
        assert {k: got[pid][k] for k in PASSTHROUGH_COLUMNS} == {k: w[k] for k in PASSTHROUGH_COLUMNS}
        assert _close(got[pid]["embedding"], w["embedding"])
    assert view.schema.field("embedding").metadata == {b"model": b"stand-in-minilm", b"normalized": b"l2"}
    assert _setups() == 1  # one model load in this process
    # the search demo: the 5 nearest products to the query by L2 distance, nearest first
    q = _stand_in_vector("a warm layer for hiking in cold weather")
    ranked = sorted((sum((x - y) ** 2 for x, y in zip(w["embedding"], q, strict=True)), pid)
                    for pid, w in want.items() if w["embedding"] is not None)
    assert [h["product_id"] for h in hits] == [pid for _, pid in ranked[:5]]

    # incremental: append products, run with overwrite=False: only the new rows are embedded
    more = _products(range(12, 16))
    conn.open_table("products").add(more)
    run_enrich(cfg, overwrite=False, search_demo=False)
    got = {r["product_id"]: r for r in conn.open_table("products_enriched_mv").to_arrow().to_pylist()}
    want = _expected_enriched(products + more)
    assert sorted(got) == sorted(want)
    assert all(_close(got[p]["embedding"], want[p]["embedding"]) for p in want)
    assert _setups() == 1  # the view's stored UDF is the instance already set up


# -- images/lightweight: two scalar UDF columns backfilled -------------------------------------


def _image_bytes(width: int, height: int) -> bytes:
    """A stand-in encoded image: a header with its size, then pixels."""
    return b"IMG" + width.to_bytes(2, "big") + height.to_bytes(2, "big") + bytes(width * height % 251)


class _StandInImage:
    """Stand-in for PIL.Image: open(BytesIO) -> a context manager with .size."""

    def __init__(self, buf) -> None:
        raw = buf.read()
        self.size = (int.from_bytes(raw[3:5], "big"), int.from_bytes(raw[5:7], "big"))

    @classmethod
    def open(cls, buf) -> _StandInImage:
        return cls(buf)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def build_file_size_udf(*, input_column: str, manifest: Any):
    import mv_assets as geneva

    @geneva.udf(
        data_type=pa.int64(),
        input_columns=[input_column],
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    def file_size(col: bytes) -> int:
        return len(col)

    return file_size


def build_dimensions_udf(*, input_column: str, manifest: Any):
    import mv_assets as geneva

    @geneva.udf(
        data_type=pa.struct([pa.field("width", pa.int32()), pa.field("height", pa.int32())]),
        input_columns=[input_column],
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    def dimensions(col: bytes) -> dict[str, int]:
        from io import BytesIO

        Image = _StandInImage  # from PIL import Image: the stand-in

        with Image.open(BytesIO(col)) as img:
            width, height = img.size
        return {"width": int(width), "height": int(height)}

    return dimensions


def run_lightweight(cfg: Config, *, table_name: str = "images", backfill_timeout_min: int = 1000,
                    backfill_concurrency: int = 32, backfill_task_size: int = 256, backfill_checkpoint_size: int = 128,
                    backfill_flush_interval_s: float = 30.0, use_cpu_only_pool: bool = True,
                    schema_wait_attempts: int = 30, schema_wait_sleep_s: int = 2) -> None:
    """images/lightweight.py's run()."""
    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    conn = connect(cfg)
    table = conn.open_table(table_name)
    manifest = build_manifest(cfg, "light", [])
    columns = {
        "file_size": build_file_size_udf(input_column="image", manifest=manifest),
        "dimensions": build_dimensions_udf(input_column="image", manifest=manifest),
    }
    with runtime_session(conn, cfg):
        for column, udf in columns.items():
            table = backfill_column(
                conn=conn, table=table, table_name=table_name, column=column, udf=udf,
                concurrency=backfill_concurrency, task_size=backfill_task_size,
                checkpoint_size=backfill_checkpoint_size, flush_interval_s=backfill_flush_interval_s,
                timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts,
                wait_sleep_s=schema_wait_sleep_s, use_cpu_only_pool=use_cpu_only_pool,
            )
    logger.info("feature_sample\n%s", format_sample(
        table.search().select(["image_id", "label", "file_size", "dimensions"]).limit(5).to_list()
    ))


def test_images_lightweight_example_backfills_file_size_and_dimensions(tmp_path):
    cfg = Config(local_db_path=str(tmp_path / "db"))
    sizes = {i: (3 + i, 2 + 2 * i) for i in range(9)}
    images = [{"image_id": i, "label": f"l{i % 2}", "image": _image_bytes(*sizes[i])} for i in range(9)]
    connect(cfg).create_table("images", data=images, storage_options={OPT_STABLE_ROW_IDS: "true"})

    run_lightweight(cfg, backfill_task_size=4)
    run_lightweight(cfg, backfill_task_size=4)  # again: reset=True drops and recomputes each column

    got = sorted(connect(cfg).open_table("images").to_arrow().to_pylist(), key=lambda r: r["image_id"])
    assert [(r["image_id"], r["file_size"], r["dimensions"]) for r in got] == [
        (i["image_id"], len(i["image"]), {"width": sizes[i["image_id"]][0], "height": sizes[i["image_id"]][1]})
        for i in images
    ]


# -- debugging/seed_errors: a faulty UDF under skip_on_error() ---------------------------------


def build_faulty_score_udf(*, input_column: str, fail_every: int, manifest: Any):
    import mv_assets as geneva
    from mv_assets import skip_on_error

    @geneva.udf(
        data_type=pa.float64(),
        input_columns=[input_column],
        num_cpus=1,
        version=uuid.uuid4().hex,
        manifest=manifest,
        on_error=skip_on_error(),
    )
    def faulty_score(value: int) -> float:
        if fail_every > 0 and value % fail_every == 0:
            raise ValueError(f"synthetic corruption: value={value} is divisible by {fail_every}")
        if value % 10 == 9:
            raise TimeoutError(f"synthetic flaky I/O: timed out reading value={value}")
        return value * 1.5

    return faulty_score


def _latest_job_id(conn: object, table_name: str) -> str | None:
    try:
        jobs = [
            jr
            for status in ("DONE", "RUNNING", "FAILED")
            for jr in conn.list_jobs(table_name=table_name, status=status)  # type: ignore[attr-defined]
        ]
    except Exception as exc:  # noqa: BLE001
        logger.warning("list_jobs failed: %s", exc)
        return None
    if not jobs:
        return None
    jobs.sort(key=lambda jr: getattr(jr, "launched_at", None) or 0)
    return getattr(jobs[-1], "job_id", None)


def run_seed_errors(cfg: Config, *, table_name: str = "debug_demo", rows: int = 40, fail_every: int = 7,
                    concurrency: int = 2, task_size: int = 32, checkpoint_size: int = 32,
                    backfill_timeout_min: int = 30, flush_interval_s: float = 5.0, schema_wait_attempts: int = 30,
                    schema_wait_sleep_s: int = 2) -> dict:
    """debugging/seed_errors.py's run() (returns what it logs)."""
    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    conn = connect(cfg)
    data = [{"id": i, "value": i} for i in range(1, rows + 1)]
    table = conn.create_table(
        table_name,
        data=data,
        mode="overwrite",
        storage_options={OPT_STABLE_ROW_IDS: "true"},
    )
    manifest = build_manifest(cfg, "debug-demo", [])
    udf = build_faulty_score_udf(input_column="value", fail_every=fail_every, manifest=manifest)
    with runtime_session(conn, cfg):
        table = backfill_column(
            conn=conn, table=table, table_name=table_name, column="score", udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
            use_cpu_only_pool=True,
        )
    job_id = _latest_job_id(conn, table_name)
    nulls = table.count_rows("score IS NULL")
    try:
        errors = table.get_errors(job_id=job_id) if job_id else table.get_errors()
    except Exception as exc:  # noqa: BLE001
        logger.warning("error store unavailable: %s", exc)
        errors = []
    by_type = Counter(str(getattr(e, "error_type", None) or "UnknownError") for e in errors)
    return {"job_id": job_id, "nulls": nulls, "errors": errors, "by_type": by_type, "table": table}


def test_debugging_seed_errors_example_leaves_nulls_and_one_error_record_per_failed_row(tmp_path):
    cfg = Config(local_db_path=str(tmp_path / "db"))
    out = run_seed_errors(cfg, rows=40, task_size=16)

    fails_value = {v for v in range(1, 41) if v % 7 == 0}
    fails_timeout = {v for v in range(1, 41) if v % 10 == 9 and v % 7 != 0}
    assert out["job_id"]
    assert out["nulls"] == len(fails_value | fails_timeout)
    assert out["by_type"] == Counter({"ValueError": len(fails_value), "TimeoutError": len(fails_timeout)})
    got = {r["id"]: r["score"] for r in out["table"].to_arrow().to_pylist()}
    assert got == {v: (None if v in fails_value | fails_timeout else v * 1.5) for v in range(1, 41)}

    out = run_seed_errors(cfg, rows=20)  # a second run overwrites the table and reports its own job
    assert out["by_type"] == Counter({"ValueError": 2, "TimeoutError": 2})  # 7, 14; 9, 19


# -- pdf/chunk: two chained list<struct> UDF columns ---------------------------------------------

_PAGE_STRUCT = pa.struct([pa.field("page_number", pa.int32()), pa.field("text", pa.large_string())])
_CHUNK_STRUCT = pa.struct(
    [pa.field("page_number", pa.int32()), pa.field("chunk_id", pa.int32()), pa.field("chunk", pa.large_string())]
)
CHUNK_SIZE, CHUNK_OVERLAP = 12, 4


def _split_text(text: str) -> list[str]:
    """Stand-in for RecursiveCharacterTextSplitter(chunk_size, chunk_overlap).split_text: fixed windows."""
    step = CHUNK_SIZE - CHUNK_OVERLAP
    return [text[i : i + CHUNK_SIZE] for i in range(0, max(len(text) - CHUNK_OVERLAP, 1), step)]


def build_extract_pages_udf(*, manifest: Any):
    """pdf/document.py's factory; Geneva's ``extract_pages`` (pypdf) is a stand-in of its signature."""
    import mv_assets as geneva

    @geneva.udf(version=uuid.uuid4().hex, data_type=pa.list_(_PAGE_STRUCT), manifest=manifest)
    def extract_pages(pdf_bytes: bytes | None) -> list[dict[str, Any]] | None:
        if not pdf_bytes:
            return None
        pages = [
            {"page_number": n, "text": t.decode()} for n, t in enumerate(pdf_bytes.split(b"\f")) if t
        ]
        return pages or None

    return extract_pages


def build_chunk_pages_udf(*, manifest: Any):
    import mv_assets as geneva

    @geneva.udf(version=uuid.uuid4().hex, data_type=pa.list_(_CHUNK_STRUCT), manifest=manifest)
    def chunk_pages(pages: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if not pages:
            return None
        chunks: list[dict[str, Any]] = []
        for page in pages:
            text = page.get("text")
            page_number = int(page.get("page_number", 0))
            if not text:
                continue
            for idx, chunk_text in enumerate(_split_text(text)):
                chunks.append({"page_number": page_number, "chunk_id": int(idx), "chunk": chunk_text})
        return chunks or None

    return chunk_pages


def run_pdf_chunk(cfg: Config, *, table_name: str = "pdfs", backfill_timeout_min: int = 1000,
                  backfill_concurrency: int = 32, backfill_task_size: int = 256, backfill_checkpoint_size: int = 128,
                  backfill_flush_interval_s: float = 30.0, use_cpu_only_pool: bool = True,
                  schema_wait_attempts: int = 30, schema_wait_sleep_s: int = 2) -> None:
    """pdf/chunk.py's run()."""
    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    conn = connect(cfg)
    table = conn.open_table(table_name)
    manifest = build_manifest(cfg, "pdf", [])
    columns = {
        "pages": build_extract_pages_udf(manifest=manifest),
        "chunks": build_chunk_pages_udf(manifest=manifest),
    }
    with runtime_session(conn, cfg):
        for column, udf in columns.items():
            table = backfill_column(
                conn=conn, table=table, table_name=table_name, column=column, udf=udf,
                concurrency=backfill_concurrency, task_size=backfill_task_size,
                checkpoint_size=backfill_checkpoint_size, flush_interval_s=backfill_flush_interval_s,
                timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts,
                wait_sleep_s=schema_wait_sleep_s, use_cpu_only_pool=use_cpu_only_pool,
            )
    logger.info("chunk_sample\n%s", format_sample(table.search().select(["doc_id", "chunks"]).limit(5).to_list()))


def test_pdf_chunk_example_backfills_pages_then_chunks(tmp_path):
    cfg = Config(local_db_path=str(tmp_path / "db"))
    docs = {
        1: ["the first page of one", "a second page here"],
        2: ["short"],
        3: [],
        4: ["alpha beta gamma delta epsilon", "", "zeta"],
    }
    rows = [{"doc_id": d, "pdf_bytes": "\f".join(p).encode() if p else None} for d, p in docs.items()]
    connect(cfg).create_table("pdfs", data=rows, schema=pa.schema(
        [pa.field("doc_id", pa.int64()), pa.field("pdf_bytes", pa.binary())]), storage_options={})

    run_pdf_chunk(cfg, backfill_task_size=2)

    def expected(pages: list[str]):
        ps = [{"page_number": n, "text": t} for n, t in enumerate(pages) if t] or None
        if not ps:
            return None, None
        cs = [{"page_number": p["page_number"], "chunk_id": i, "chunk": c}
              for p in ps for i, c in enumerate(_split_text(p["text"]))]
        return ps, cs or None

    got = {r["doc_id"]: (r["pages"], r["chunks"]) for r in connect(cfg).open_table("pdfs").to_arrow().to_pylist()}
    assert got == {d: expected(p) for d, p in docs.items()}


# -- video/chunk: a chunker view yielding dicts (output_schema=) --------------------------------


def _video_bytes(duration: float) -> bytes:
    """A stand-in video: its duration, then one 'frame' byte per tenth of a second."""
    return f"{duration:.1f}|".encode() + bytes(int(duration * 10))


def chunk_video_udtf(*, chunk_seconds: float, manifest: Any, num_cpus: float = 1.0, num_gpus: float = 0.0,
                     memory_bytes: int = 1024**3, max_video_s: float | None = None, num_clips: int | None = None):
    """video/chunkers.py's factory; PyAV and PIL (probe, remux, first frame) are stand-ins."""
    import mv_assets as geneva

    output_schema = pa.schema(
        [
            pa.field("chunk_id", pa.int32()),
            pa.field("start_sec", pa.float32()),
            pa.field("end_sec", pa.float32()),
            pa.field("clip_bytes", pa.large_binary()),
            pa.field("frame", pa.large_binary()),
        ]
    )
    cs = float(chunk_seconds)
    limit = None if max_video_s is None else float(max_video_s)
    max_clips = None if num_clips is None else int(num_clips)

    @geneva.chunker(
        output_schema=output_schema,
        input_columns=["video"],
        inherit_input_columns=False,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    def _chunk_video(video: bytes):
        def _clip_windows(duration, chunk_s, max_n=None):
            if duration <= 0 or chunk_s <= 0:
                return []
            if max_n is not None and max_n <= 0:
                return []
            windows, start = [], 0.0
            while start < duration:
                end = min(start + chunk_s, duration)
                windows.append((start, end))
                if max_n is not None and len(windows) >= max_n:
                    break
                start += chunk_s
            return windows

        def _probe_video(b):  # stand-in: the duration in the header
            return float(b.split(b"|", 1)[0])

        def _encode_clip(b, start, end):  # stand-in: the frames of [start, end), the first one as the frame
            frames = b.split(b"|", 1)[1][int(start * 10) : int(end * 10)]
            return (frames or None), frames[:1]

        if video is None:
            return
        dur = _probe_video(video)
        if limit is not None and dur > limit:
            return
        for cid, (start, end) in enumerate(_clip_windows(dur, cs, max_n=max_clips)):
            clip, frame = _encode_clip(video, start, end)
            if clip is None:
                continue
            yield {
                "chunk_id": int(cid),
                "start_sec": float(start),
                "end_sec": float(end),
                "clip_bytes": clip,
                "frame": frame,
            }

    return _chunk_video


def run_video_chunk(cfg: Config, *, source_table: str = "videos", clips_table: str = "video_clips",
                    chunk_seconds: float = 10.0, concurrency: int = 2, checkpoint_size: int = 8,
                    source_task_size: int | None = None, num_cpus: float = 1.0, memory_gib: int = 1,
                    max_clips: int | None = None, max_video_s: float | None = None, overwrite: bool = True,
                    table_write_retries: int = 5, table_write_retry_sleep_s: float = 2.0):
    """video/chunk.py's run()."""
    import mv_assets as geneva

    num_cpus, _, memory_bytes = resolve_resources(cfg, num_cpus=num_cpus, num_gpus=None, memory_gib=memory_gib)
    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    conn = connect(cfg)
    src = conn.open_table(source_table)
    require_stable_row_ids(src, source_table)
    if overwrite:
        try:
            conn.drop_table(clips_table)
        except Exception:  # noqa: BLE001
            pass
    manifest = build_manifest(cfg, "video-chunking", [])
    udtf = chunk_video_udtf(chunk_seconds=chunk_seconds, manifest=manifest, num_cpus=num_cpus,
                            memory_bytes=memory_bytes, max_video_s=max_video_s, num_clips=max_clips)
    view = retry_io(
        "create_clips_view",
        lambda: conn.create_udtf_view(
            clips_table,
            source=src.search(None).select(["video_id", "video"]),
            udtf=udtf,
        ),
        attempts=table_write_retries,
        sleep_s=table_write_retry_sleep_s,
    )
    refresh_kwargs: dict = {}
    if cfg.is_local:
        concurrency = local_concurrency(concurrency)
        refresh_kwargs["_admission_check"] = False
    with runtime_session(conn, cfg):
        view.refresh(
            concurrency=concurrency,
            max_rows_per_fragment=checkpoint_size,
            source_task_size=source_task_size,
            **refresh_kwargs,
        )
    view.checkout_latest()
    logger.info("chunk_rows %s", view.count_rows())
    logger.info("clips_sample\n%s", format_sample(
        view.search().select(["video_id", "chunk_id", "start_sec", "end_sec"]).limit(5).to_list()
    ))
    return view


def test_video_chunk_example_expands_videos_into_clips(tmp_path):
    cfg = Config(local_db_path=str(tmp_path / "db"))
    durations = {10: 25.0, 11: 4.0, 12: 0.0, 13: 31.5, 14: 70.0}
    videos = [{"video_id": v, "video": _video_bytes(d)} for v, d in durations.items()]
    connect(cfg).create_table("videos", data=videos, storage_options={OPT_STABLE_ROW_IDS: "true"})

    view = run_video_chunk(cfg, max_video_s=60.0, source_task_size=2)

    want = []
    for v, d in durations.items():
        if d > 60.0:
            continue
        frames = bytes(int(d * 10))
        start, cid = 0.0, 0
        while start < d:
            end = min(start + 10.0, d)
            clip = frames[int(start * 10) : int(end * 10)]
            if clip:
                want.append({"video_id": v, "chunk_id": cid, "start_sec": start, "end_sec": end,
                             "clip_bytes": clip, "frame": clip[:1]})
            start += 10.0
            cid += 1
    got = view.to_arrow().to_pylist()
    assert "video" not in view.schema.names  # inherit_input_columns=False: the bytes stay out of the clips
    key = ["video_id", "chunk_id", "start_sec", "end_sec", "clip_bytes", "frame"]
    assert sorted(tuple(r[k] for k in key) for r in got) == sorted(tuple(w[k] for k in key) for w in want)


# -- the getting-started page -----------------------------------------------------------------------


def test_getting_started_page_runs(tmp_path):
    import mv_assets as geneva

    # (the page connects to LanceDB Enterprise, uri="db://my-db"; here a local catalog)
    db = geneva.connect(uri=tmp_path / "db")
    db.create_table("my_table", [{"text": "one two three"}, {"text": "four"}, {"text": ""}])

    tbl = db.open_table("my_table")

    # Define a User Defined Function (UDF) that counts the words in the text column
    @geneva.udf(data_type=pa.int32())
    def word_count(text: str) -> int:
        return len(text.split())

    # Register the UDF as a new virtual column
    tbl.add_columns({"word_count": word_count})

    # Backfill the new column using distributed execution with incremental checkpointing
    tbl.backfill("word_count")
    assert sorted(r["word_count"] for r in tbl.to_arrow().to_pylist()) == [0, 1, 3]

    # Auto-backfill: accepted with a warning saying that backfill() computes the column here
    with pytest.warns(geneva.GenevaCompatWarning, match=r"udf\(auto_backfill=True\) does not apply here"):
        @geneva.udf(data_type=pa.int32(), auto_backfill=True)
        def word_count(text: str) -> int:  # noqa: F811 (the page's second version)
            return len(text.split()) * 10

    tbl.alter_columns({"path": "word_count", "udf": word_count})
    tbl.add([{"text": "hello world"}])
    tbl.backfill("word_count")
    assert sorted(r["word_count"] for r in tbl.to_arrow().to_pylist()) == [0, 10, 20, 30]
