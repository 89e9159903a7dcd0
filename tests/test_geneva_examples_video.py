"""More of Geneva's official examples with only the import changed: the video chunkers that read
their bytes themselves, and the ops CLIs (inline runner, real Lance files).

The programs are lancedb/geneva-examples'

- ``video/chunk_external_video.py`` with ``video/chunkers_uri.py``'s ``chunk_uri_video_udtf``: a
  chunker view over a table of ``s3://`` URIs, the UDTF opening each object with
  ``pyarrow.fs.S3FileSystem`` from the ``ASSETS_S3_*`` environment. Run blocking (local mode,
  where ``--detach`` is ignored by the example itself) and detached: the example takes its
  ``refresh_async`` branch only off local mode, so that run is in enterprise mode over the local
  catalog (``db_uri``), with a stand-in for ``geneva.manifest.GenevaManifest``'s builder (a Ray
  runtime manifest: nothing here), and follows the job with ``conn.get_job(job_id)`` until DONE,
  from this process and from another one, as its log line says;
- ``video/ingest_openvid.py`` (with ``core/utils/videos.py``'s helpers) and ``video/chunk_openvid.py``
  with ``video/chunkers.py``'s ``chunk_blob_video_udtf``: a reference-only ``videos`` table of
  ``_rowid`` pointers into a Lance dataset whose ``video_blob`` column is blob-encoded, and a chunker
  view whose UDTF reads each video with ``lance.dataset(src).take_blobs(blob_column, ids=[rowid])``;
- ``ops/stats.py``, ``ops/delete_table.py`` and ``ops/cleanup.py``, typer CLIs run with
  ``CliRunner`` over a catalog holding the ``videos`` table and the ``video_clips`` view the chunk
  example made (with a ``caption`` column backfilled onto the view, as ``frame-caption`` does).
  Dropping ``videos`` while the view is defined over it is refused here (Geneva drops it): those
  two runs check the refusal and that the views dropped first let it through.

Each is copied as written with ``import geneva`` -> ``import mv_assets as geneva``. PyAV and
PIL are stand-in modules of the same calls (``av.open`` with ``streams.video[0]``, ``seek``,
``decode``, ``demux``, ``mux``; ``Image.fromarray``, ``thumbnail``, ``save``) over a toy container
format, installed as ``av`` / ``PIL`` so the UDTFs' own code runs unchanged, seeks and remuxes
included; ``pyarrow.fs.S3FileSystem`` is a stand-in of its signature serving a local folder as
the bucket. The expected clips are computed here in plain Python from the toy videos' frames.
The helpers the examples import from ``core/`` are those of ``tests/test_geneva_examples.py``
(local mode; ``GenevaCompatWarning`` filtered).
"""

# ruff: noqa: B008  (typer options as defaults, as the CLIs are written)
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types
import uuid
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.fs
import pytest
import typer
import yaml
from test_geneva_examples import (
    OPT_STABLE_ROW_IDS,
    connect,
    format_sample,
    inline_default,  # noqa: F401  (autouse: the examples run inline)
    local_concurrency,
    require_stable_row_ids,
    resolve_resources,
    retry_io,
    runtime_session,
)
from test_geneva_examples import Config as _LocalConfig
from typer.testing import CliRunner

logger = logging.getLogger(__name__)




@dataclass
class Config(_LocalConfig):
    """geneva_examples.core.config.Config: the fields these examples read besides the local path."""

    assets_s3_endpoint: str | None = None
    assets_s3_access_key: str | None = None
    assets_s3_secret_key: str | None = None
    assets_s3_region: str | None = None
    hf_token: str | None = None


