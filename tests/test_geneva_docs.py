"""The code blocks of Geneva's documentation pages, run with only the import changed.

Pages (lancedb/docs, ``docs/geneva/``): ``udfs/udfs.mdx`` (UDFs), ``udfs/error_handling.mdx``,
``udfs/scalar-udtfs.mdx`` (chunkers), ``udfs/batch-udtfs.mdx`` (UDTFs),
``jobs/materialized-views.mdx`` and ``jobs/backfilling.mdx``. Each block is copied as written
with ``from geneva import`` -> ``from mv_assets import`` (``import geneva`` -> ``import
mv_assets as geneva``); what calls a model, a web API or a media library (an embedding model,
OpenAI's client, PIL, a video decoder, whisper) is a cheap deterministic stand-in of the same
signature, defined before the block; ``...`` bodies of the docs are given one; the data is small
and made by the test (the docs' URIs are ``tmp_path``). Every test checks the rows against an
expectation computed here in plain Python. Inline runs, real Lance files.
"""

import warnings

import pyarrow as pa
import pytest

import mv_assets
from mv_assets.execution.spark import InlineRunner, set_default_runner
from mv_assets.model import udf as udf_module


@pytest.fixture(autouse=True)
def inline_default():
    """``geneva.connect(uri)`` with no runner (as the docs call it) runs inline."""
    set_default_runner(InlineRunner())
    yield
    set_default_runner(None)


@pytest.fixture
def waits(monkeypatch):
    """The seconds each retry waited (recorded, not slept)."""
    seen: list[float] = []
    monkeypatch.setattr(udf_module, "_sleep", seen.append)
    return seen


class Tally:
    """Calls counted in a file: a UDF runs from its stored copy (closures are copied with it)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def bump(self, key) -> int:
        import json
        import os

        counts = json.load(open(self.path)) if os.path.exists(self.path) else {}
        counts[str(key)] = counts.get(str(key), 0) + 1
        with open(self.path, "w") as f:
            json.dump(counts, f)
        return counts[str(key)]

    def counts(self) -> dict:
        import json
        import os

        if not os.path.exists(self.path):
            return {}
        return {int(k) if k.lstrip("-").isdigit() else k: v for k, v in json.load(open(self.path)).items()}


def _column(tbl, name: str, key: str = "x") -> dict:
    rows = tbl.to_arrow().to_pylist()
    return {r[key]: r[name] for r in rows}


# -- udfs/error_handling.mdx ------------------------------------------------------------------


def test_error_handling_quick_start_retry_transient_retries_network_errors(tmp_path, waits):
    calls = Tally(tmp_path / "calls.json")

    def call_external_api(x: int) -> int:  # stand-in: fails twice with a network error per row
        if calls.bump(x) < 3:
            raise ConnectionError(f"connection reset ({x})")
        return 10 * x

    # --- from the page, import changed
    from mv_assets import retry_transient, udf

    @udf(data_type=pa.int32(), on_error=retry_transient())
    def my_udf(x: int) -> int:
        # Will retry on network errors (ConnectionError, TimeoutError, OSError)
        return call_external_api(x)
    # ---

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1, 2, 3]}))
    tbl.add_columns({"y": my_udf})
    tbl.backfill("y")
    assert _column(tbl, "y") == {x: 10 * x for x in (1, 2, 3)}
    assert calls.counts() == {1: 3, 2: 3, 3: 3}  # max_attempts=3 by default
    # exponential with jitter: 1 s after the first try, then between 1 and 2 s
    assert len(waits) == 6
    assert all(w == 1.0 for w in waits[0::2]) and all(1.0 <= w <= 2.0 for w in waits[1::2])
    assert tbl.get_errors(column_name="y") == []


def test_error_handling_factories_customized_attempts_and_backoff(tmp_path, waits):
    failures = Tally(tmp_path / "calls.json")

    # --- from the page, import changed (the `...` bodies given one)
    from mv_assets import retry_all, retry_transient, udf

    # Increase max attempts
    @udf(data_type=pa.int32(), on_error=retry_transient(max_attempts=5))
    def more_retries(x: int) -> int:
        if failures.bump("more") < 5:
            raise TimeoutError("slow")
        return x + 1

    # Change backoff strategy
    @udf(data_type=pa.int32(), on_error=retry_all(max_attempts=3, backoff="fixed"))
    def fixed_backoff(x: int) -> int:
        if failures.bump("fixed") < 3:
            raise KeyError("anything")  # retry_all: any exception
        return x + 2
    # ---

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [7]}))
    tbl.add_columns({"more": more_retries, "fixed": fixed_backoff})
    tbl.backfill("more")
    assert _column(tbl, "more") == {7: 8}
    assert failures.counts()["more"] == 5 and len(waits) == 4
    waits.clear()
    tbl.backfill("fixed")
    assert _column(tbl, "fixed") == {7: 9}
    assert waits == [1.0, 1.0]  # "fixed": 1 s between attempts


def test_error_handling_retry_runs_out_then_the_job_fails(tmp_path, waits):
    from mv_assets import retry_transient, udf

    @udf(data_type=pa.int32(), on_error=retry_transient(max_attempts=2, backoff="linear"))
    def down(x: int) -> int:
        raise OSError("service down")

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1, 2]}))
    tbl.add_columns({"y": down})
    with pytest.raises(mv_assets.UdfError, match="service down") as info:
        tbl.backfill("y")
    assert info.value.attempts == 2
    assert waits == [1.0]  # "linear": 1 s, 2 s, ... (one wait before the second and last try)
    assert _column(tbl, "y") == {1: None, 2: None}


class AuthError(Exception):
    """The docs' user-defined exception."""