def _scoped_env(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The examples set these in os.environ (local Ray workers share it): restored after the test."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


# -- stand-ins for PyAV and PIL ------------------------------------------------------------------
#
# A toy container: a header line (fps, keyframe interval, frame count, whether the stream knows its
# duration), then one 12-byte rgb24 2x2 frame per packet. Packet i has pts = dts = i in a time base
# of 1/fps; keyframes every `gop` packets. `seek(ts, backward=True)` goes to the keyframe at or
# before ts; decoding and demuxing advance the same read position, as a demuxer does. The "mp4"
# written is the muxed packets (pts, dts, payload); the "JPEG" is the quality then the pixels.

_AV_MAGIC = b"STAND-IN-AV\n"
_FPS = 4  # a time base of 0.25 s: every timestamp is exact in float32
_GOP = 3
_FRAME_BYTES = 12


def _frame_payload(video_no: int, i: int) -> bytes:
    return bytes((video_no * 31 + i * 7 + j) % 256 for j in range(_FRAME_BYTES))


def _video_file(video_no: int, frames: int, *, stream_duration: bool = True) -> bytes:
    header = {"fps": _FPS, "gop": _GOP, "frames": frames, "stream_duration": stream_duration}
    return (_AV_MAGIC + json.dumps(header).encode() + b"\n"
            + b"".join(_frame_payload(video_no, i) for i in range(frames)))


def _mp4(packets: list[tuple[int, int, bytes]]) -> bytes:
    return b"MP4|" + b"|".join(f"{pts}:{dts}:".encode() + payload.hex().encode() for pts, dts, payload in packets)


def _jpeg(pixels: bytes, quality: int = 85) -> bytes:
    return b"JPEG" + bytes([quality]) + pixels


class _Stream:
    def __init__(self, time_base: Fraction, duration: int | None) -> None:
        self.time_base = time_base
        self.duration = duration


class _Frame:
    def __init__(self, pts: int, time_base: Fraction, payload: bytes) -> None:
        self.pts = pts
        self.time = float(pts * time_base)
        self._payload = payload

    def to_ndarray(self, format: str | None = None):  # noqa: A002 (PyAV's name)
        import numpy as np

        assert format == "rgb24"
        return np.frombuffer(self._payload, dtype=np.uint8).reshape(2, 2, 3)


class _Packet:
    def __init__(self, pts: int | None, dts: int | None, payload: bytes, stream: _Stream) -> None:
        self.pts, self.dts, self.payload, self.stream = pts, dts, payload, stream


class _InputContainer:
    def __init__(self, file: Any) -> None:
        raw = file.read()
        if not raw.startswith(_AV_MAGIC):
            raise ValueError("[Errno 1094995529] Invalid data found when processing input")
        header_line, body = raw[len(_AV_MAGIC):].split(b"\n", 1)
        header = json.loads(header_line)
        self._gop, n = header["gop"], header["frames"]
        self._payloads = [body[i * _FRAME_BYTES:(i + 1) * _FRAME_BYTES] for i in range(n)]
        tb = Fraction(1, header["fps"])
        video = _Stream(tb, n if header["stream_duration"] else None)
        self.streams = types.SimpleNamespace(video=[video])
        self.duration = int(n * tb * 1_000_000)  # in av.time_base units
        self._pos = 0

    def seek(self, offset: int, *, stream: _Stream | None = None, backward: bool = True, any_frame: bool = False):
        assert stream is self.streams.video[0] and backward and not any_frame
        self._pos = min(max(0, int(offset)) // self._gop * self._gop, len(self._payloads))

    def decode(self, stream: _Stream):
        while self._pos < len(self._payloads):
            i = self._pos
            self._pos += 1
            yield _Frame(i, stream.time_base, self._payloads[i])

    def demux(self, stream: _Stream):
        while self._pos < len(self._payloads):
            i = self._pos
            self._pos += 1
            yield _Packet(i, i, self._payloads[i], stream)
        yield _Packet(None, None, b"", stream)  # the flush packet PyAV ends with

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


class _OutputContainer:
    def __init__(self, file: Any, format: str | None) -> None:  # noqa: A002
        assert format == "mp4"
        self._file = file
        self._stream: _Stream | None = None
        self._packets: list[tuple[int, int, bytes]] = []

    def add_stream_from_template(self, template: _Stream) -> _Stream:
        self._stream = _Stream(template.time_base, None)
        return self._stream

    def mux(self, packet: _Packet) -> None:
        assert packet.stream is self._stream and packet.pts is not None and packet.dts is not None
        self._packets.append((packet.pts, packet.dts, packet.payload))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self._file.write(_mp4(self._packets))
        return False


def _av_open(file: Any, mode: str = "r", format: str | None = None, **options: Any):  # noqa: A002
    return _InputContainer(file) if mode == "r" else _OutputContainer(file, format)


class _Image:
    def __init__(self, pixels: bytes, size: tuple[int, int]) -> None:
        self._pixels, self.size = pixels, size

    def thumbnail(self, size: tuple[int, int], resample: Any = None) -> None:
        assert resample is _Resampling.LANCZOS
        assert self.size[0] <= size[0] and self.size[1] <= size[1]  # already smaller: unchanged

    def save(self, fp: Any, format: str | None = None, quality: int = 75) -> None:  # noqa: A002
        assert format == "JPEG"
        fp.write(_jpeg(self._pixels, quality))


class _Resampling:
    LANCZOS = 1


def _fromarray(arr: Any) -> _Image:
    return _Image(arr.tobytes(), (arr.shape[1], arr.shape[0]))


@pytest.fixture
def media_stand_ins(monkeypatch):
    """``import av`` and ``from PIL import Image`` (inside the UDTFs) get the stand-ins."""
    av = types.ModuleType("av")
    av.open = _av_open  # type: ignore[attr-defined]
    av.time_base = 1_000_000  # type: ignore[attr-defined]
    image = types.ModuleType("PIL.Image")
    image.fromarray = _fromarray  # type: ignore[attr-defined]
    image.Resampling = _Resampling  # type: ignore[attr-defined]
    pil = types.ModuleType("PIL")
    pil.Image = image  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "av", av)
    monkeypatch.setitem(sys.modules, "PIL", pil)
    monkeypatch.setitem(sys.modules, "PIL.Image", image)


def _expected_clips(video_no: int, frames: int, chunk_s: float, *, rewind_at_start: bool) -> list[dict[str, Any]]:
    """What the chunkers compute for one toy video, in plain Python: windows of ``chunk_s`` over
    its duration; each window's frame is the first at or after its start, its clip the packets
    from the keyframe at or before its start up to its end, timestamps rebased to 0.
    ``rewind_at_start``: the URI chunker seeks before the first window's remux too; the blob
    chunker does not (``if start > 0``), so its first clip starts after the frame it decoded."""
    duration = frames / _FPS
    out, start, cid = [], 0.0, 0
    while start < duration:
        end = min(start + chunk_s, duration)
        first = next((i for i in range(frames) if i / _FPS >= start), None)
        frame = _jpeg(_frame_payload(video_no, first)) if first is not None else None
        if start > 0 or rewind_at_start:
            k = int(start * _FPS) // _GOP * _GOP
        else:
            k = frames if first is None else first + 1
        packets = [(j - k, j - k, _frame_payload(video_no, j)) for j in range(k, frames) if j / _FPS < end]
        if packets:
            out.append({"chunk_id": cid, "start_sec": start, "end_sec": end, "clip_bytes": _mp4(packets),
                        "frame": frame})
        start += chunk_s
        cid += 1
    return out


_CLIP_KEY = ("video_id", "chunk_id", "start_sec", "end_sec", "clip_bytes", "frame")


def _clip_rows(rows: list[dict[str, Any]]) -> list[tuple]:
    return sorted(tuple(r[k] for k in _CLIP_KEY) for r in rows)


# -- geneva_examples/examples/video/chunkers_uri.py, as written ------------------------------------


def chunk_uri_video_udtf(
    *,
    uri_column: str = "video_uri",
    chunk_seconds: float,
    manifest: Any,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory_bytes: int = 2**31 - 1,
    max_video_s: float | None = None,
    num_clips: int | None = None,
    max_video_mb: float | None = None,
    read_retries: int = 4,
    read_retry_sleep_s: float = 1.0,
):
    """Build the geneva chunker that reads each video's bytes from its URI."""
    import pyarrow as pa

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
    max_bytes = None if max_video_mb is None else int(max_video_mb * 1_000_000)
    read_attempts = max(1, int(read_retries))
    read_sleep = float(read_retry_sleep_s)
    fs_cache: dict = {}

    @geneva.chunker(
        output_schema=output_schema,
        input_columns=[uri_column],
        inherit_input_columns=False,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    def _chunk_uri_video(video_uri: str):
        import io
        import logging
        import os
        import time

        import av  # pyright: ignore[reportMissingImports]  (the stand-in)
        import pyarrow.fs as pafs
        from PIL import Image  # pyright: ignore[reportMissingImports]  (the stand-in)

        log = logging.getLogger("geneva.chunk_uri_video")

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

        def _probe_video(src):
            with src() as f, av.open(f) as c:
                s = c.streams.video[0]
                if s.duration is not None and s.time_base is not None:
                    return float(s.duration * s.time_base)
                if c.duration is not None:
                    return float(c.duration) / float(av.time_base)
            return 0.0

        def _encode_clip(src, start, end):
            out_buf, wrote = io.BytesIO(), 0
            frame_bytes = None
            with src() as f, av.open(f) as inp:
                ins = inp.streams.video[0]
                tb = ins.time_base

                if start > 0 and tb is not None:
                    inp.seek(int(start / tb), stream=ins, backward=True)
                for fr in inp.decode(ins):
                    if fr.time is None or fr.time < start:
                        continue
                    img = Image.fromarray(fr.to_ndarray(format="rgb24"))
                    img.thumbnail((512, 512), Image.Resampling.LANCZOS)
                    pbuf = io.BytesIO()
                    img.save(pbuf, format="JPEG", quality=85)
                    frame_bytes = pbuf.getvalue()
                    break

                if tb is not None:
                    inp.seek(int(start / tb), stream=ins, backward=True)
                with av.open(out_buf, "w", format="mp4") as out:
                    try:
                        ostream = out.add_stream_from_template(ins)
                    except AttributeError:
                        ostream = out.add_stream(template=ins)
                    base_dts = None
                    for packet in inp.demux(ins):
                        if packet.pts is None or packet.dts is None:
                            continue
                        if float(packet.pts * tb) >= end:
                            break
                        if base_dts is None:
                            base_dts = packet.dts
                        packet.pts -= base_dts
                        packet.dts -= base_dts
                        packet.stream = ostream
                        out.mux(packet)
                        wrote += 1
            return (out_buf.getvalue() if wrote else None), frame_bytes

        if not video_uri:
            return

        fs = fs_cache.get("fs")
        if fs is None:
            try:
                fs = pafs.S3FileSystem(
                    access_key=os.environ["ASSETS_S3_ACCESS_KEY"],
                    secret_key=os.environ["ASSETS_S3_SECRET_KEY"],
                    endpoint_override=os.environ["ASSETS_S3_ENDPOINT"],
                    region=os.environ.get("ASSETS_S3_REGION", "us-east-1"),
                    scheme=os.environ.get("ASSETS_S3_SCHEME", "https"),
                )
            except KeyError as e:
                log.warning(
                    "missing worker video credential env %s; skipping %s", e, video_uri
                )
                return
            fs_cache["fs"] = fs

        path = video_uri.removeprefix("s3://")  # "bucket/key.mp4"

        if max_bytes is not None:
            try:
                info = fs.get_file_info(path)
                if info.size is not None and info.size > max_bytes:
                    log.info("skip %s: %d bytes > max_video_mb", video_uri, info.size)
                    return
            except Exception as e:  # noqa: BLE001 (stat failure -> fall through to read)
                log.debug("stat failed for %s: %s", video_uri, e)

        def _open():
            return fs.open_input_file(path)

        dur = None
        last_err = None
        for attempt in range(read_attempts):
            try:
                dur = _probe_video(_open)
                break
            except Exception as e:  # noqa: BLE001 (transient/corrupt; retry then skip)
                last_err = e
                if attempt + 1 < read_attempts:
                    time.sleep(read_sleep * (2**attempt))
        if dur is None:
            log.warning(
                "probe_failed %s after %d attempts: %s: %s",
                video_uri,
                read_attempts,
                type(last_err).__name__,
                last_err,
            )
            return

        if limit is not None and dur > limit:
            return
        for cid, (start, end) in enumerate(_clip_windows(dur, cs, max_n=max_clips)):
            try:
                clip, frame = _encode_clip(_open, start, end)
            except Exception as e:  # noqa: BLE001 (one bad window; log + skip)
                log.warning("encode_failed %s window=%d: %s", video_uri, cid, e)
                continue
            if clip is None:
                continue
            yield {
                "chunk_id": int(cid),
                "start_sec": float(start),
                "end_sec": float(end),
                "clip_bytes": clip,
                "frame": frame,
            }

    return _chunk_uri_video


# -- geneva_examples/examples/video/ingest_external_refs.py (the two helpers the chunk step imports) --


def _endpoint_and_scheme(endpoint: str) -> tuple[str, str]:
    if endpoint.startswith("https://"):
        return endpoint[len("https://") :].rstrip("/"), "https"
    if endpoint.startswith("http://"):
        return endpoint[len("http://") :].rstrip("/"), "http"
    return endpoint.rstrip("/"), "https"


def _resolve_video_creds(
    cfg: Config,
    *,
    bucket: str = "",
    endpoint: str,
    access_key: str,
    secret_key: str,
    region: str,
    require_bucket: bool = True,
) -> tuple[str, str, str, str, str]:
    endpoint = endpoint or cfg.assets_s3_endpoint or ""
    access_key = access_key or cfg.assets_s3_access_key or ""
    secret_key = secret_key or cfg.assets_s3_secret_key or ""
    region = region or cfg.assets_s3_region or "us-east-1"
    required = [
        ("video_bucket", bucket),
        ("video_endpoint", endpoint),
        ("video_access_key", access_key),
        ("video_secret_key", secret_key),
    ]
    if not require_bucket:
        required = required[1:]
    missing = [name for name, val in required if not val]
    if missing:
        raise RuntimeError(
            "missing video-bucket credentials (pass --video-* or set "
            "assets_s3_* in config.yaml): " + ", ".join(missing)
        )
    return bucket, endpoint, access_key, secret_key, region


VIDEO_RUNTIME_PIP = ["geneva", "lancedb", "pylance", "pyarrow==23.0.1", "pillow==12.2.0", "av>=12,<14"]


# -- geneva_examples/examples/video/chunk_external_video.py: run(), as written -----------------


def run_chunk_external(
    cfg: Config,
    *,
    source_table: str = "videos",
    clips_table: str = "video_clips",
    uri_column: str = "video_uri",
    video_endpoint: str = "",
    video_access_key: str = "",
    video_secret_key: str = "",
    video_region: str = "",
    chunk_seconds: float = 10.0,
    concurrency: int = 8,
    checkpoint_size: int = 32,
    source_task_size: int | None = 1,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory_gib: int = 2,
    max_clips: int | None = None,
    max_video_s: float | None = None,
    max_video_mb: float | None = None,
    read_retries: int = 4,
    read_retry_sleep_s: float = 1.0,
    detach: bool = False,
    overwrite: bool = True,
    table_write_retries: int = 5,
    table_write_retry_sleep_s: float = 2.0,
) -> None:
    """Chunk the URI-pointer ``videos`` table into a standalone clips table."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    _, endpoint, access_key, secret_key, region = _resolve_video_creds(
        cfg,
        endpoint=video_endpoint,
        access_key=video_access_key,
        secret_key=video_secret_key,
        region=video_region,
        require_bucket=False,
    )
    host, scheme = _endpoint_and_scheme(endpoint)

    num_cpus, num_gpus, memory_bytes = resolve_resources(  # pyright: ignore[reportAssignmentType]
        cfg, num_cpus=num_cpus, num_gpus=num_gpus, memory_gib=memory_gib
    )

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info(
        "db_uri %s source %s clips %s chunk_seconds %s",
        cfg.db_uri,
        source_table,
        clips_table,
        chunk_seconds,
    )
    logger.info(
        "scheduling concurrency=%d num_cpus=%.2f source_task_size=%s "
        "-> total_cpu_demand=%.1f",
        concurrency,
        num_cpus,
        source_task_size,
        concurrency * num_cpus,
    )

    conn = connect(cfg)
    src = conn.open_table(source_table)
    require_stable_row_ids(src, source_table)

    if overwrite:
        try:
            conn.drop_table(clips_table)
            logger.info("dropped_existing_table %s", clips_table)
        except Exception:  # noqa: BLE001
            pass

    worker_env = {
        "ASSETS_S3_ACCESS_KEY": access_key,
        "ASSETS_S3_SECRET_KEY": secret_key,
        "ASSETS_S3_ENDPOINT": host,
        "ASSETS_S3_SCHEME": scheme,
        "ASSETS_S3_REGION": region,
    }
    if cfg.is_local:
        os.environ.update(worker_env)
        manifest = None
    else:
        from mv_assets.manifest import GenevaManifest  # type: ignore[import-not-found]

        manifest = (
            GenevaManifest.create_pip(f"chunk-external-{uuid.uuid4().hex[:6]}")
            .pip([*VIDEO_RUNTIME_PIP])
            .env_vars(worker_env)
            .build()
        )

    udtf = chunk_uri_video_udtf(
        uri_column=uri_column,
        chunk_seconds=chunk_seconds,
        manifest=manifest,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory_bytes=memory_bytes,
        max_video_s=max_video_s,
        num_clips=max_clips,
        max_video_mb=max_video_mb,
        read_retries=read_retries,
        read_retry_sleep_s=read_retry_sleep_s,
    )

    view = retry_io(
        "create_clips_view",
        lambda: conn.create_udtf_view(
            clips_table,
            source=src.search(None).select(["video_id", uri_column]),
            udtf=udtf,
        ),
        attempts=table_write_retries,
        sleep_s=table_write_retry_sleep_s,
    )
    refresh_kwargs: dict = {}
    if cfg.is_local:
        concurrency = local_concurrency(concurrency)
        refresh_kwargs["_admission_check"] = False

    if detach and cfg.is_local:
        logger.warning(
            "--detach is ignored in local mode (local Ray is torn down on exit); "
            "running synchronously"
        )
        detach = False

    if detach:
        job = view.refresh_async(
            concurrency=concurrency,
            max_rows_per_fragment=checkpoint_size,
            source_task_size=source_task_size,
            **refresh_kwargs,
        )
        logger.info("submitted detached refresh; job_id %s", job.job_id)
        logger.info("monitor with: uv run jobs tail %s", job.job_id)
        logger.info("chunk_videos_external_submitted")
        return

    with runtime_session(conn, cfg):
        view.refresh(
            concurrency=concurrency,
            max_rows_per_fragment=checkpoint_size,
            source_task_size=source_task_size,
            **refresh_kwargs,
        )
    view.checkout_latest()

    logger.info("chunk_rows %s", view.count_rows())
    logger.info("clips_table_columns %s", view.schema.names)
    logger.info(
        "clips_sample\n%s",
        format_sample(
            view.search()
            .select(["video_id", "chunk_id", "start_sec", "end_sec"])
            .limit(5)
            .to_list()
        ),
    )
    logger.info("chunk_videos_external_ok")


# -- the external-video tests ----------------------------------------------------------------------

_BUCKET = "assets"
_CREDS = {"access_key": "AKIA-VIDEO", "secret_key": "video-secret", "endpoint": "http://minio.local:9000"}
_ASSETS_ENV = ("ASSETS_S3_ACCESS_KEY", "ASSETS_S3_SECRET_KEY", "ASSETS_S3_ENDPOINT", "ASSETS_S3_SCHEME",
               "ASSETS_S3_REGION", "RAY_ENABLE_UV_RUN_RUNTIME_ENV", "HF_HOME")


@pytest.fixture
def video_bucket(tmp_path, monkeypatch, media_stand_ins):
    """A bucket of toy videos served by a stand-in ``pyarrow.fs.S3FileSystem`` (same keywords), and
    the ``videos`` table of their URIs the ingest step makes. Returns what the test checks."""
    _scoped_env(monkeypatch, *_ASSETS_ENV)
    root = tmp_path / "bucket-root"
    (root / _BUCKET / "movies").mkdir(parents=True)
    videos = {  # video_id -> (object, frames or a non-video payload)
        "v0": ("movies/v0.mp4", 22),  # 5.5 s: 3 clips of 2 s
        "v1": ("movies/v1.mp4", 5),  # 1.25 s: 1 clip
        "v2": ("movies/v2.mp4", 8),  # 2 s; its stream has no duration: the container's
        "v3": ("movies/v3.mp4", 60),  # the largest object: over max_video_mb
        "v4": ("movies/corrupt.mp4", b"not a video"),  # probe fails: skipped
        "v5": ("movies/missing.mp4", None),  # no such object: skipped
        "v6": ("", None),  # no URI
    }
    for no, (vid, (key, content)) in enumerate(videos.items()):
        if isinstance(content, int):
            (root / _BUCKET / key).write_bytes(_video_file(no, content, stream_duration=vid != "v2"))
        elif isinstance(content, bytes):
            (root / _BUCKET / key).write_bytes(content)
    opened: list[dict[str, Any]] = []
    gate = threading.Event()  # the bucket answers once set (the detached test sees its job running first)
    gate.set()
    reached = threading.Event()  # a UDTF asked for the bucket

    def S3FileSystem(access_key=None, *, secret_key=None, session_token=None, region=None, scheme="https",
                     endpoint_override=None, **options):
        reached.set()
        assert gate.wait(30)
        opened.append({"access_key": access_key, "secret_key": secret_key, "region": region, "scheme": scheme,
                       "endpoint_override": endpoint_override})
        return pyarrow.fs.SubTreeFileSystem(str(root), pyarrow.fs.LocalFileSystem())

    monkeypatch.setattr(pyarrow.fs, "S3FileSystem", S3FileSystem)
    cfg = Config(local_db_path=str(tmp_path / "db"), assets_s3_endpoint=_CREDS["endpoint"],
                 assets_s3_access_key=_CREDS["access_key"], assets_s3_secret_key=_CREDS["secret_key"])
    rows = [{"video_id": vid, "video_uri": f"s3://{_BUCKET}/{key}" if key else "",
             "size_mb": ((root / _BUCKET / key).stat().st_size / 1e6 if key and (root / _BUCKET / key).exists()
                         else None)} for vid, (key, _) in videos.items()]
    connect(cfg).create_table("videos", data=rows, storage_options={OPT_STABLE_ROW_IDS: "true"})
    largest = max(r["size_mb"] for r in rows if r["size_mb"] is not None)
    want = []
    for no, (vid, (_, content)) in enumerate(videos.items()):
        if isinstance(content, int) and vid != "v3":
            want += [{"video_id": vid, **c} for c in _expected_clips(no, content, 2.0, rewind_at_start=True)]
    return types.SimpleNamespace(cfg=cfg, root=root, opened=opened, gate=gate, reached=reached, want=want, max_video_mb=largest * 0.9)


def _check_opened(opened: list[dict[str, Any]]) -> None:
    assert opened, "the UDTF never opened the bucket"
    assert all(o == {"access_key": "AKIA-VIDEO", "secret_key": "video-secret", "region": "us-east-1",
                     "scheme": "http", "endpoint_override": "minio.local:9000"} for o in opened)


def test_chunk_external_video_example_reads_each_uri_and_expands_it_into_clips(video_bucket, caplog):
    caplog.set_level(logging.INFO)
    b = video_bucket
    run_chunk_external(b.cfg, chunk_seconds=2.0, max_video_mb=b.max_video_mb, read_retry_sleep_s=0.01)

    view = connect(b.cfg).open_table("video_clips")
    assert set(view.schema.names) >= set(_CLIP_KEY) and "video_uri" not in view.schema.names
    assert _clip_rows(view.to_arrow().to_pylist()) == _clip_rows(b.want)
    _check_opened(b.opened)
    assert "chunk_videos_external_ok" in caplog.messages
    assert f"chunk_rows {len(b.want)}" in caplog.messages
    assert any(m.startswith("probe_failed s3://assets/movies/corrupt.mp4 after 4 attempts") for m in caplog.messages)
    assert any(m.startswith("probe_failed s3://assets/movies/missing.mp4 after 4 attempts") for m in caplog.messages)

    # --detach in local mode: the example says it runs synchronously (its local Ray would die on exit)
    caplog.clear()
    run_chunk_external(b.cfg, chunk_seconds=2.0, max_video_mb=b.max_video_mb, read_retry_sleep_s=0.01, detach=True)
    assert any("--detach is ignored in local mode" in m for m in caplog.messages)
    assert _clip_rows(connect(b.cfg).open_table("video_clips").to_arrow().to_pylist()) == _clip_rows(b.want)

    # what the example checks stable row ids for: the clips view refreshes across source versions
    (b.root / _BUCKET / "movies" / "v7.mp4").write_bytes(_video_file(7, 9))
    conn = connect(b.cfg)
    conn.open_table("videos").add([{"video_id": "v7", "video_uri": f"s3://{_BUCKET}/movies/v7.mp4", "size_mb": 0.0}])
    result = conn.open_table("video_clips").refresh()
    assert result.rows_inserted == 1  # one parent chunked: the new video
    new = [{"video_id": "v7", **c} for c in _expected_clips(7, 9, 2.0, rewind_at_start=True)]
    assert _clip_rows(conn.open_table("video_clips").to_arrow().to_pylist()) == _clip_rows(b.want + new)


class _StandInManifest:
    """Stand-in for geneva.manifest.GenevaManifest's builder (Ray runtime manifests do not apply here):
    the env_vars it would give the cluster's workers are set in this process, where the tasks run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self._monkeypatch, self.name, self.pips, self.env = monkeypatch, name, [], {}

    def pip(self, packages: list[str]) -> _StandInManifest:
        self.pips = list(packages)
        return self

    def env_vars(self, env: dict[str, str]) -> _StandInManifest:
        self.env = dict(env)
        return self

    def build(self) -> _StandInManifest:
        for k, v in self.env.items():
            self._monkeypatch.setenv(k, v)
        return self


def test_chunk_external_video_example_detached_refresh_is_followed_to_done(video_bucket, caplog, monkeypatch):
    """``--detach`` (taken off local mode only): ``refresh_async``, then ``conn.get_job(job_id)`` until DONE."""
    b = video_bucket
    built: list[_StandInManifest] = []
    manifest_module = types.ModuleType("mv_assets.manifest")

    class GenevaManifest:
        @staticmethod
        def create_pip(name: str) -> _StandInManifest:
            built.append(_StandInManifest(monkeypatch, name))
            return built[-1]

    manifest_module.GenevaManifest = GenevaManifest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mv_assets.manifest", manifest_module)
    cfg = Config(**{**vars(b.cfg), "mode": "enterprise", "db_uri": b.cfg.local_db_path})
    caplog.set_level(logging.INFO)
    b.gate.clear()

    run_chunk_external(cfg, chunk_seconds=2.0, max_video_mb=b.max_video_mb, read_retry_sleep_s=0.01, detach=True)

    assert [r for r in caplog.records if "--detach is ignored" in r.getMessage()] == []
    submitted = [r for r in caplog.records if r.msg == "submitted detached refresh; job_id %s"]
    assert len(submitted) == 1 and "chunk_videos_external_submitted" in caplog.messages
    job_id = submitted[0].args[0]  # type: ignore[index]
    assert built[0].env["ASSETS_S3_ENDPOINT"] == "minio.local:9000"

    conn = connect(cfg)
    try:
        assert b.reached.wait(30)
        record = conn.get_job(job_id)  # the UDTF waits on the bucket: the job is running
        assert (record.status.value, record.job_type, record.table_name) == ("RUNNING", "refresh", "video_clips")
        assert [j.job_id for j in conn.list_jobs(table_name="video_clips", status="RUNNING")] == [job_id]
        # `uv run jobs tail <job-id>` runs in another process: it reads the record from the catalog
        probe = ("import sys, mv_assets as geneva; j = geneva.connect(uri=sys.argv[1]).get_job(sys.argv[2]); "
                 "print(j.status.value, j.job_type, j.table_name)")
        other = subprocess.run([sys.executable, "-c", probe, cfg.db_uri, job_id], capture_output=True, text=True,
                               timeout=120)
        assert (other.returncode, other.stdout) == (0, "RUNNING refresh video_clips\n"), other.stderr[-2000:]
    finally:
        b.gate.set()
    deadline = time.monotonic() + 60
    while True:  # as `jobs tail <job-id>` follows it
        record = conn.get_job(job_id)
        status = getattr(record.status, "value", record.status)
        if status not in ("RUNNING", "PENDING"):
            break
        assert time.monotonic() < deadline, "the detached refresh did not finish"
        time.sleep(0.05)
    assert status == "DONE", record.error
    assert record.job_type == "refresh" and record.table_name == "video_clips"
    assert record.events[-1].endswith("Job completed with status DONE")
    view = conn.open_table("video_clips")
    assert _clip_rows(view.to_arrow().to_pylist()) == _clip_rows(b.want)
    assert record.metric("rows_inserted") == 7  # a chunk view's refresh counts parents (docs/concepts.md)
    _check_opened(b.opened)


# -- geneva_examples/examples/video/chunkers.py: chunk_blob_video_udtf, as written ---------------


def chunk_blob_video_udtf(
    *,
    source_uri: str,
    blob_column: str,
    pointer_column: str,
    chunk_seconds: float,
    manifest: Any,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory_bytes: int = 1024**3,
    max_video_s: float | None = None,
    num_clips: int | None = None,
    read_retries: int = 4,
    read_retry_sleep_s: float = 1.0,
):
    """Chunker that reads each video's blob from a source Lance dataset."""
    import pyarrow as pa

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
    src_uri = source_uri
    blob_col = blob_column
    read_attempts = max(1, int(read_retries))
    read_sleep = float(read_retry_sleep_s)
    ds_cache: dict = {}

    @geneva.chunker(
        output_schema=output_schema,
        input_columns=[pointer_column],
        inherit_input_columns=False,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    def _chunk_blob_video(openvid_rowid: int):
        import io
        import logging
        import time

        import av  # pyright: ignore[reportMissingImports]  (the stand-in)
        import lance
        from PIL import Image  # pyright: ignore[reportMissingImports]  (the stand-in)

        log = logging.getLogger("geneva.chunk_blob_video")

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

        def _probe_video(b):
            with av.open(io.BytesIO(b)) as c:
                s = c.streams.video[0]
                if s.duration is not None and s.time_base is not None:
                    return float(s.duration * s.time_base)
                if c.duration is not None:
                    return float(c.duration) / float(av.time_base)
            return 0.0

        def _encode_clip(b, start, end):
            out_buf, wrote = io.BytesIO(), 0
            frame_bytes = None
            with av.open(io.BytesIO(b)) as inp:
                ins = inp.streams.video[0]
                tb = ins.time_base

                if start > 0 and tb is not None:
                    inp.seek(int(start / tb), stream=ins, backward=True)
                for fr in inp.decode(ins):
                    if fr.time is None or fr.time < start:
                        continue
                    img = Image.fromarray(fr.to_ndarray(format="rgb24"))
                    img.thumbnail((512, 512), Image.Resampling.LANCZOS)
                    pbuf = io.BytesIO()
                    img.save(pbuf, format="JPEG", quality=85)
                    frame_bytes = pbuf.getvalue()
                    break

                if start > 0 and tb is not None:
                    inp.seek(int(start / tb), stream=ins, backward=True)
                with av.open(out_buf, "w", format="mp4") as out:
                    try:
                        ostream = out.add_stream_from_template(ins)
                    except AttributeError:
                        ostream = out.add_stream(template=ins)
                    base_dts = None
                    for packet in inp.demux(ins):
                        if packet.pts is None or packet.dts is None:
                            continue
                        if float(packet.pts * tb) >= end:
                            break
                        if base_dts is None:
                            base_dts = packet.dts
                        packet.pts -= base_dts
                        packet.dts -= base_dts
                        packet.stream = ostream
                        out.mux(packet)
                        wrote += 1
            return (out_buf.getvalue() if wrote else None), frame_bytes

        if openvid_rowid is None:
            return
        rid = int(openvid_rowid)

        video = None
        last_err = None
        for attempt in range(read_attempts):
            try:
                ds = ds_cache.get("ds")
                if ds is None:
                    ds = lance.dataset(src_uri)
                    ds_cache["ds"] = ds
                blobs = ds.take_blobs(blob_col, ids=[rid])
                if not blobs:
                    log.debug("blob_missing rowid=%s; skipping", rid)
                    return
                with blobs[0] as bf:  # pyright: ignore[reportOptionalContextManager]
                    if bf.size() == 0:
                        log.debug("blob_empty rowid=%s; skipping", rid)
                        return
                    video = bf.readall()
                break
            except Exception as e:  # noqa: BLE001 (transient read; retry/log)
                last_err = e
                ds_cache.pop("ds", None)
                if attempt + 1 < read_attempts:
                    time.sleep(read_sleep * (2**attempt))
        if video is None:
            log.warning(
                "blob_read_failed rowid=%s after %d attempts: %s: %s",
                rid,
                read_attempts,
                type(last_err).__name__,
                last_err,
            )
            return

        try:
            dur = _probe_video(video)
        except Exception as e:  # noqa: BLE001 (corrupt bytes; log + skip)
            log.warning(
                "decode_failed rowid=%s (%d bytes): %s: %s",
                rid,
                len(video),
                type(e).__name__,
                e,
            )
            return

        if limit is not None and dur > limit:
            return
        for cid, (start, end) in enumerate(_clip_windows(dur, cs, max_n=max_clips)):
            try:
                clip, frame = _encode_clip(video, start, end)
            except Exception as e:  # noqa: BLE001 (one bad window; log + skip)
                log.warning("encode_failed rowid=%s window=%d: %s", rid, cid, e)
                continue
            if clip is None:
                continue
            yield {
                "chunk_id": int(cid),
                "start_sec": float(start),
                "end_sec": float(end),
                "clip_bytes": clip,
                "frame": frame,
            }

    return _chunk_blob_video


# -- geneva_examples/examples/video/chunk_openvid.py: run(), as written ----------------------------


def run_chunk_openvid(
    cfg: Config,
    *,
    source_table: str = "videos",
    clips_table: str = "video_clips",
    openvid_uri: str = "hf://datasets/lance-format/openvid-lance/data",
    openvid_table: str = "train",
    blob_column: str = "video_blob",
    pointer_column: str = "openvid_rowid",
    chunk_seconds: float = 1.0,
    concurrency: int = 4,
    checkpoint_size: int = 32,
    source_task_size: int | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory_gib: int = 1,
    max_clips: int | None = None,
    max_video_s: float | None = None,
    overwrite: bool = True,
    table_write_retries: int = 5,
    table_write_retry_sleep_s: float = 2.0,
    read_retries: int = 4,
    read_retry_sleep_s: float = 1.0,
) -> None:
    """Chunk the videos table into a standalone clips table (1s clips)."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    num_cpus, num_gpus, memory_bytes = resolve_resources(  # pyright: ignore[reportAssignmentType]
        cfg, num_cpus=num_cpus, num_gpus=num_gpus, memory_gib=memory_gib
    )

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info(
        "db_uri %s source %s clips %s chunk_seconds %s",
        cfg.db_uri,
        source_table,
        clips_table,
        chunk_seconds,
    )
    logger.info(
        "scheduling concurrency=%d num_cpus=%.2f num_gpus=%.2f "
        "-> total_cpu_demand=%.1f (spreads across the fleet once this exceeds "
        "one worker's cores)",
        concurrency,
        num_cpus,
        num_gpus,
        concurrency * num_cpus,
    )

    conn = connect(cfg)
    src = conn.open_table(source_table)
    require_stable_row_ids(src, source_table)

    if overwrite:
        try:
            conn.drop_table(clips_table)
            logger.info("dropped_existing_table %s", clips_table)
        except Exception:  # noqa: BLE001
            pass

    worker_env = {"HF_HOME": "/tmp/hf_cache"}
    if cfg.hf_token:
        worker_env["HF_TOKEN"] = cfg.hf_token
        logger.info("hf_token present; workers will authenticate to HF")
    else:
        logger.info("no hf_token configured; workers read HF anonymously")

    if cfg.is_local:
        for key, value in worker_env.items():
            os.environ.setdefault(key, value)
        manifest = None
    else:
        from mv_assets.manifest import GenevaManifest  # type: ignore[import-not-found]

        manifest = (
            GenevaManifest.create_pip(f"video-chunking-{uuid.uuid4().hex[:6]}")
            .pip([*VIDEO_RUNTIME_PIP, "huggingface-hub>=0.24"])
            .env_vars(worker_env)
            .build()
        )
    dataset_uri = f"{openvid_uri.rstrip('/')}/{openvid_table}.lance"
    logger.info("source_dataset %s blob_column %s", dataset_uri, blob_column)
    udtf = chunk_blob_video_udtf(
        source_uri=dataset_uri,
        blob_column=blob_column,
        pointer_column=pointer_column,
        chunk_seconds=chunk_seconds,
        manifest=manifest,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory_bytes=memory_bytes,
        max_video_s=max_video_s,
        num_clips=max_clips,
        read_retries=read_retries,
        read_retry_sleep_s=read_retry_sleep_s,
    )

    view = retry_io(
        "create_clips_view",
        lambda: conn.create_udtf_view(
            clips_table,
            source=src.search(None).select(["video_id", pointer_column]),
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
    logger.info("clips_table_columns %s", view.schema.names)
    logger.info(
        "clips_sample\n%s",
        format_sample(
            view.search()
            .select(["video_id", "chunk_id", "start_sec", "end_sec"])
            .limit(5)
            .to_list()
        ),
    )
    logger.info("chunk_videos_openvid_ok")


# -- geneva_examples/core/utils/videos.py (the OpenVid helpers) and video/ingest_openvid.py: run() ------

OPENVID_SOURCE_COLUMNS = [
    "video_path",
    "video_blob",
    "caption",
    "embedding",
    "aesthetic_score",
    "motion_score",
    "temporal_consistency_score",
    "camera_motion",
    "fps",
    "seconds",
    "frame",
]

_OPENVID_EMBEDDING_DIM = 1024


def _openvid_target_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("video_id", pa.string()),  # <- video_path
            pa.field("openvid_rowid", pa.int64()),  # <- source _rowid pointer
            pa.field("caption", pa.string()),
            pa.field("embedding", pa.list_(pa.float32(), _OPENVID_EMBEDDING_DIM)),
            pa.field("aesthetic_score", pa.float64()),
            pa.field("motion_score", pa.float64()),
            pa.field("temporal_consistency_score", pa.float64()),
            pa.field("camera_motion", pa.string()),
            pa.field("fps", pa.float64()),
            pa.field("seconds", pa.float64()),
            pa.field("frame", pa.int64()),
        ]
    )


def normalize_openvid_reference_batch(
    batch: pa.RecordBatch, *, skip_null_video: bool = True
) -> pa.RecordBatch:
    import pyarrow.compute as pc

    schema = _openvid_target_schema()
    tbl = pa.Table.from_batches([batch], schema=batch.schema)

    if skip_null_video:
        tbl = tbl.filter(pc.is_valid(tbl["video_blob"]))  # pyright: ignore[reportAttributeAccessIssue]
    if tbl.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)

    embedding_col = tbl["embedding"]
    target_embedding = schema.field("embedding").type
    if not embedding_col.type.equals(target_embedding):
        embedding_col = embedding_col.cast(target_embedding)

    out = pa.table(
        {
            "video_id": tbl["video_path"].cast(pa.string()),
            "openvid_rowid": tbl["_rowid"].cast(pa.int64()),
            "caption": tbl["caption"],
            "embedding": embedding_col,
            "aesthetic_score": tbl["aesthetic_score"],
            "motion_score": tbl["motion_score"],
            "temporal_consistency_score": tbl["temporal_consistency_score"],
            "camera_motion": tbl["camera_motion"],
            "fps": tbl["fps"],
            "seconds": tbl["seconds"],
            "frame": tbl["frame"],
        },
        schema=schema,
    )
    return out.combine_chunks().to_batches()[0]


def run_ingest_openvid(
    cfg: Config,
    *,
    table_name: str = "videos",
    limit: int = 256,
    batch_size: int = 256,
    openvid_uri: str = "hf://datasets/lance-format/openvid-lance/data",
    openvid_table: str = "train",
    skip_null_video: bool = True,
    overwrite: bool = False,
    table_write_retries: int = 5,
    table_write_retry_sleep_s: float = 2.0,
) -> None:
    """Stream OpenVid rows into the configured videos table."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("HF_HOME", "./huggingface_cache")

    import lance

    import mv_assets as geneva

    dataset_uri = f"{openvid_uri.rstrip('/')}/{openvid_table}.lance"

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info(
        "db_uri %s table %s source %s limit %s",
        cfg.db_uri,
        table_name,
        dataset_uri,
        limit,
    )

    conn = connect(cfg)

    src = lance.dataset(dataset_uri)
    reader = src.scanner(
        columns=OPENVID_SOURCE_COLUMNS,
        limit=limit,
        batch_size=batch_size,
        with_row_id=True,
    ).to_batches()

    if overwrite:
        try:
            conn.drop_table(table_name)
            logger.info("dropped_existing_table %s", table_name)
        except Exception:  # noqa: BLE001
            pass

    table = None
    rows_written = 0
    next_log = 500
    for batch_index, raw in enumerate(reader, start=1):
        norm = normalize_openvid_reference_batch(raw, skip_null_video=skip_null_video)
        if norm.num_rows == 0:
            continue
        if table is None:
            table = retry_io(
                "create_table",
                lambda b=norm: conn.create_table(
                    table_name,
                    data=b,
                    storage_options={OPT_STABLE_ROW_IDS: "true"},
                ),
                attempts=table_write_retries,
                sleep_s=table_write_retry_sleep_s,
            )
        else:
            retry_io(
                f"add_batch_{batch_index}",
                lambda b=norm, t=table: t.add(b),
                attempts=table_write_retries,
                sleep_s=table_write_retry_sleep_s,
            )
        rows_written += norm.num_rows
        if rows_written >= next_log:
            logger.info("rows_written %d (target %d)", rows_written, limit)
            next_log += 500
        if rows_written >= limit:
            break

    if table is None:
        raise RuntimeError(
            "no rows ingested from OpenVid (empty result or every video_blob was null)"
        )

    logger.info("rows_created %s", table.count_rows())
    logger.info("table_columns %s", table.schema.names)
    try:
        logger.info("table_names %s", conn.table_names())
    except Exception:  # noqa: BLE001
        pass
    logger.info(
        "initial_sample\n%s",
        format_sample(
            table.search().select(["video_id", "openvid_rowid"]).limit(5).to_list()
        ),
    )
    logger.info("ingest_videos_openvid_ok")


# -- the OpenVid test ------------------------------------------------------------------------------


def _openvid_dataset(path: Path, videos: dict[str, int | bytes | None]) -> None:
    """A stand-in for lance-format/openvid-lance's ``train.lance``, its columns and types:
    ``video_blob`` blob-encoded (a large_binary field with ``lance-encoding:blob``), two rows per
    file (row ids of several fragments)."""
    schema = pa.schema([
        pa.field("video_path", pa.string()),
        pa.field("video_blob", pa.large_binary(), metadata={"lance-encoding:blob": "true"}),
        pa.field("caption", pa.string()),
        pa.field("embedding", pa.list_(pa.float32(), _OPENVID_EMBEDDING_DIM)),
        pa.field("aesthetic_score", pa.float64()),
        pa.field("motion_score", pa.float64()),
        pa.field("temporal_consistency_score", pa.float64()),
        pa.field("camera_motion", pa.string()),
        pa.field("fps", pa.float64()),
        pa.field("seconds", pa.float64()),
        pa.field("frame", pa.int64()),
    ])
    rows = []
    for no, (vid, n) in enumerate(videos.items()):
        frames = n if isinstance(n, int) else 0
        rows.append({"video_path": vid, "video_blob": _video_file(no, n) if isinstance(n, int) else n,
                     "caption": f"video {no}", "embedding": [no / 10] * _OPENVID_EMBEDDING_DIM,
                     "aesthetic_score": 4.5, "motion_score": float(no), "temporal_consistency_score": 0.9,
                     "camera_motion": "static", "fps": float(_FPS), "seconds": frames / _FPS, "frame": frames})
    lance.write_dataset(pa.Table.from_pylist(rows, schema=schema), str(path), max_rows_per_file=2)


def test_chunk_openvid_example_reads_each_video_from_a_lance_blob_column(tmp_path, monkeypatch, media_stand_ins,
                                                                        caplog):
    _scoped_env(monkeypatch, *_ASSETS_ENV)
    caplog.set_level(logging.INFO)
    videos: dict[str, int | bytes | None] = {
        "clip_a.mp4": 10,  # 2.5 s: 3 one-second clips
        "clip_b.mp4": 3,  # 0.75 s: 1 clip
        "clip_g.mp4": None,  # no blob: the ingest leaves it out
        "clip_c.mp4": 20,  # 5 s: max_video_s=4.0 skips it
        "clip_d.mp4": b"",  # an empty blob: skipped
        "clip_e.mp4": b"garbage",  # decode fails: skipped
        "clip_f.mp4": 7,
    }
    _openvid_dataset(tmp_path / "openvid" / "train.lance", videos)
    cfg = Config(local_db_path=str(tmp_path / "db"))
    run_ingest_openvid(cfg, openvid_uri=str(tmp_path / "openvid"), batch_size=3)

    src = lance.dataset(str(tmp_path / "openvid" / "train.lance"))
    pointers = {r["video_path"]: r["_rowid"] for r in src.scanner(columns=["video_path"], with_row_id=True)
                .to_table().to_pylist()}
    assert len({rid >> 32 for rid in pointers.values()}) == 4  # row ids of four fragments
    ingested = connect(cfg).open_table("videos").to_arrow().to_pylist()
    assert sorted((r["video_id"], r["openvid_rowid"], r["frame"]) for r in ingested) == sorted(
        (vid, pointers[vid], n if isinstance(n, int) else 0) for vid, n in videos.items() if n is not None)

    run_chunk_openvid(cfg, openvid_uri=str(tmp_path / "openvid"), max_video_s=4.0, read_retry_sleep_s=0.01)

    want = [{"video_id": vid, **c} for no, (vid, n) in enumerate(videos.items()) if isinstance(n, int) and n <= 16
            for c in _expected_clips(no, n, 1.0, rewind_at_start=False)]
    view = connect(cfg).open_table("video_clips")
    assert set(view.schema.names) >= set(_CLIP_KEY) and "openvid_rowid" not in view.schema.names
    assert _clip_rows(view.to_arrow().to_pylist()) == _clip_rows(want)
    assert "chunk_videos_openvid_ok" in caplog.messages
    assert f"decode_failed rowid={pointers['clip_e.mp4']} (7 bytes): ValueError: [Errno 1094995529] Invalid data " \
           "found when processing input" in caplog.messages
    assert not [m for m in caplog.messages if m.startswith("blob_read_failed")]


# -- core/common.py and core/config.py for the CLIs, local mode only --------------------------------


def setup_logging(level: str = "INFO") -> None:
    # (the example's also quiets ray/lancedb/geneva loggers process-wide: left out, not to leak into other tests)
    logging.getLogger("geneva_examples").setLevel(level.upper())


def load_config(config_path: Path | None = None, *, mode_override: str | None = None,
                db_uri_override: str | None = None) -> Config:
    """core.config.load_config's local mode: ``mode`` and ``local_db_path`` from the YAML file."""
    if config_path is None:
        config_path = Path("config.yaml")
    data: dict = {}
    if config_path.exists():
        data = yaml.safe_load(config_path.read_text()) or {}
    mode = str(mode_override or data.get("mode") or "local").lower()
    assert mode == "local", "the CLIs run in local mode here"
    return Config(local_db_path=data.get("local_db_path") or "./local_db", mode=mode,
                  db_uri=db_uri_override or data.get("db_uri") or "db://quickstart")


# -- geneva_examples/ops/stats.py, as written (`import geneva` -> `import mv_assets as geneva`) -------

stats_app = typer.Typer(add_completion=False, help="Stats CLI: summarize LanceDB tables (row counts, schema, "
                                                   "feature columns).")

_FEATURE_COLUMNS = (
    "file_size",  # images: lightweight
    "dimensions",  # images: lightweight
    "embedding",  # images / clips: (frame-)embed
    "caption",  # clips: frame-caption
    "pose",  # clips: frame-openpose
    "caption_blip",  # images: caption
)
_ID_COLUMNS = ("video_id", "image_id", "doc_id")
_DEFAULT_TABLES = ("images", "videos", "video_clips")


def _open(conn: Any, name: str):
    try:
        return conn.open_table(name)
    except Exception:  # noqa: BLE001
        return None


def _schema_lines(table: Any) -> list[str]:
    return [f"    {f.name}: {f.type}" for f in table.schema]


def _report_features(table: Any, names: set[str], total: int) -> None:
    present = [c for c in _FEATURE_COLUMNS if c in names]
    if not present:
        typer.echo("  feature columns: none yet")
        return
    typer.echo("  feature columns:")
    for col in present:
        try:
            nulls = table.count_rows(f"`{col}` IS NULL")
            typer.echo(f"    {col}: {total - nulls}/{total} populated")
        except Exception as exc:  # pragma: no cover - backend quirk  # noqa: BLE001
            typer.echo(f"    {col}: (null count unavailable: {type(exc).__name__})")


def _report_id_sample(table: Any, id_col: str, total: int) -> None:
    ids = [r[id_col] for r in table.search(None).select([id_col]).limit(5).to_list()]
    more = f" (+{total - len(ids)} more)" if total > len(ids) else ""
    typer.echo(
        f"  {id_col}s (showing {len(ids)} of {total}): {', '.join(map(str, ids))}{more}"
    )


def _report_clip_stats(table: Any, names: set[str], max_rows: int) -> None:
    cols = [c for c in ("video_id", "start_sec", "end_sec") if c in names]
    total = table.count_rows()
    rows = table.search(None).select(cols).limit(max_rows).to_list()
    if len(rows) < total:
        typer.echo(
            f"  (per-video stats sampled from the first {len(rows)} of {total} rows)"
        )
    per_video = Counter(r["video_id"] for r in rows)
    shown = sorted(per_video.items())[:5]
    more = (
        f" (+{len(per_video) - len(shown)} more)" if len(per_video) > len(shown) else ""
    )
    typer.echo(f"  clips per video (showing {len(shown)} of {len(per_video)}):{more}")
    for vid, n in shown:
        typer.echo(f"    {vid}: {n}")
    durations = [
        float(r["end_sec"]) - float(r["start_sec"])
        for r in rows
        if r.get("end_sec") is not None and r.get("start_sec") is not None
    ]
    if durations:
        typer.echo(
            "  chunk seconds: "
            f"count={len(durations)} total={sum(durations):.1f} "
            f"min={min(durations):.1f} max={max(durations):.1f} "
            f"avg={sum(durations) / len(durations):.2f}"
        )


def _report_caption_sample(table: Any, names: set[str], sample: int) -> None:
    caption_col = next((c for c in ("caption", "caption_blip") if c in names), None)
    if not caption_col or sample <= 0:
        return
    id_cols = [c for c in ("video_id", "chunk_id", "image_id") if c in names]
    preview = table.search().select([*id_cols, caption_col]).limit(sample).to_list()
    typer.echo(f"  {caption_col} sample:")
    for r in preview:
        ident = " ".join(str(r.get(c)) for c in id_cols) or "?"
        typer.echo(f"    {ident}: {r.get(caption_col)!r}")


def _summarize_table(table: Any, sample: int, max_rows: int = 100_000) -> None:
    names = set(table.schema.names)
    total = table.count_rows()
    typer.echo(f"  rows: {total}")
    typer.echo("  schema:")
    for line in _schema_lines(table):
        typer.echo(line)

    _report_features(table, names, total)

    if {"video_id", "start_sec", "end_sec"}.issubset(names):
        _report_clip_stats(table, names, max_rows)
    else:
        id_col = next((c for c in _ID_COLUMNS if c in names), None)
        if id_col:
            _report_id_sample(table, id_col, total)

    _report_caption_sample(table, names, sample)


@stats_app.command()
def stats_run(
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(
        None, "--mode", help="Connection mode: 'local' or 'enterprise'."
    ),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    table: list[str] = typer.Option(
        None,
        "--table",
        help="Table to summarize (repeatable). Default: images, videos, video_clips.",
    ),
    sample: int = typer.Option(5, help="Caption rows to sample (0 to skip)."),
    max_rows: int = typer.Option(
        100_000, help="Cap rows scanned client-side for per-video stats."
    ),
) -> None:
    """Print stats for one or more tables (defaults to the example tables)."""
    setup_logging(log_level)

    import mv_assets as geneva  # noqa: F401  (ensures geneva is importable before connect)

    cfg = load_config(config, mode_override=mode, db_uri_override=db_uri)

    conn = connect(cfg)

    location = cfg.local_db_path if cfg.is_local else cfg.db_uri
    typer.echo(f"mode: {cfg.mode}   location: {location}")

    for name in table or list(_DEFAULT_TABLES):
        typer.echo(f"\n[{name}]")
        opened = _open(conn, name)
        if opened is None:
            typer.echo("  (table not found)")
        else:
            _summarize_table(opened, sample, max_rows)


# -- geneva_examples/ops/delete_table.py, as written ---------------------------------------------

delete_app = typer.Typer(add_completion=False, help="Delete-table CLI: pick one table off the current backend and "
                                                    "drop it.")


def _row_count(conn: Any, name: str) -> int | None:
    try:
        return conn.open_table(name).count_rows()
    except Exception:  # noqa: BLE001 - purely cosmetic
        return None


def _pick_table(names: list[str]) -> str:
    typer.echo("Tables:")
    width = len(str(len(names)))
    for i, name in enumerate(names, start=1):
        typer.echo(f"  {i:>{width}}. {name}")

    choice = typer.prompt("Table to delete (name or number)").strip()
    if choice in names:
        return choice
    if choice.isdigit() and 1 <= int(choice) <= len(names):
        return names[int(choice) - 1]
    typer.secho(f"no such table: {choice!r}", fg="red", err=True)
    raise typer.Exit(code=1)


@delete_app.command()
def delete_run(
    table: str | None = typer.Argument(
        None, help="Table to delete. Omit to pick from the list."
    ),
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(
        None, "--mode", help="Connection mode: 'local' or 'enterprise'."
    ),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Skip the confirmation prompt."
    ),
) -> None:
    """Drop a single table, chosen from the tables on this backend."""
    setup_logging(log_level)

    import mv_assets as geneva  # noqa: F401  (ensures geneva is importable before connect)

    cfg = load_config(config, mode_override=mode, db_uri_override=db_uri)
    conn = connect(cfg)

    location = cfg.local_db_path if cfg.is_local else cfg.db_uri
    typer.echo(f"mode: {cfg.mode}   location: {location}")

    names = sorted(conn.table_names())
    if not names:
        typer.echo("  (no tables)")
        return

    if table is None:
        target = _pick_table(names)
    elif table in names:
        target = table
    else:
        typer.secho(f"no table named {table!r} on {location}", fg="red", err=True)
        raise typer.Exit(code=1)

    rows = _row_count(conn, target)
    typer.echo(f"  {target}: {rows} rows" if rows is not None else f"  {target}")

    if not yes:
        typer.confirm(f"Are you sure you want to delete {target}?", abort=True)

    conn.drop_table(target)
    typer.secho(f"dropped {target}", fg="yellow")
    logger.info("dropped %s", target)


# -- the CLI tests ---------------------------------------------------------------------------------


def _invoke(app: typer.Typer, args: list[str], input: str | None = None) -> tuple[int, str]:  # noqa: A002
    result = CliRunner().invoke(app, args, input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture
def clips_catalog(video_bucket, tmp_path):
    """The ``videos`` table and the ``video_clips`` view the external chunk example makes, with a
    ``caption`` column backfilled onto the clips (as frame-caption does; the model: a stand-in),
    and the config.yaml the CLIs read."""
    from test_geneva_examples import backfill_column

    import mv_assets as geneva

    b = video_bucket
    run_chunk_external(b.cfg, chunk_seconds=2.0, max_video_mb=b.max_video_mb, read_retry_sleep_s=0.01)

    @geneva.udf(data_type=pa.string(), input_columns=["frame"], version=uuid.uuid4().hex)
    def caption(frame: bytes) -> str | None:
        return None if frame[5] % 2 == 0 else f"a frame starting {frame[5]}"

    conn = connect(b.cfg)
    backfill_column(conn=conn, table=conn.open_table("video_clips"), table_name="video_clips", column="caption",
                    udf=caption, concurrency=2, task_size=64, checkpoint_size=64, flush_interval_s=5.0,
                    timeout_min=1, wait_attempts=3, wait_sleep_s=1)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mode": "local", "local_db_path": b.cfg.local_db_path}))
    return types.SimpleNamespace(config=str(config), path=b.cfg.local_db_path, want=b.want, conn=conn)


def test_stats_cli_summarizes_the_videos_table_and_the_clips_view(clips_catalog):
    c = clips_catalog
    code, out = _invoke(stats_app, ["--config", c.config])
    assert code == 0, out

    clips = c.conn.open_table("video_clips").to_arrow().to_pylist()
    assert _clip_rows(clips) == _clip_rows(c.want)
    captions = {(r["video_id"], r["chunk_id"]): r["caption"] for r in clips}
    assert captions == {(w["video_id"], w["chunk_id"]): (None if w["frame"][5] % 2 == 0 else
                                                         f"a frame starting {w['frame'][5]}") for w in c.want}
    per_video = Counter(w["video_id"] for w in c.want)
    durations = [w["end_sec"] - w["start_sec"] for w in c.want]
    head, *sections = out.rstrip("\n").split("\n\n")
    parts = {s.splitlines()[0]: s.splitlines()[1:] for s in sections}
    assert head == f"mode: local   location: {c.path}" and list(parts) == ["[images]", "[videos]", "[video_clips]"]
    assert parts["[images]"] == ["  (table not found)"]
    videos = parts["[videos]"]
    assert videos[:6] == ["  rows: 7", "  schema:", "    video_id: string", "    video_uri: string",
                          "    size_mb: double", "  feature columns: none yet"]
    assert len(videos) == 7 and videos[6].startswith("  video_ids (showing 5 of 7): ")
    assert videos[6].endswith(" (+2 more)")
    assert len(set(videos[6].split(": ")[1].split(" (")[0].split(", ")) & {f"v{i}" for i in range(7)}) == 5
    populated = sum(1 for v in captions.values() if v is not None)
    assert 0 < populated < len(clips)
    lines = parts["[video_clips]"]
    assert lines[:2] == [f"  rows: {len(c.want)}", "  schema:"]
    schema = lines[2:lines.index("  feature columns:")]
    for field in ("video_id: string", "chunk_id: int32", "start_sec: float", "end_sec: float",
                  "clip_bytes: large_binary", "frame: large_binary", "caption: string"):
        assert f"    {field}" in schema
    at = lines.index("  feature columns:")
    assert lines[at + 1:at + 3 + len(per_video) + 2] == [
        f"    caption: {populated}/{len(clips)} populated",
        f"  clips per video (showing {len(per_video)} of {len(per_video)}):",
        *[f"    {vid}: {n}" for vid, n in sorted(per_video.items())],
        f"  chunk seconds: count={len(durations)} total={sum(durations):.1f} min={min(durations):.1f} "
        f"max={max(durations):.1f} avg={sum(durations) / len(durations):.2f}",
        "  caption sample:",
    ]
    sample = lines[at + 3 + len(per_video) + 2:]
    assert len(sample) == 5 and set(sample) <= {f"    {v} {k}: {cap!r}" for (v, k), cap in captions.items()}

    code, out = _invoke(stats_app, ["--config", c.config, "--table", "videos", "--table", "nope", "--sample", "0"])
    assert code == 0 and "[nope]\n  (table not found)" in out and "[video_clips]" not in out


def test_delete_table_cli_picks_confirms_and_drops_the_view_then_the_table(clips_catalog):
    c = clips_catalog
    args = ["--config", c.config]
    code, out = _invoke(delete_app, args, input="1\nn\n")  # declined: nothing dropped
    assert code == 1 and "Aborted" in out
    assert sorted(c.conn.table_names()) == ["video_clips", "videos"]

    code, out = _invoke(delete_app, args, input="3\n")
    assert code == 1 and "no such table: '3'" in out

    code, out = _invoke(delete_app, ["nope", *args])
    assert code == 1 and f"no table named 'nope' on {c.path}" in out

    code, out = _invoke(delete_app, args, input="1\ny\n")
    assert code == 0, out
    assert out.splitlines() == [
        f"mode: local   location: {c.path}", "Tables:", "  1. video_clips", "  2. videos",
        "Table to delete (name or number): 1", f"  video_clips: {len(c.want)} rows",
        "Are you sure you want to delete video_clips? [y/N]: y", "dropped video_clips",
    ]
    assert c.conn.table_names() == ["videos"]

    code, out = _invoke(delete_app, ["videos", "-y", *args])
    assert code == 0 and out.splitlines()[1:] == ["  videos: 7 rows", "dropped videos"]
    assert c.conn.table_names() == []
    code, out = _invoke(delete_app, args)
    assert code == 0 and out.splitlines()[1:] == ["  (no tables)"]


def test_delete_table_cli_is_refused_the_source_of_a_view_until_the_view_is_gone(clips_catalog):
    """Geneva drops a view's source; mv_assets refuses (docs/geneva.md, ``drop_table``): the CLI
    stops with the refusal, nothing is dropped, and dropping the view first lets it through."""
    c = clips_catalog
    with pytest.raises(ValueError, match=r"cannot drop 'videos': views \['video_clips'\] are defined over it"):
        _invoke(delete_app, ["videos", "-y", "--config", c.config])
    assert sorted(c.conn.table_names()) == ["video_clips", "videos"]
    for name in ("video_clips", "videos"):
        code, out = _invoke(delete_app, [name, "-y", "--config", c.config])
        assert code == 0 and out.splitlines()[-1] == f"dropped {name}"
    assert c.conn.table_names() == []


# -- geneva_examples/ops/cleanup.py, as written: the same drop, in the order the example lists ------

cleanup_app = typer.Typer(add_completion=False, help="Cleanup CLI: drop the video + clips tables (and their MV "
                                                     "siblings).")


@cleanup_app.command()
def cleanup_run(
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(
        None, "--mode", help="Connection mode: 'local' or 'enterprise'."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    videos_table: str = typer.Option("videos", help="Videos table to drop."),
    clips_table: str = typer.Option("video_clips", help="Clips table to drop."),
    pdfs_table: str | None = typer.Option(
        None, help="Also drop this PDFs table (e.g. 'pdfs')."
    ),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Skip the confirmation prompt."
    ),
) -> None:
    """Drop the video/clip tables (and their MV siblings)."""
    setup_logging(log_level)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    cfg = load_config(config, mode_override=mode, db_uri_override=db_uri)
    location = cfg.local_db_path if cfg.is_local else cfg.db_uri

    candidates = [
        videos_table,
        f"{videos_table}_mv",
        clips_table,
        f"{clips_table}_mv",
    ]
    if pdfs_table:
        candidates.append(pdfs_table)
    targets: list[str] = []
    for name in candidates:
        if name not in targets:
            targets.append(name)

    typer.echo(f"About to drop the following tables from {location}:")
    for name in targets:
        typer.echo(f"  - {name}")
    if not yes:
        typer.confirm("Proceed? This permanently deletes the tables.", abort=True)

    conn = connect(cfg)
    for name in targets:
        try:
            conn.drop_table(name)
            logger.info("dropped %s", name)
        except Exception:  # noqa: BLE001
            logger.info("skip_missing %s", name)

    logger.info("cleanup_ok")


def test_cleanup_cli_leaves_the_view_source_then_drops_it_on_a_second_run(clips_catalog, monkeypatch, caplog):
    """cleanup drops ``videos`` before ``video_clips``: the refusal (docs/geneva.md) is logged as
    the CLI's skip and ``videos`` stays; run again, it goes (Geneva drops both at once)."""
    _scoped_env(monkeypatch, "RAY_ENABLE_UV_RUN_RUNTIME_ENV")
    caplog.set_level(logging.INFO)
    c = clips_catalog
    code, out = _invoke(cleanup_app, ["--config", c.config, "-y"])
    assert code == 0 and "cleanup_ok" in caplog.messages and "dropped video_clips" in caplog.messages
    assert c.conn.table_names() == ["videos"]
    caplog.clear()
    code, out = _invoke(cleanup_app, ["--config", c.config, "-y"])
    assert code == 0 and "dropped videos" in caplog.messages
    assert c.conn.table_names() == []