def test_error_handling_matchers_first_match_wins(tmp_path, waits):
    attempts = Tally(tmp_path / "calls.json")

    def behave(x: int) -> int:  # stand-in API: what each row raises
        n = attempts.bump(x)
        if x == 1 and n < 3:
            raise ConnectionError("reset")  # transient: retried, then succeeds
        if x == 2 and n < 4:
            raise ValueError("rate limit exceeded")  # retried up to 5 times: succeeds on the 4th
        if x == 3:
            raise ValueError("invalid input")  # other ValueErrors: skipped
        return x * x

    # --- from the page, import changed
    from mv_assets import Fail, Retry, Skip, udf

    @udf(
        data_type=pa.int32(),
        on_error=[
            Retry(ConnectionError, TimeoutError, max_attempts=3),
            Retry(ValueError, match="rate limit", max_attempts=5),
            Skip(ValueError),  # Other ValueErrors - skip the row
            Fail(AuthError),   # Auth failures - fail immediately
        ]
    )
    def custom_handling(x: int) -> int:
        return behave(x)
    # ---

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1, 2, 3, 4]}))
    tbl.add_columns({"y": custom_handling})
    tbl.backfill("y")
    assert _column(tbl, "y") == {1: 1, 2: 4, 3: None, 4: 16}
    assert attempts.counts() == {1: 3, 2: 4, 3: 1, 4: 1}  # Skip: no retry
    errors = tbl.get_errors(column_name="y")
    assert [(e.error_type, e.message) for e in errors] == [("ValueError", "invalid input")]

    # Fail(AuthError): the job fails at once, nothing retried
    @udf(data_type=pa.int32(), on_error=[Retry(ConnectionError, max_attempts=3), Skip(ValueError), Fail(AuthError)])
    def locked(x: int) -> int:
        attempts.bump(-x)
        raise AuthError("token expired")

    tbl.add_columns({"z": locked})
    with pytest.raises(mv_assets.UdfError, match="token expired"):
        tbl.backfill("z")
    assert attempts.counts()[-1] == 1


def test_error_handling_unmatched_exception_fails_the_job(tmp_path, waits):
    from mv_assets import Retry, Skip, udf

    @udf(data_type=pa.int32(), on_error=[Retry(ConnectionError), Skip(ValueError)])
    def typo(x: int) -> int:
        raise TypeError("unsupported operand")

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1]}))
    tbl.add_columns({"y": typo})
    with pytest.raises(mv_assets.UdfError, match="unsupported operand"):
        tbl.backfill("y")
    assert waits == []


def test_error_handling_matcher_syntax_and_message_matching():
    # --- from the page, import changed
    from mv_assets import Retry

    # Single exception
    Retry(ConnectionError)

    # Multiple exceptions
    Retry(ConnectionError, TimeoutError, OSError)

    # With parameters
    Retry(ConnectionError, max_attempts=5, backoff="fixed")

    # With message matching
    Retry(ValueError, match="rate limit")
    # ---
    cases = [
        ("rate limit", ["rate limit exceeded"], []),
        (r"rate.?limit", ["rate limit", "ratelimit", "rate_limit"], ["rate-limit-x"[:0] + "rte limit"]),
        (r"(?i)rate limit", ["Rate Limit exceeded", "RATE LIMIT hit"], ["rate-limit"]),
        (r"429|rate.?limit|throttl", ["Error 429", "rate limit exceeded", "Request throttled"], ["Error 500"]),
    ]
    for pattern, fits, misses in cases:
        m = Retry(ValueError, match=pattern)
        assert all(m.matches(ValueError(msg)) for msg in fits), pattern
        assert not any(m.matches(ValueError(msg)) for msg in misses), pattern
        assert not m.matches(KeyError(fits[0]))  # the class must fit too


def test_error_handling_distinguish_error_types_by_message(tmp_path, waits):
    tries = Tally(tmp_path / "calls.json")

    def call(x: str) -> str:  # stand-in API
        if x == "busy" and tries.bump(x) < 10:
            raise ValueError("rate limit")
        if x == "bad":
            raise ValueError("invalid payload")
        if x == "boom":
            raise ValueError("server exploded")
        return x.upper()

    # --- from the page, import changed
    from mv_assets import Fail, Retry, Skip, udf

    @udf(
        data_type=pa.string(),
        on_error=[
            # Retry rate limits with more attempts
            Retry(ValueError, match="rate limit", max_attempts=10),
            # Skip invalid input
            Skip(ValueError, match="invalid"),
            # Fail on other ValueErrors
            Fail(ValueError),
        ]
    )
    def api_call(x: str) -> str:
        return call(x)
    # ---

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": ["ok", "busy", "bad"]}))
    tbl.add_columns({"y": api_call})
    tbl.backfill("y")
    assert _column(tbl, "y") == {"ok": "OK", "busy": "BUSY", "bad": None}
    assert tries.counts()["busy"] == 10 and len(waits) == 9
    assert all(1.0 <= w <= min(2.0 ** i, 60.0) for i, w in enumerate(waits))  # exponential, jittered, capped
    tbl.add(pa.table({"x": ["boom"]}))
    with pytest.raises(mv_assets.UdfError, match="server exploded"):
        tbl.backfill("y")


def test_error_handling_skip_on_error_and_fail_fast(tmp_path):
    from mv_assets import fail_fast, skip_on_error, udf

    @udf(data_type=pa.int32(), on_error=skip_on_error())
    def half(x: int) -> int:
        if x % 2:
            raise ArithmeticError(f"odd {x}")
        return x // 2

    @udf(data_type=pa.int32(), on_error=fail_fast())
    def strict(x: int) -> int:
        if x == 3:
            raise ArithmeticError("three")
        return x

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1, 2, 3, 4]}))
    tbl.add_columns({"h": half, "s": strict})
    tbl.backfill("h")
    assert _column(tbl, "h") == {x: (None if x % 2 else x // 2) for x in (1, 2, 3, 4)}
    assert sorted(str(e.message) for e in tbl.get_errors(column_name="h")) == ["odd 1", "odd 3"]
    with pytest.raises(mv_assets.UdfError, match="three"):
        tbl.backfill("s")


def test_error_handling_matchers_on_a_batched_udf(tmp_path, waits):
    """The docs restrict Skip to scalar UDFs; here a batched UDF's batch is
    retried whole, then its rows one by one, and rows the matchers skip are NULL."""
    from mv_assets import Retry, Skip, udf

    state = Tally(tmp_path / "calls.json")

    @udf(data_type=pa.int64(), on_error=[Retry(ConnectionError, max_attempts=2, backoff="fixed"), Skip(ValueError)])
    def batch_double(x: pa.Array) -> pa.Array:
        if state.bump("calls") == 1:
            raise ConnectionError("flaky")
        values = x.to_pylist()
        if 13 in values:
            raise ValueError("unlucky")
        return pa.array([2 * v for v in values], pa.int64())

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [11, 12, 13]}))
    tbl.add_columns({"y": batch_double})
    tbl.backfill("y")
    assert _column(tbl, "y") == {11: 22, 12: 24, 13: None}
    assert waits == [1.0]


def test_error_handling_restrictions_and_error_handling_parameter():
    from mv_assets import Retry, Skip, udf

    # --- from the page: invalid regex patterns are rejected at construction time
    with pytest.raises(ValueError, match="Invalid regex pattern"):
        Retry(ValueError, match=r"[invalid")
    Retry(ValueError, match=r"rate.?limit")
    # ---
    with pytest.raises(ValueError, match="Invalid backoff strategy"):
        Retry(ValueError, backoff="random")
    with pytest.raises(ValueError, match="exception classes"):
        Retry("ValueError")  # type: ignore[arg-type]

    # on_error= and error_handling= cannot be used together
    with pytest.raises(ValueError, match="Cannot specify both 'on_error' and 'error_handling'"):
        @udf(data_type=pa.int32(), on_error=[Skip(ValueError)], error_handling=[Skip(ValueError)])
        def both(x: int) -> int:
            return x

    @udf(data_type=pa.int32(), error_handling=[Skip(ValueError)])
    def via_error_handling(x: int) -> int:
        return x

    assert via_error_handling.on_error.skips(ValueError()) and not via_error_handling.on_error.skips(KeyError())
    with pytest.raises(ValueError, match="tenacity ErrorHandlingConfig is not provided"):
        udf(data_type=pa.int32(), error_handling=object())  # pyright: ignore[reportArgumentType]

    # Skip's thresholds: accepted with one warning each (no job fails on a count here)
    with pytest.warns(mv_assets.GenevaCompatWarning, match="max_skip_count"):
        @udf(data_type=pa.int32(), on_error=[Skip(ValueError, max_skip_count=100)])
        def counted(x: int) -> int:
            return x


def test_error_handling_policy_survives_the_stored_view(tmp_path, waits):
    """A view's UDF keeps its matchers through its stored definition."""
    from mv_assets import Retry, Skip, connect, udf

    seen = Tally(tmp_path / "calls.json")

    @udf(data_type=pa.int64(), on_error=[Retry(TimeoutError, max_attempts=2), Skip(ZeroDivisionError)])
    def inverse(x: int) -> int:
        if seen.bump(x) == 1 and x == 5:
            raise TimeoutError("slow")
        return 100 // x

    db = connect(tmp_path)
    src = db.create_table("src", pa.table({"x": [0, 5, 10]}))
    view = db.create_materialized_view("v", src.search(None).select({"x": "x", "inv": inverse}))
    db.refresh("v")
    assert _column(view, "inv") == {0: None, 5: 20, 10: 10}
    assert seen.counts()[5] == 2 and len(waits) == 1


# -- udf(...) parameters of Geneva's pages: checkpoint bounds, cuda, timeout -----------------------


def test_udf_checkpoint_size_bounds_cuda_and_timeout():
    from mv_assets import udf

    with warnings.catch_warnings():
        warnings.simplefilter("error", mv_assets.GenevaCompatWarning)

        # "to force a checkpoint size, set all three of these parameters to the same value"
        @udf(checkpoint_size=50, min_checkpoint_size=50, max_checkpoint_size=50)
        def fixed(x: int) -> int:
            return x

        @udf(min_checkpoint_size=40, max_checkpoint_size=40)
        def bounds_only(x: int) -> int:
            return x

    assert fixed.checkpoint_size == 50 and bounds_only.checkpoint_size == 40

    # backfilling.mdx: other bounds are accepted with one warning
    with pytest.warns(mv_assets.GenevaCompatWarning, match="checkpoint_size") as caught:
        @udf(min_checkpoint_size=25, max_checkpoint_size=200)
        def embed_udf(text: str) -> int:
            return len(text)
    assert len([w for w in caught if issubclass(w.category, mv_assets.GenevaCompatWarning)]) == 2
    assert embed_udf.checkpoint_size is None

    @udf(cuda=True)
    def on_gpu(x: int) -> int:
        return x

    assert on_gpu.num_gpus == 1.0
    with pytest.warns(mv_assets.GenevaCompatWarning, match="timeout"):
        @udf(timeout=5.0)
        def slow(x: int) -> int:
            return x


# -- udfs/udfs.mdx ----------------------------------------------------------------------------


def test_udfs_defining_scalar_batched_and_recordbatch_udfs_and_registering_them(tmp_path):
    import numpy as np

    lancedb_uri = str(tmp_path / "db")  # the page's "gs://bucket/db"

    # --- "Registering Features with UDFs", import changed
    import mv_assets as geneva

    db = geneva.connect(lancedb_uri)

    # Define schema for the video table
    schema = pa.schema([
        ("filename", pa.string()),
        ("duration_sec", pa.float32()),
        ("x", pa.int32()),
        ("y", pa.int32()),
    ])
    tbl = db.create_table("videos", schema=schema, mode="overwrite")

    # Generate fake data
    N = 10
    data = {
        "filename": [f"video_{i}.mp4" for i in range(N)],
        "duration_sec": np.random.uniform(10, 300, size=N).astype(np.float32),
        "x": np.random.choice([640, 1280, 1920], size=N),
        "y": np.random.choice([360, 720, 1080], size=N),
        "caption": [f"this is video {i}" for i in range(N)]
    }

    # Convert to Arrow Table and add to LanceDB
    batch = pa.table(data, schema=schema)
    tbl.add(batch)
    # ---

    # --- "Scalar UDFs", "Batched UDFs", import changed
    from mv_assets import udf

    @udf
    def area_udf(x: int, y: int) -> int:
        return x * y

    @udf(data_type=pa.int32())
    def batch_filename_len(filename: pa.Array) -> pa.Array:
        lengths = [len(str(f)) for f in filename]
        return pa.array(lengths, type=pa.int32())

    @udf(data_type=pa.int32())
    def recordbatch_filename_len(batch: pa.RecordBatch) -> pa.Array:
        filenames = batch["filename"]
        lengths = [len(str(f)) for f in filenames]
        return pa.array(lengths, type=pa.int32())
    # ---

    @udf
    def download_udf(filename: str) -> bytes:
        return f"bytes of {filename}".encode()  # stand-in for a download

    # --- "Here's how to register a simple UDF"
    tbl.add_columns({"area": area_udf, "content": download_udf })
    tbl.add_columns({"filename_len": batch_filename_len})
    # ---
    tbl.add_columns({"filename_len_rb": recordbatch_filename_len})
    for col in ("area", "content", "filename_len", "filename_len_rb"):
        tbl.backfill(col)

    rows = tbl.to_arrow().to_pylist()
    assert [r["filename"] for r in rows] == data["filename"]
    for r, x, y in zip(rows, data["x"].tolist(), data["y"].tolist(), strict=True):
        assert r["area"] == x * y
        assert r["content"] == f"bytes of {r['filename']}".encode()
        # str(f) of a pyarrow scalar is its value: len("video_3.mp4")
        assert r["filename_len"] == r["filename_len_rb"] == len(r["filename"])
    assert "caption" not in tbl.schema.names

    # --- "Altering UDFs"
    @udf
    def area_udf_v2(x: int, y: int) -> int:
        return x * y // 2

    table = tbl
    table.alter_columns({"path": "area", "udf": area_udf_v2} )
    # ---
    table.update(where="x = 640", values={"area": None})
    # --- "this filter would only update the rows where area was currently null"
    table.backfill("area", where="area is null")
    # ---
    expected = {r["filename"]: (r["x"] * r["y"] // 2 if r["x"] == 640 else r["x"] * r["y"]) for r in rows}
    assert _column(table, "area", key="filename") == expected


def test_udfs_struct_outputs(tmp_path):
    import io

    def image_bytes(w: int, h: int) -> bytes:  # stand-in image: "WxH" header
        return f"{w}x{h};pixels".encode()

    class _Size:
        def __init__(self, size: tuple[int, int]) -> None:
            self.size = size

    class Image:  # stand-in for PIL.Image: open() reads the header
        @staticmethod
        def open(f: io.BytesIO):
            w, h = f.read().split(b";")[0].split(b"x")
            return _Size((int(w), int(h)))

    # --- "Struct outputs", import changed (PIL's Image: the stand-in above)
    from mv_assets import udf

    @udf(
        data_type=pa.struct(
            [pa.field("width", pa.int32()), pa.field("height", pa.int32())]
        ),
    )
    def dimensions(image: bytes) -> tuple[int, int]:
        """Extract image dimensions (width, height)."""
        img = Image.open(io.BytesIO(image))
        return img.size
    # ---

    db = mv_assets.connect(tmp_path)
    images = db.create_table("images", pa.table({"id": [1, 2], "image": [image_bytes(640, 480), image_bytes(3, 5)]}))
    images.add_columns({"dims": dimensions})
    images.backfill("dims")
    assert _column(images, "dims", key="id") == {1: {"width": 640, "height": 480}, 2: {"width": 3, "height": 5}}


def test_udfs_struct_field_and_list_inputs(tmp_path):
    import numpy as np

    from mv_assets import udf

    # --- "Struct fields and list inputs", import changed
    struct_type = pa.struct([("vals", pa.list_(pa.int32()))])
    schema = pa.schema([pa.field("info", struct_type)])

    @udf(data_type=pa.int32(), input_columns=["info.vals"])
    def sum_vals(vals: np.ndarray | None) -> int | None:
        if vals is None:
            return None
        assert isinstance(vals, np.ndarray)
        return int(np.sum(vals))
    # ---

    db = mv_assets.connect(tmp_path)
    infos = [{"vals": [1, 2, 3]}, {"vals": None}, {"vals": []}]
    tbl = db.create_table("t", pa.table({"id": [1, 2, 3], "info": pa.array(infos, struct_type)}))
    assert tbl.schema.field("info").type == schema.field("info").type
    tbl.add_columns({"total": sum_vals})
    tbl.backfill("total")
    assert _column(tbl, "total", key="id") == {1: 6, 2: None, 3: 0}


def test_udfs_stateful_udf_registered_as_an_instance(tmp_path):
    from typing import Callable  # noqa: UP035 (as the page writes it)

    class _Resp:
        data: list
        embeddings: list

    class OpenAI:  # stand-in client: a deterministic 1536-d "embedding" of the text
        def __init__(self):
            self.embeddings = self

        def create(self, model: str, input: str):
            vec = [float(len(input)), float(sum(map(ord, input)) % 97)] + [0.0] * 1534
            resp = _Resp()
            resp.data = [_Resp()]
            resp.data[0].embeddings = vec
            return resp

    # --- "Stateful UDFs", import changed (`from openai import OpenAI`: the stand-in above)
    from mv_assets import udf

    @udf(data_type=pa.list_(pa.float32(), 1536))
    class OpenAIEmbedding(Callable):  # pyright: ignore[reportGeneralTypeIssues]  (as the page writes it)
        def __init__(self, model: str = "text-embedding-3-small"):
            self.model = model
            # Per-worker openai client
            self.client: OpenAI | None = None

        def __call__(self, text: str) -> pa.Array:
            if self.client is None:
                self.client = OpenAI()

            resp = self.client.embeddings.create(model=self.model, input=text)
            return pa.array(resp.data[0].embeddings)
    # ---

    db = mv_assets.connect(tmp_path)
    tbl = db.create_table("docs", pa.table({"text": ["hello", "geneva docs"]}))
    # --- "a stateful UDF is registered by providing an instance of the Callable object"
    tbl.add_columns({"embedding": OpenAIEmbedding()})
    # ---
    tbl.backfill("embedding")
    got = _column(tbl, "embedding", key="text")
    for text in ("hello", "geneva docs"):
        assert got[text][:2] == [float(len(text)), float(sum(map(ord, text)) % 97)]
        assert len(got[text]) == 1536 and not any(got[text][2:])


def test_udfs_multi_output_udf_and_unpacked_prefix(tmp_path):
    import io
    from typing import NamedTuple

    class _Img:
        def __init__(self, data: bytes):
            self.width, self.height = (int(v) for v in data.split(b";")[0].split(b"x"))

    class Image:  # stand-in for PIL.Image
        @staticmethod
        def open(f: io.BytesIO) -> _Img:
            return _Img(f.read())

    class _Model:  # stand-in embedding model
        def encode(self, img: _Img) -> list[float]:
            return [img.width / 10, img.height / 10]

    embedding_model = _Model()

    import mv_assets as geneva

    db0 = geneva.connect(tmp_path / "mydb")  # the page's "/data/mydb"
    db0.create_table("images", pa.table({"image": [b"4x3;...", b"10x20;..."]}))

    # --- "Registering Multi-Output UDFs", import changed (PIL and the model: stand-ins above)
    db = geneva.connect(tmp_path / "mydb")
    tbl = db.open_table("images")


    class ImageFeatures(NamedTuple):
        height: int
        width: int
        embedding: list[float]


    @geneva.udf
    def image_features(image: bytes) -> geneva.Columns[ImageFeatures]:
        img = Image.open(io.BytesIO(image))  # Read and decode the image once.
        embedding = embedding_model.encode(img)
        return ImageFeatures(  # pyright: ignore[reportReturnType]  (as the page writes it)
            height=img.height,
            width=img.width,
            embedding=embedding,
        )


    # Adds sibling columns named "height", "width", and "embedding".
    tbl.add_columns(image_features)

    # Or add the same outputs with a prefix to avoid name conflicts.
    tbl.add_columns(geneva.UnpackedUDF(image_features, prefix="image_"))
    # ---
    tbl.backfill("height")
    tbl.backfill("image_height")
    rows = tbl.to_arrow().to_pylist()
    expected = {b"4x3;...": (3, 4, [0.4, 0.3]), b"10x20;...": (20, 10, [1.0, 2.0])}
    for r in rows:
        h, w, e = expected[r["image"]]
        assert (r["height"], r["width"], r["image_height"], r["image_width"]) == (h, w, h, w)
        assert r["embedding"] == pytest.approx(e) and r["image_embedding"] == pytest.approx(e)


def test_udfs_resources_checkpoint_size_and_auto_backfill(tmp_path):
    import mv_assets as geneva
    from mv_assets import udf

    db = geneva.connect(tmp_path)
    tbl = db.create_table("t", pa.table({"x": [1, 2, 3], "y": [4, 5, 6]}))

    # --- "Resource requirements for UDFs" (the page's `...`: a data_type and a body)
    @udf(data_type=pa.int64(), num_cpus=1, num_gpus=0.5, memory = 4 * 1024**3) # require 1 CPU, 0.5 GPU, and 4GiB RAM
    def func(x: int) -> int:
        return x + 1
    # ---
    assert (func.num_cpus, func.num_gpus, func.memory) == (1, 0.5, 4 * 1024**3)

    # --- "Auto-backfill": accepted with a warning; the column is computed by backfill()
    with pytest.warns(geneva.GenevaCompatWarning, match="auto_backfill"):
        @udf(data_type=pa.int32(), version="2", auto_backfill=True)
        def area_udf(x: int, y: int) -> int:
            return x * y

    # Register a new auto-backfill column...
    tbl.add_columns({"area": area_udf})
    # ---
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # func's GPU hint runs as a CPU task inline (a warning says so)
        tbl.add_columns({"x1": func})
        tbl.backfill("x1")
    tbl.backfill("area")
    assert _column(tbl, "area") == {1: 4, 2: 10, 3: 18}
    assert _column(tbl, "x1") == {1: 2, 2: 3, 3: 4}


# -- udfs/scalar-udtfs.mdx (chunkers) ---------------------------------------------------------


def _clips(duration: float, step: int = 10) -> list[tuple[float, float]]:
    return [(float(s), min(s + 10.0, duration)) for s in range(0, int(duration), step)]


def test_chunkers_define_create_view_refresh_incrementally_and_add_columns(tmp_path):
    def extract_video_segment(path: str, start: float, end: float) -> bytes:  # stand-in decoder
        return f"{path}:{start}-{end}".encode()

    class _Model:  # stand-in embedding model
        def encode(self, clip_bytes: bytes) -> list[float]:
            return [float(len(clip_bytes))] * 512

    embed_model = _Model()

    # --- "Defining a Chunker", import changed
    from typing import Iterator, NamedTuple  # noqa: UP035 (as the page writes it)

    from mv_assets import chunker

    class Clip(NamedTuple):
        clip_start: float
        clip_end: float
        clip_bytes: bytes

    @chunker
    def extract_clips(video_path: str, duration: float) -> Iterator[Clip]:
        """Yields multiple clips per video."""
        clip_length = 10.0
        for start in range(0, int(duration), int(clip_length)):
            end = min(start + clip_length, duration)
            clip_data = extract_video_segment(video_path, start, end)
            yield Clip(clip_start=start, clip_end=end, clip_bytes=clip_data)
    # ---

    import mv_assets as geneva

    setup = geneva.connect(tmp_path / "mydb")
    setup.create_table("videos", pa.table({
        "video_path": ["/v/a.mp4", "/v/b.mp4"],
        "duration": [30.0, 15.0],
        "metadata": ['{"fps": 30}', '{"fps": 24}'],
    }))

    # --- "Creating a Chunker View", import changed
    db = geneva.connect(tmp_path / "mydb")  # the page's "/data/mydb"
    videos = db.open_table("videos")

    # Create the 1:N materialized view
    clips = db.create_udtf_view(
        "clips",
        source=videos.search(None).select(["video_path", "metadata"]),
        udtf=extract_clips,
    )

    # Populate — runs the UDTF on every source row
    clips.refresh()
    # ---

    def expected(videos_rows):
        out = []
        for v in videos_rows:
            for start, end in _clips(v["duration"]):
                out.append((v["metadata"], start, end, f"{v['video_path']}:{int(start)}-{end}".encode()))
        return sorted(out)

    def got():
        return sorted((r["metadata"], r["clip_start"], r["clip_end"], r["clip_bytes"]) for r in clips.to_arrow().to_pylist())

    source_rows = videos.to_arrow().to_pylist()
    assert got() == expected(source_rows)
    assert len(got()) == 3 + 2
    # the parent's selected columns are inherited (an input column only with inherit_input_columns=True)
    assert "metadata" in clips.schema.names

    # --- "Incremental Refresh"
    new_video_data = pa.table({"video_path": ["/v/c.mp4"], "duration": [25.0], "metadata": ['{"fps": 60}']})
    # Add new videos to the source table
    videos.add(new_video_data)

    # Incremental refresh — only processes the new videos
    clips.refresh()
    # ---
    assert got() == expected(videos.to_arrow().to_pylist())
    assert len(got()) == 3 + 2 + 3

    # --- "Adding Computed Columns After Creation", import changed (the model: a stand-in)
    from mv_assets import udf

    @udf(data_type=pa.list_(pa.float32(), 512))
    def clip_embedding(clip_bytes: bytes) -> list[float]:
        return embed_model.encode(clip_bytes)

    # Add an embedding column to the clips table
    clips.add_columns({"embedding": clip_embedding})

    # Backfill computes embeddings for all existing clips
    clips.backfill("embedding")
    # ---
    for r in clips.to_arrow().to_pylist():
        assert r["embedding"] == [float(len(r["clip_bytes"]))] * 512


def test_chunkers_list_return_and_batched(tmp_path):
    from typing import NamedTuple

    from mv_assets import chunker, connect

    class Clip(NamedTuple):
        clip_start: float
        clip_end: float
        clip_bytes: bytes

    # --- "List return pattern"
    @chunker
    def extract_clips(video_path: str, duration: float) -> list[Clip]:
        clips = []
        for start in range(0, int(duration), 10):
            end = min(start + 10, duration)
            clips.append(Clip(clip_start=start, clip_end=end, clip_bytes=b"..."))
        return clips
    # ---

    clip_schema = pa.schema([("clip_start", pa.float64()), ("clip_end", pa.float64())])

    # "Batched chunker": the page's stub is `def extract_clips(batch: pa.RecordBatch) -> pa.RecordBatch: ...`;
    # Geneva 0.17 calls a batched chunker with its input columns and the parents' ids as keywords and
    # needs `__source_row_id` in the returned batch (transformer.py, Chunker._execute_batch): so written
    @chunker(batch=True, output_schema=clip_schema)
    def extract_clips_batched(duration: pa.Array, __source_row_id: pa.Array) -> pa.RecordBatch:  # pyright: ignore[reportGeneralTypeIssues]
        """Process rows in batches. Same 1:N semantic per row."""
        rows = [(pid, c) for d, pid in zip(duration.to_pylist(), __source_row_id.to_pylist(), strict=True)
                for c in _clips(d)]
        return pa.RecordBatch.from_pydict({
            "__source_row_id": pa.array([pid for pid, _ in rows], pa.int64()),
            "clip_start": [c[0] for _, c in rows], "clip_end": [c[1] for _, c in rows],
        })

    db = connect(tmp_path)
    videos = db.create_table("videos", pa.table({"video_path": ["/v/a.mp4", "/v/b.mp4"], "duration": [30.0, 15.0]}))
    clips = db.create_udtf_view(
        "clips", source=videos.search(None), udtf=extract_clips
    )
    clips.refresh()
    batched = db.create_udtf_view("clips_batched", source=videos.search(None), udtf=extract_clips_batched)
    batched.refresh()

    want = sorted(c for d in (30.0, 15.0) for c in _clips(d))
    assert sorted((r["clip_start"], r["clip_end"]) for r in clips.to_arrow().to_pylist()) == want
    assert all(r["clip_bytes"] == b"..." for r in clips.to_arrow().to_pylist())
    assert sorted((r["clip_start"], r["clip_end"]) for r in batched.to_arrow().to_pylist()) == want


def test_chunkers_chained_views(tmp_path):
    from typing import NamedTuple

    from mv_assets import chunker, connect

    class Clip(NamedTuple):
        clip_start: float
        clip_end: float

    @chunker
    def extract_clips(video_path: str, duration: float) -> list[Clip]:
        return [Clip(s, e) for s, e in _clips(duration)]

    class Frame(NamedTuple):
        frame_time: float

    @chunker
    def extract_frames(clip_start: float, clip_end: float) -> list[Frame]:
        return [Frame(t) for t in (clip_start, (clip_start + clip_end) / 2)]

    db = connect(tmp_path)
    videos = db.create_table("videos", pa.table({"video_path": ["/v/a.mp4", "/v/b.mp4"], "duration": [30.0, 15.0]}))
    # --- "Chaining Chunker Views"
    # videos → clips (1:N)
    clips = db.create_udtf_view(
        "clips", source=videos.search(None), udtf=extract_clips
    )

    # clips → frames (1:N)
    frames = db.create_udtf_view(
        "frames", source=clips.search(None), udtf=extract_frames
    )
    # ---
    clips.refresh()
    frames.refresh()
    want = sorted(c for d in (30.0, 15.0) for c in _clips(d))
    assert sorted(r["frame_time"] for r in frames.to_arrow().to_pylist()) == sorted(
        t for s, e in want for t in (s, (s + e) / 2))


def test_chunkers_full_document_chunking_example(tmp_path):
    class _Model:  # stand-in embedding model
        def encode(self, text: str) -> list[float]:
            return [float(len(text.split()))] + [0.0] * 1535

    embedding_model = _Model()
    words = [f"w{i}" for i in range(1000)]
    import mv_assets

    mv_assets.connect(tmp_path / "mydb").create_table("documents", pa.table({
        "doc_id": [1, 2], "title": ["Intro to AI", "Data Guide"], "text": [" ".join(words), "short text"],
    }))

    # --- "Full Example: Document Chunking", import changed (the model: a stand-in)
    from typing import Iterator, NamedTuple  # noqa: UP035 (as the page writes it)

    from mv_assets import chunker, connect, udf

    class Chunk(NamedTuple):
        chunk_index: int
        chunk_text: str

    @chunker
    def chunk_document(text: str) -> Iterator[Chunk]:
        """Split a document into overlapping chunks."""
        words = text.split()
        chunk_size = 500
        overlap = 50
        for i, start in enumerate(range(0, len(words), chunk_size - overlap)):
            chunk_words = words[start:start + chunk_size]
            yield Chunk(chunk_index=i, chunk_text=" ".join(chunk_words))

    db = connect(tmp_path / "mydb")  # the page's "/data/mydb"
    docs = db.open_table("documents")

    # Create chunked view — inherits doc_id, title, etc. from source
    chunks = db.create_udtf_view(
        "doc_chunks",
        source=docs.search(None).select(["doc_id", "title", "text"]),
        udtf=chunk_document,
    )
    chunks.refresh()

    # Add embeddings to chunks for semantic search
    @udf(data_type=pa.list_(pa.float32(), 1536))
    def embed_text(chunk_text: str) -> list[float]:
        return embedding_model.encode(chunk_text)

    chunks.add_columns({"embedding": embed_text})
    chunks.backfill("embedding")  # Backfills embeddings on all existing chunks

    # Query — parent columns available alongside chunk columns
    df = chunks.search(None).select(["doc_id", "title", "chunk_text", "embedding"]).to_pandas()
    # ---
    want = []
    for doc_id, title, text in ((1, "Intro to AI", " ".join(words)), (2, "Data Guide", "short text")):
        ws = text.split()
        for start in range(0, len(ws), 450):
            want.append((doc_id, title, " ".join(ws[start:start + 500])))
    got = sorted(zip(df["doc_id"], df["title"], df["chunk_text"], strict=True))
    assert got == sorted(want) and len(want) == 3 + 1
    assert all(list(e)[0] == len(t.split()) for t, e in zip(df["chunk_text"], df["embedding"], strict=True))


# -- udfs/batch-udtfs.mdx ---------------------------------------------------------------------


def test_batch_udtfs_aggregation_function_and_class(tmp_path):
    from collections.abc import Iterator

    import mv_assets as geneva
    from mv_assets import udtf

    # --- "Function-based", import changed
    @udtf(output_schema=pa.schema([
        pa.field("label", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("mean_score", pa.float64()),
    ]))
    def group_stats(source: geneva.GenevaQueryBuilder) -> Iterator[pa.RecordBatch]:
        df = source.to_pandas()
        agg = df.groupby("label").agg(
            count=("label", "size"),
            mean_score=("score", "mean"),
        ).reset_index()
        yield pa.RecordBatch.from_pandas(agg)
    # ---

    # --- "Examples: Aggregation", import changed
    @udtf(
        output_schema=pa.schema([
            pa.field("label", pa.string()),
            pa.field("count", pa.int64()),
            pa.field("mean_score", pa.float64()),
        ]),
    )
    class GroupStats:
        def __init__(self, group_by: str = "label"):
            self.group_by = group_by

        def __call__(self, source: geneva.GenevaQueryBuilder) -> Iterator[pa.RecordBatch]:
            df = source.to_pandas()
            agg = df.groupby(self.group_by).agg(
                count=("label", "size"),
                mean_score=("score", "mean"),
            ).reset_index()
            yield pa.RecordBatch.from_pandas(agg)
    # ---

    labels = ["a", "b", "a", "c", "a", "b"]
    scores = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    conn = geneva.connect(tmp_path)
    items = conn.create_table("items", pa.table({"label": labels, "score": scores}))
    # --- "Creating and Refreshing a UDTF View" (with these UDTFs and table)
    stats = conn.create_udtf_view("stats", source=items.search(None).select(["label", "score"]), udtf=group_stats)
    stats.refresh()
    # ---
    by_class = conn.create_udtf_view("stats2", source=items.search(None), udtf=GroupStats(group_by="label"))
    with conn.local_ray_context():
        by_class.refresh()

    def want(labels, scores):
        out = {}
        for lab in sorted(set(labels)):
            vals = [s for la, s in zip(labels, scores, strict=True) if la == lab]
            out[lab] = (len(vals), sum(vals) / len(vals))
        return out

    def got(view):
        return {r["label"]: (r["count"], r["mean_score"]) for r in view.to_arrow().to_pylist()}

    assert got(stats) == got(by_class) == want(labels, scores)
    items.add(pa.table({"label": ["c"], "score": [10.0]}))
    stats.refresh()
    assert got(stats) == want(labels + ["c"], scores + [10.0])


def test_batch_udtfs_class_reading_source_to_arrow(tmp_path):
    from collections.abc import Iterator

    import mv_assets as geneva
    from mv_assets import udtf

    @udtf(output_schema=pa.schema([pa.field("row_id", pa.int64()), pa.field("cluster_id", pa.int64())]),
          input_columns=["row_id", "phash"])
    class PHashDedupe:
        def __init__(self, threshold: int = 4):
            self.threshold = threshold

        def __call__(self, source: geneva.GenevaQueryBuilder) -> Iterator[pa.RecordBatch]:
            data = source.to_arrow().select(["row_id", "phash"])
            clusters = {"row_id": data["row_id"].combine_chunks(), "cluster_id": pc_div(data["phash"])}  # self._cluster
            yield pa.RecordBatch.from_pydict({"row_id": clusters["row_id"], "cluster_id": clusters["cluster_id"]})

    def pc_div(a):
        return pa.array([v // 16 for v in a.to_pylist()], pa.int64())

    conn = geneva.connect(tmp_path)
    images = conn.create_table("images", pa.table({"row_id": [1, 2], "phash": [3, 40]}))
    deduped = conn.create_udtf_view("deduped_images", source=images.search(None).select(["row_id", "phash"]),
                                    udtf=PHashDedupe(threshold=4))
    deduped.refresh()
    got = sorted((r["row_id"], r["cluster_id"]) for r in deduped.to_arrow().to_pylist())
    assert got == [(1, 0), (2, 2)]


# -- jobs/materialized-views.mdx --------------------------------------------------------------


def test_materialized_views_page_creates_refreshes_and_refreshes_incrementally(tmp_path):
    import datetime as dt

    def expensive_load(uris: list) -> list:  # stand-in for "<expensive stuff>"
        return [f"frames of {u}".encode() for u in uris]

    class _Whisper:  # stand-in for whisper's model
        def transcribe(self, uri: str) -> dict:
            return {"text": f"words in {uri}"}

    def load_model(name: str) -> _Whisper:
        return _Whisper()

    # --- the page's first block, import changed; `pa.json()` is not in pyarrow: a string column
    from mv_assets import connect, udf

    db = connect(str(tmp_path / "lancedb"))  # the page's "/path/to/lancedb"
    schema = pa.schema([
        pa.field("video_id",   pa.int64(),            nullable=False),
        pa.field("video_uri",  pa.string(),           nullable=False),
        pa.field("upload_ts",  pa.timestamp("us"),    nullable=False),
        pa.field("metadata",   pa.string(),           nullable=True),
    ])
    raw_videos = db.create_table(
        "raw_videos",
        schema=schema,
        primary_key="video_id"
    )
    # ---

    # --- the page's second block (whisper and "<expensive stuff>": stand-ins; `uri` -> `video_uri`,
    # the page's typo; the chained query in parentheses)
    @udf
    def transcribe(video_uri) -> str:
        model = load_model("base")
        return model.transcribe(video_uri)["text"]

    @udf(data_type=pa.binary())
    def load_video(video_uri: pa.Array) -> pa.Array:
        videos = expensive_load(video_uri.to_pylist())
        return pa.array(videos, pa.binary())

    q = (raw_videos.search(None)
        .shuffle(seed=42)
        .select(
            {
                "video_uri": "video_uri",
                "video": load_video,
                "transcription": transcribe,
            }
        ))

    view_table = db.create_materialized_view("table_view", q)
    # ---

    def rows(n0: int, n: int) -> pa.Table:
        return pa.table({
            "video_id": list(range(n0, n0 + n)),
            "video_uri": [f"s3://videos/{i}.mp4" for i in range(n0, n0 + n)],
            "upload_ts": [dt.datetime(2025, 1, 1) + dt.timedelta(minutes=i) for i in range(n0, n0 + n)],
            "metadata": [None] * n,
        }, schema=schema)

    raw_videos.add(rows(0, 5))
    # --- "To populate the values, we call refresh"
    # explicitly copy values from the source table, applying UDF on cols.
    db.refresh("table_view")
    # ---

    def want(uris):
        return sorted((u, f"frames of {u}".encode(), f"words in {u}") for u in uris)

    def got():
        return sorted((r["video_uri"], r["video"], r["transcription"]) for r in view_table.to_arrow().to_pylist())

    assert got() == want(f"s3://videos/{i}.mp4" for i in range(5))
    # --- "only materialize new or modified rows"
    raw_table = raw_videos
    raw_table.add(rows(5, 3))
    db.refresh("table_view")  # only materialize new or modified rows.
    # ---
    assert got() == want(f"s3://videos/{i}.mp4" for i in range(8))
    assert view_table.schema.names == ["video_uri", "video", "transcription"]


# -- jobs/backfilling.mdx ---------------------------------------------------------------------


def test_backfilling_page_filtered_partial_and_tuned_backfills(tmp_path):
    import mv_assets as geneva
    from mv_assets import udf

    db = geneva.connect(tmp_path)
    tbl = db.create_table("videos", pa.table({"filename": ["a1.mp4", "b1.mp4", "c1.mp4"]}))
    tbl.add(pa.table({"filename": ["a2.mp4", "b2.mp4"]}))
    tbl.add(pa.table({"filename": ["c2.mp4"]}))  # three fragments

    @udf
    def content(filename: str) -> bytes:  # stand-in download
        return filename.encode()

    @udf(data_type=pa.list_(pa.float32(), 2))
    def embedding(content: bytes) -> list[float]:  # stand-in model
        return [float(len(content)), float(content[0])]

    tbl.add_columns({"content": content})
    tbl.add_columns({"embedding": embedding})

    # --- "Filtered Backfills"
    # only backfill video content whose filenames start with 'a'
    tbl.backfill("content", where="starts_with(filename, 'a')")
    # only backfill embeddings of only those videos with content
    tbl.backfill("embedding", where="content is not null")
    # ---

    def state():
        return {r["filename"]: (r["content"], r["embedding"]) for r in tbl.to_arrow().to_pylist()}

    def computed(name: str) -> tuple:
        return name.encode(), [float(len(name)), float(ord(name[0]))]

    names = ["a1.mp4", "b1.mp4", "c1.mp4", "a2.mp4", "b2.mp4", "c2.mp4"]
    assert state() == {n: (computed(n) if n.startswith("a") else (None, None)) for n in names}

    # --- "new rows that meet the criteria will be updated": the same commands again
    tbl.add(pa.table({"filename": ["a3.mp4", "b3.mp4"]}))
    tbl.backfill("content", where="starts_with(filename, 'a')")
    tbl.backfill("embedding", where="content is not null")
    # ---
    names += ["a3.mp4", "b3.mp4"]
    assert state() == {n: (computed(n) if n.startswith("a") else (None, None)) for n in names}

    # --- "add in or overwrite content in rows previously backfilled"
    tbl.backfill("content", where="(starts_with(filename, 'a') or starts_with(filename, 'b')) and content is null")
    # ---
    assert {n: c for n, (c, _) in state().items()} == {n: (n.encode() if n[0] in "ab" else None) for n in names}

    # --- "Managing commit visibility": num_frags, commit_granularity; "Managing concurrency"
    # only backfill 2 fragments so experiement can be done on the sample
    tbl.backfill("embedding", num_frags=2)
    # ---
    first_two = {"a1.mp4", "b1.mp4", "c1.mp4", "a2.mp4", "b2.mp4"}  # the first two fragments' rows
    emb = {n: e for n, (_, e) in state().items()}
    for n in names:
        has_content = n[0] in "ab"
        if n.startswith("a") or (n in first_two and has_content):
            assert emb[n] == computed(n)[1], n
        else:
            assert emb[n] is None, n
    # backfill all fragments and perform an intermediate commit every 10 fragments to expose incremental results.
    tbl.backfill("embedding", commit_granularity=10)
    with pytest.warns(geneva.GenevaCompatWarning, match="intra_applier_concurrency"):
        # backfill embeddings with 10 * 5 = 50 instances
        tbl.backfill("embedding", concurrency=10, intra_applier_concurrency=5)
    assert {n: e for n, (_, e) in state().items()} == {n: (computed(n)[1] if n[0] in "ab" else None) for n in names}

    # --- "Adaptive checkpoint sizing" (bounds other than a fixed size: accepted with a warning)
    with pytest.warns(geneva.GenevaCompatWarning, match="checkpoint_size"):
        tbl.backfill("content", min_checkpoint_size=10, max_checkpoint_size=100)
    assert {n: c for n, (c, _) in state().items()} == {n: n.encode() for n in names}
