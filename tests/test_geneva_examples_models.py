"""Geneva's official examples that add model columns, run with only the import changed (inline
runner, real Lance files).

The programs are lancedb/geneva-examples'

- ``images/ingest.py`` (with ``core/utils/images.py``'s ``load_hf_image_batches``), then
  ``images/embed.py`` and ``images/caption.py``: a table's ``embedding`` (OpenCLIP, from
  ``examples/_shared/clip.py``) and ``caption_blip`` (BLIP, ``examples/_shared/blip.py``)
  columns, each a stateful batched UDF class (``setup()`` loads the model on the first call)
  added with ``add_columns`` and backfilled by ``core/backfill.py``'s ``backfill_column``
  (``reset=True``: each run drops the column and computes every row again); then the embed
  step's text-to-image search demo, and the caption step's local preview;
- ``video/frame_embed.py`` (the same CLIP UDF, ``reset=False``: incremental),
  ``video/frame_caption.py`` (BLIP) and ``video/frame_openpose.py`` (``video/openpose.py``'s
  controlnet_aux UDF) on the ``video_clips`` chunk view that ``video/chunk.py`` builds (run with
  ``tests/test_geneva_examples.py``'s copy of it: its stand-in chunker's ``frame`` is a clip's first
  byte);
- ``audio/ingest.py``, ``audio/synthesize.py`` (``audio/tts.py``'s MMS-TTS UDF, ``reset=False``) and
  ``audio/export.py`` (the WAV files). ``audio/transcribe.py`` is not run: it uses
  ``geneva.udfs.audio``, which mv_assets does not ship (docs/geneva.md).

Each is copied as written with ``import geneva`` -> ``import mv_assets as geneva``; the
``*_RUNTIME_PIP`` pin lists (read from installed versions with ``core/package_specs.py``) are empty
here: they only feed ``build_manifest``, which is None in local mode. The model and media
libraries are stand-in modules of the same calls installed in ``sys.modules`` (``torch`` with
``torch.utils.data``'s ``DataLoader`` / ``Dataset``, ``open_clip``, ``transformers``'
``BlipProcessor`` / ``BlipForConditionalGeneration`` / ``VitsTokenizer`` / ``VitsModel``,
``controlnet_aux.OpenposeDetector``, ``PIL.Image`` and ``datasets.load_dataset``), so the UDFs'
own code runs unchanged: the DataLoader batching, the null scatter, the normalization. Each
stand-in model is a small deterministic function of the image's pixels or the text, which the
tests compute again in plain Python to check every row. They count their loads
(``from_pretrained``, ``create_model_and_transforms``) and the rows they are given, so the tests
check that a model is set up once per process (not per batch), and that a second run after
adding rows computes only those rows where the example is incremental.

The helpers the examples import from ``core/`` are those of ``tests/test_geneva_examples.py``
(local mode; ``GenevaCompatWarning`` filtered). The second incremental ``frame-embed`` run is also
made in another process, as the CLI runs it (the view's stored UDF unpickled there).

All run on mv_assets unchanged. One defect found, now fixed: on ``InlineRunner(threads=2)`` the
tasks' threads share one UDF instance and called it at once from its first call, so the examples'
lazy ``if not self.is_loaded: self.setup()`` loaded the model once per thread, not once per process
(a stateful instance's first call now runs alone: model/udf.py).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import subprocess
import sys
import threading
import types
import uuid
import wave
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_geneva_examples import (
    OPT_STABLE_ROW_IDS,
    Config,
    backfill_column,
    build_manifest,
    connect,
    format_sample,
    inline_default,  # noqa: F401  (autouse: the examples run inline)
    local_or,
    resolve_resources,
    retry_io,
    run_video_chunk,
    runtime_session,
)

import mv_assets
from mv_assets.execution.spark import InlineRunner, set_default_runner

logger = logging.getLogger(__name__)




# -- the stand-ins -----------------------------------------------------------------------------------
#
# What the stand-ins were asked, by this process: model loads and rows (the UDFs run inline, so the
# stand-in modules in sys.modules are the ones their imports find).
CALLS: Counter[str] = Counter()

# PIL: a toy "PNG" holding its mode, size and raw pixels. Bytes without the magic decode as a one-row
# grayscale image of those bytes: the ``frame`` of tests/test_geneva_examples.py's stand-in chunker
# (a clip's first byte) is a 1x1 gray image.
_PNG_MAGIC = b"PNG~"
_BANDS = {"L": 1, "RGB": 3, "RGBA": 4}


def _png(mode: str, size: tuple[int, int], pixels: bytes) -> bytes:
    w, h = size
    assert len(pixels) == w * h * _BANDS[mode]
    return _PNG_MAGIC + mode.encode().ljust(4) + w.to_bytes(2, "big") + h.to_bytes(2, "big") + pixels


def _decode(raw: bytes) -> tuple[str, tuple[int, int], bytes]:
    if raw.startswith(_PNG_MAGIC):
        mode = raw[4:8].decode().strip()
        return mode, (int.from_bytes(raw[8:10], "big"), int.from_bytes(raw[10:12], "big")), raw[12:]
    if not raw:
        raise OSError("cannot identify image file")
    return "L", (len(raw), 1), raw


def _to_rgb(mode: str, pixels: bytes) -> bytes:
    if mode == "RGB":
        return pixels
    if mode == "L":
        return bytes(b for p in pixels for b in (p, p, p))
    assert mode == "RGBA"
    return b"".join(pixels[i : i + 3] for i in range(0, len(pixels), 4))


class _PilImage:
    """Stand-in for a PIL.Image.Image: mode, size, convert, save, copy, a context manager."""

    def __init__(self, mode: str, size: tuple[int, int], pixels: bytes) -> None:
        self.mode, self.size, self._pixels = mode, size, pixels

    def convert(self, mode: str) -> _PilImage:
        assert mode == "RGB"
        return _PilImage("RGB", self.size, _to_rgb(self.mode, self._pixels))

    def save(self, fp: Any, format: str | None = None, **params: Any) -> None:  # noqa: A002 (PIL's name)
        assert format == "PNG"
        fp.write(_png(self.mode, self.size, self._pixels))

    def copy(self) -> _PilImage:
        return _PilImage(self.mode, self.size, self._pixels)

    def tobytes(self) -> bytes:
        return self._pixels

    def __enter__(self) -> _PilImage:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _image_open(fp: Any, mode: str = "r", formats: Any = None) -> _PilImage:
    return _PilImage(*_decode(fp.read()))


# torch: a tensor over a NumPy array, with the calls the UDFs make.
class _Tensor:
    def __init__(self, a: Any) -> None:
        self.a = np.asarray(a)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    def to(self, *args: Any, **kwargs: Any) -> _Tensor:  # a device, a dtype or a memory format
        return self

    def float(self) -> _Tensor:
        return _Tensor(self.a.astype(np.float32))

    def cpu(self) -> _Tensor:
        return self

    def detach(self) -> _Tensor:
        return self

    def numpy(self) -> np.ndarray:
        return self.a

    def squeeze(self) -> _Tensor:
        return _Tensor(self.a.squeeze())

    def norm(self, dim: int | None = None, keepdim: bool = False) -> _Tensor:
        return _Tensor(np.linalg.norm(self.a, axis=dim, keepdims=keepdim).astype(self.a.dtype))

    def __truediv__(self, other: _Tensor) -> _Tensor:
        return _Tensor((self.a / other.a).astype(self.a.dtype))

    def __itruediv__(self, other: _Tensor) -> _Tensor:
        self.a = (self.a / other.a).astype(self.a.dtype)
        return self

    def __getitem__(self, i: Any) -> _Tensor:
        return _Tensor(self.a[i])

    def __len__(self) -> int:
        return len(self.a)

    def __iter__(self):
        return (_Tensor(row) for row in self.a)


class _Device:
    def __init__(self, type: str) -> None:  # noqa: A002 (torch's name)
        self.type = type

    def __str__(self) -> str:
        return self.type


class _Dataset:
    """torch.utils.data.Dataset."""


class _DataLoader:
    """torch.utils.data.DataLoader, in-process (num_workers=0, as local mode asks)."""

    def __init__(self, dataset: Any, batch_size: int = 1, num_workers: int = 0, pin_memory: bool = False,
                 collate_fn: Callable | None = None, prefetch_factor: int | None = None) -> None:
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.")
        assert num_workers == 0, "the stand-in loads in this process"
        self.dataset, self.batch_size, self.collate_fn = dataset, batch_size, collate_fn or list

    def __iter__(self):
        n = len(self.dataset)
        for i in range(0, n, self.batch_size):
            yield self.collate_fn([self.dataset[j] for j in range(i, min(i + self.batch_size, n))])


def _stack(tensors: list[_Tensor]) -> _Tensor:
    return _Tensor(np.stack([t.a for t in tensors]))


def _cat(tensors: list[_Tensor]) -> _Tensor:
    return _Tensor(np.concatenate([t.a for t in tensors]))


# open_clip: an "image tower" projecting a few pixel statistics onto CLIP_DIM dimensions.
CLIP_DIM = 512
_CLIP_FEATURES = 6


def _clip_weight(j: int, k: int) -> int:
    return (j * 31 + k * 17) % 11 + 1


_CLIP_W = np.array([[_clip_weight(j, k) for k in range(CLIP_DIM)] for j in range(_CLIP_FEATURES)], dtype=np.float32)


def _image_features(w: int, h: int, rgb: bytes) -> list[float]:
    n = w * h
    return [float(w), float(h), sum(rgb[0::3]) / n, sum(rgb[1::3]) / n, sum(rgb[2::3]) / n, 1.0]


def _text_features(text: str) -> list[float]:
    codes = [ord(c) for c in text]
    return [float(len(codes)), sum(codes) / len(codes), float(max(codes)), float(min(codes)), 1.0, 1.0]


def _clip_preprocess(img: _PilImage) -> _Tensor:
    assert img.mode == "RGB"
    w, h = img.size
    return _Tensor(np.array(_image_features(w, h, img.tobytes()), dtype=np.float32))


class _ClipModel:
    def __init__(self, model_name: str, pretrained: str) -> None:
        assert (model_name, pretrained) == ("ViT-B-32", "laion2b_s34b_b79k")

    def to(self, *args: Any, **kwargs: Any) -> _ClipModel:
        return self

    def eval(self) -> _ClipModel:
        return self

    def encode_image(self, batch: _Tensor) -> _Tensor:
        CALLS["clip.batches"] += 1
        CALLS["clip.rows"] += len(batch)
        return _Tensor(batch.a @ _CLIP_W)

    def encode_text(self, tokens: _Tensor) -> _Tensor:
        CALLS["clip.text"] += 1
        texts = ["".join(chr(c) for c in row if c) for row in tokens.a]
        return _Tensor(np.array([_text_features(t) for t in texts], dtype=np.float32) @ _CLIP_W)


def _create_model_and_transforms(model_name: str, pretrained: str | None = None, **kwargs: Any):
    CALLS["open_clip.load"] += 1
    return _ClipModel(model_name, pretrained or ""), None, _clip_preprocess


def _get_tokenizer(model_name: str):
    def tokenize(texts: list[str]) -> _Tensor:
        return _Tensor(np.array([[ord(c) for c in t][:77] + [0] * (77 - len(t)) for t in texts], dtype=np.int64))

    return tokenize


def _clip_vector(features: list[float]) -> list[float]:
    """The stand-in CLIP's unit vector, in plain Python."""
    v = [sum(f * _clip_weight(j, k) for j, f in enumerate(features)) for k in range(CLIP_DIM)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


# transformers' BLIP: "pixel_values" are the image's size and mean colour; "generate" writes a caption
# from them as character ids between BOS and EOS, padded (ids 0-2 are special tokens).
_PAD, _BOS, _EOS = 0, 1, 2


def _caption_text(w: int, h: int, r: float, g: float, b: float) -> str:
    colour = "gray" if r == g == b else ("red", "green", "blue")[[r, g, b].index(max(r, g, b))]
    return f"a {w}x{h} picture, mostly {colour}, level {round((r + g + b) / 3)}"


class _BlipFeature(dict):
    """transformers' BatchFeature: a dict whose keys are attributes too."""

    @property
    def pixel_values(self) -> _Tensor:
        return self["pixel_values"]


class _BlipProcessor:
    @classmethod
    def from_pretrained(cls, model_id: str) -> _BlipProcessor:
        assert model_id == "Salesforce/blip-image-captioning-base"
        CALLS["blip.processor.load"] += 1
        return cls()

    def __call__(self, images: Any, return_tensors: str | None = None) -> _BlipFeature:
        assert return_tensors == "pt"
        imgs = images if isinstance(images, list) else [images]
        rows = []
        for img in imgs:
            assert img.mode == "RGB"
            w, h = img.size
            rows.append(_image_features(w, h, img.tobytes())[:5])
        return _BlipFeature(pixel_values=_Tensor(np.array(rows, dtype=np.float32)))

    def decode(self, ids: _Tensor, skip_special_tokens: bool = False) -> str:
        assert skip_special_tokens
        return "".join(chr(int(i)) for i in ids.a if int(i) not in (_PAD, _BOS, _EOS))

    def batch_decode(self, ids: _Tensor, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in ids]


class _BlipModel:
    @classmethod
    def from_pretrained(cls, model_id: str) -> _BlipModel:
        assert model_id == "Salesforce/blip-image-captioning-base"
        CALLS["blip.model.load"] += 1
        return cls()

    def to(self, device: Any) -> _BlipModel:
        return self

    def eval(self) -> _BlipModel:
        return self

    def generate(self, pixel_values: _Tensor, *, max_new_tokens: int | None = None, max_length: int | None = None,
                 num_beams: int = 1, do_sample: bool = False, use_cache: bool = True) -> _Tensor:
        CALLS["blip.batches"] += 1
        CALLS["blip.rows"] += len(pixel_values)
        limit = max_new_tokens or max_length or 20
        seqs = []
        for w, h, r, g, b in pixel_values.a.tolist():
            text = _caption_text(int(w), int(h), r, g, b)
            seqs.append(([_BOS] + [ord(c) for c in text] + [_EOS])[:limit])
        width = max(len(s) for s in seqs)
        return _Tensor(np.array([s + [_PAD] * (width - len(s)) for s in seqs], dtype=np.int64))


def _blip_caption(w: int, h: int, rgb: bytes, max_length: int = 50) -> str:
    """The stand-in BLIP's caption, in plain Python (max_new_tokens counts BOS and EOS)."""
    n = w * h
    text = _caption_text(w, h, sum(rgb[0::3]) / n, sum(rgb[1::3]) / n, sum(rgb[2::3]) / n)
    return text[: max_length - 1]


# transformers' VITS (MMS-TTS): two samples per character, exact in float32.
TTS_RATE = 16_000


class _BatchEncoding(dict):
    def to(self, device: Any) -> _BatchEncoding:
        return self


class _VitsTokenizer:
    @classmethod
    def from_pretrained(cls, model_id: str) -> _VitsTokenizer:
        assert model_id == "facebook/mms-tts-eng"
        CALLS["vits.tokenizer.load"] += 1
        return cls()

    def __call__(self, text: str, return_tensors: str | None = None) -> _BatchEncoding:
        assert return_tensors == "pt"
        return _BatchEncoding(input_ids=_Tensor(np.array([[ord(c) for c in text]], dtype=np.int64)))


class _VitsModel:
    def __init__(self, sampling_rate: int) -> None:
        self.config = types.SimpleNamespace(sampling_rate=sampling_rate)

    @classmethod
    def from_pretrained(cls, model_id: str) -> _VitsModel:
        assert model_id == "facebook/mms-tts-eng"
        CALLS["vits.model.load"] += 1
        return cls(TTS_RATE)

    def to(self, device: Any) -> _VitsModel:
        return self

    def eval(self) -> _VitsModel:
        return self

    def __call__(self, input_ids: _Tensor) -> Any:
        CALLS["vits.rows"] += 1
        waves = [[s for c in row.tolist() for s in _samples(c)] for row in input_ids.a]
        return types.SimpleNamespace(waveform=_Tensor(np.array(waves, dtype=np.float32)))


def _samples(code: int) -> tuple[float, float]:
    s = ((code % 32) - 16) / 16
    return s, -s / 2


def _tts_waveform(text: str) -> list[float]:
    """The stand-in MMS-TTS's waveform, in plain Python."""
    return [s for c in text for s in _samples(ord(c))]


# controlnet_aux: a "pose" the inverse of the image (hands, face: a mark in the first pixel).
class _OpenposeDetector:
    @classmethod
    def from_pretrained(cls, repo: str) -> _OpenposeDetector:
        assert repo == "lllyasviel/Annotators"
        CALLS["openpose.load"] += 1
        return cls()

    def to(self, device: str) -> _OpenposeDetector:
        return self

    def __call__(self, img: _PilImage, include_hand: bool = False, include_face: bool = False,
                 output_type: str = "pil") -> _PilImage:
        assert output_type == "pil"
        CALLS["openpose.rows"] += 1
        return _PilImage("RGB", img.size, _pose_pixels(img.tobytes(), include_hand, include_face))


def _pose_pixels(rgb: bytes, hand: bool, face: bool) -> bytes:
    out = bytearray(255 - p for p in rgb)
    out[0] = (int(hand) << 1) | int(face)
    return bytes(out)


def _openpose_png(w: int, h: int, rgb: bytes) -> bytes:
    """The stand-in detector's pose PNG, in plain Python (hands and face included)."""
    return _png("RGB", (w, h), _pose_pixels(rgb, True, True))


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def _install_stand_ins(set_module: Callable[[str, types.ModuleType], None]) -> None:
    data = _module("torch.utils.data", DataLoader=_DataLoader, Dataset=_Dataset)
    utils = _module("torch.utils", data=data)
    backends = _module(
        "torch.backends",
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)),
        cudnn=types.SimpleNamespace(allow_tf32=False),
    )
    torch = _module(
        "torch", utils=utils, backends=backends, cuda=types.SimpleNamespace(is_available=lambda: False),
        set_float32_matmul_precision=lambda precision: None, device=_Device, stack=_stack, cat=_cat,
        inference_mode=nullcontext, no_grad=nullcontext,
        autocast=lambda device_type, dtype=None, enabled=True: nullcontext(),
        bfloat16="bfloat16", channels_last="channels_last", compile=lambda model: model,
    )
    image = _module("PIL.Image", open=_image_open, Image=_PilImage)
    modules = {
        "torch": torch, "torch.utils": utils, "torch.utils.data": data, "torch.backends": backends,
        "open_clip": _module("open_clip", create_model_and_transforms=_create_model_and_transforms,
                             get_tokenizer=_get_tokenizer),
        "transformers": _module("transformers", BlipProcessor=_BlipProcessor,
                                BlipForConditionalGeneration=_BlipModel, VitsTokenizer=_VitsTokenizer,
                                VitsModel=_VitsModel),
        "controlnet_aux": _module("controlnet_aux", OpenposeDetector=_OpenposeDetector),
        "PIL": _module("PIL", Image=image), "PIL.Image": image,
    }
    for name, mod in modules.items():
        set_module(name, mod)


@pytest.fixture
def model_stand_ins(monkeypatch):
    """The stand-in modules in ``sys.modules`` (what ``import torch`` etc. find, here and in the
    inline tasks), the examples' environment variables scoped to the test, ``CALLS`` cleared."""
    CALLS.clear()
    for name in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "HF_HOME"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _install_stand_ins(functools.partial(monkeypatch.setitem, sys.modules))


# -- geneva_examples/examples/_shared/clip.py, as written ---------------------------------------------

CLIP_RUNTIME_PIP: list[str] = []  # the pins: for remote workers only (build_manifest is None locally)


def build_clip_embedding_udf(
    *,
    input_column: str,
    manifest: Any,
    batch_size: int = 256,
    num_workers: int = 8,
    num_cpus: float = 4.0,
    num_gpus: float | None = 0.5,
    memory_bytes: int = 16 * 1024**3,
    checkpoint_size: int = 4096,
    task_size: int = 4096,
    model_name: str = "ViT-B-32",
    pretrained: str = "laion2b_s34b_b79k",
    dim: int = 512,
):
    """Build an OpenCLIP image-embedding UDF reading ``input_column``."""
    import pyarrow as pa

    import mv_assets as geneva

    _batch_size, _num_workers = int(batch_size), int(num_workers)
    _model_name, _pretrained, _dim = model_name, pretrained, int(dim)

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
    )
    class ClipEmbedding(Callable):  # pyright: ignore[reportGeneralTypeIssues]  (as written)
        def __init__(self):
            self.is_loaded = False
            self.logged = False
            self.batch_size = _batch_size
            self.num_workers = _num_workers
            self.model_name = _model_name
            self.pretrained = _pretrained
            self.dim = _dim

        def setup(self):
            import open_clip  # pyright: ignore[reportMissingImports]  (the stand-in)
            import torch  # pyright: ignore[reportMissingImports]

            torch.set_float32_matmul_precision("high")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                self.model_name, pretrained=self.pretrained
            )
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = self.model.to(self.device).eval()
            if self.device == "cuda":
                self.model = self.model.to(memory_format=torch.channels_last)
                # Compile the ViT forward pass; warmup cost amortizes over the
                # backfill. Fall back silently if the runtime can't compile.
                try:
                    self.model = torch.compile(self.model)
                except Exception as exc:  # noqa: BLE001
                    print("clip_compile_skip", type(exc).__name__, flush=True)
            self.is_loaded = True

        def __call__(self, col: pa.Array) -> pa.Array:
            # Runs in the remote Geneva runtime; print -> remote worker stdout.
            import io

            import numpy as np
            import torch  # pyright: ignore[reportMissingImports]
            from PIL import Image  # pyright: ignore[reportMissingImports]
            from torch.utils.data import DataLoader, Dataset  # pyright: ignore[reportMissingImports]

            if not self.is_loaded:
                self.setup()

            n = len(col)
            if not self.logged:
                print(
                    "clip_udf",
                    {
                        "device": self.device,
                        "cuda": torch.cuda.is_available(),
                        "rows": n,
                        "batch_size": self.batch_size,
                        "num_workers": self.num_workers,
                    },
                    flush=True,
                )
                self.logged = True

            if n == 0:
                return pa.FixedSizeListArray.from_arrays(
                    pa.array([], type=pa.float32()), self.dim
                )

            # `frame` can be null; embed only valid rows and emit null for the
            # rest (a fixed-size list can't be built from a ragged input).
            valid_positions = [i for i in range(n) if col[i].is_valid]
            if not valid_positions:
                return pa.array([None] * n, type=pa.list_(pa.float32(), self.dim))
            sub = col if len(valid_positions) == n else col.take(valid_positions)

            preprocess = self.preprocess

            class _Frames(Dataset):
                def __init__(self, arr):
                    self.arr = arr

                def __len__(self):
                    return len(self.arr)

                def __getitem__(self, i):  # ty: ignore[invalid-method-override]  # third-party stub gap
                    raw = self.arr[i].as_buffer().to_pybytes()
                    img = Image.open(io.BytesIO(raw)).convert("RGB")
                    return preprocess(img)

            loader_kwargs: dict[str, Any] = dict(
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                pin_memory=(self.device == "cuda"),
                collate_fn=torch.stack,
            )
            if self.num_workers > 0:
                # Prefetch upcoming batches in the worker procs so PIL decode +
                # preprocess overlaps GPU compute (needs batch_size < rows/call).
                loader_kwargs["prefetch_factor"] = 4
            loader = DataLoader(_Frames(sub), **loader_kwargs)

            chunks = []
            autocast = self.device == "cuda"
            with (
                torch.inference_mode(),
                torch.autocast(
                    device_type="cuda", dtype=torch.bfloat16, enabled=autocast
                ),
            ):
                for batch in loader:
                    batch = batch.to(self.device, non_blocking=True)
                    if self.device == "cuda":
                        batch = batch.to(memory_format=torch.channels_last)
                    emb = self.model.encode_image(batch)
                    emb = emb / emb.norm(dim=-1, keepdim=True)
                    # Keep on-GPU; one device->host copy after the loop instead
                    # of a per-batch sync.
                    chunks.append(emb.float())

            out = torch.cat(chunks).cpu().numpy().astype(np.float32)
            if len(valid_positions) == n:
                return pa.FixedSizeListArray.from_arrays(
                    pa.array(out.reshape(-1), type=pa.float32()), self.dim
                )
            # Scatter embeddings back into full-length output with nulls.
            rows: list[object] = [None] * n
            for k, pos in enumerate(valid_positions):
                rows[pos] = out[k].tolist()
            return pa.array(rows, type=pa.list_(pa.float32(), self.dim))

    return ClipEmbedding()


# -- geneva_examples/examples/_shared/blip.py, as written ---------------------------------------------

BLIP_RUNTIME_PIP: list[str] = []


def build_blip_caption_udf(
    *,
    input_column: str,
    manifest: Any,
    batch_size: int = 256,
    num_workers: int = 8,
    num_cpus: float = 4.0,
    num_gpus: float | None = 0.5,
    memory_bytes: int = 16 * 1024**3,
    checkpoint_size: int = 4096,
    task_size: int = 4096,
    model_id: str = "Salesforce/blip-image-captioning-base",
    max_length: int = 50,
):
    """Build a BLIP captioning UDF reading ``input_column`` -> string."""
    import pyarrow as pa

    import mv_assets as geneva

    _batch_size, _num_workers = int(batch_size), int(num_workers)
    _model_id, _max_length = model_id, int(max_length)

    @geneva.udf(
        data_type=pa.string(),
        input_columns=[input_column],
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        checkpoint_size=checkpoint_size,
        task_size=task_size,
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    class BlipCaption:
        def __init__(self):
            self.is_loaded = False
            self.logged = False
            self.batch_size = _batch_size
            self.num_workers = _num_workers
            self.model_id = _model_id
            self.max_length = _max_length

        def setup(self):
            import torch  # pyright: ignore[reportMissingImports]  (the stand-in)
            from transformers import (  # pyright: ignore[reportMissingImports]
                BlipForConditionalGeneration,
                BlipProcessor,
            )

            torch.set_float32_matmul_precision("high")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.processor = BlipProcessor.from_pretrained(self.model_id)
            self.model = BlipForConditionalGeneration.from_pretrained(self.model_id)
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.model.to(self.device).eval()  # ty: ignore[invalid-argument-type]  # third-party stub gap
            self.is_loaded = True

        def __call__(self, col: pa.Array) -> pa.Array:
            import io

            import torch  # pyright: ignore[reportMissingImports]
            from PIL import Image  # pyright: ignore[reportMissingImports]
            from torch.utils.data import DataLoader, Dataset  # pyright: ignore[reportMissingImports]

            if not self.is_loaded:
                self.setup()

            n = len(col)
            if not self.logged:
                print(
                    "blip_udf",
                    {
                        "device": str(self.device),
                        "rows": n,
                        "batch_size": self.batch_size,
                        "num_workers": self.num_workers,
                    },
                    flush=True,
                )
                self.logged = True

            if n == 0:
                return pa.array([], type=pa.string())

            # `frame` can be null; caption only valid rows, null for the rest.
            valid_positions = [i for i in range(n) if col[i].is_valid]
            if not valid_positions:
                return pa.array([None] * n, type=pa.string())
            sub = col if len(valid_positions) == n else col.take(valid_positions)

            processor = self.processor

            class _Frames(Dataset):
                def __init__(self, arr):
                    self.arr = arr

                def __len__(self):
                    return len(self.arr)

                def __getitem__(self, i):  # ty: ignore[invalid-method-override]  # third-party stub gap
                    raw = self.arr[i].as_buffer().to_pybytes()
                    img = Image.open(io.BytesIO(raw)).convert("RGB")
                    # Run the resize/normalize processor in the worker proc, not
                    # serially on the task's main thread. Captioning is
                    # unconditional, so pixel_values is the only model input.
                    return processor(img, return_tensors="pt").pixel_values[0]

            loader_kwargs: dict[str, Any] = dict(
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                pin_memory=(self.device.type == "cuda"),
                collate_fn=torch.stack,
            )
            if self.num_workers > 0:
                loader_kwargs["prefetch_factor"] = 4
            loader = DataLoader(_Frames(sub), **loader_kwargs)

            captions: list[str] = []
            autocast = self.device.type == "cuda"
            with (
                torch.inference_mode(),
                torch.autocast(
                    device_type="cuda", dtype=torch.bfloat16, enabled=autocast
                ),
            ):
                for pixel_values in loader:
                    pixel_values = pixel_values.to(self.device, non_blocking=True)
                    output_ids = self.model.generate(  # ty: ignore[missing-argument]  # third-party stub gap
                        pixel_values=pixel_values,
                        num_beams=1,
                        do_sample=False,
                        use_cache=True,
                        max_new_tokens=self.max_length,
                    )
                    captions.extend(
                        self.processor.batch_decode(
                            output_ids, skip_special_tokens=True
                        )
                    )

            if len(valid_positions) == n:
                return pa.array(captions, type=pa.string())
            # Scatter captions back into full-length output with nulls.
            rows: list[object] = [None] * n
            for k, pos in enumerate(valid_positions):
                rows[pos] = captions[k]
            return pa.array(rows, type=pa.string())

    return BlipCaption()


# -- geneva_examples/examples/video/openpose.py, as written -------------------------------------------

OPENPOSE_RUNTIME_PIP: list[str] = []


def build_openpose_udf(
    *,
    input_column: str,
    manifest: Any,
    batch_size: int = 256,
    num_workers: int = 4,
    num_cpus: float = 2.0,
    num_gpus: float | None = 0.25,
    memory_bytes: int = 16 * 1024**3,
    checkpoint_size: int = 4096,
    task_size: int = 4096,
    detector_repo: str = "lllyasviel/Annotators",
    include_hand: bool = True,
    include_face: bool = True,
):
    """Build a pose-skeleton UDF reading ``input_column`` -> PNG bytes."""
    import pyarrow as pa

    import mv_assets as geneva

    _batch_size, _num_workers = int(batch_size), int(num_workers)
    _repo, _hand, _face = detector_repo, bool(include_hand), bool(include_face)

    @geneva.udf(
        data_type=pa.large_binary(),
        input_columns=[input_column],
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        checkpoint_size=checkpoint_size,
        task_size=task_size,
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    class OpenPose:
        def __init__(self):
            self.is_loaded = False
            self.logged = False
            self.batch_size = _batch_size
            self.num_workers = _num_workers
            self.repo = _repo
            self.include_hand = _hand
            self.include_face = _face

        def setup(self):
            import torch  # pyright: ignore[reportMissingImports]  (the stand-in)

            # controlnet_aux ships no type stubs; import resolves on the worker.
            from controlnet_aux import OpenposeDetector  # pyright: ignore[reportMissingImports]

            self.detector = OpenposeDetector.from_pretrained(self.repo)
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            try:
                self.detector = self.detector.to(self.device)
            except Exception:  # noqa: BLE001
                pass
            self.is_loaded = True

        def __call__(self, col: pa.Array) -> pa.Array:
            import io

            from PIL import Image  # pyright: ignore[reportMissingImports]
            from torch.utils.data import DataLoader, Dataset  # pyright: ignore[reportMissingImports]

            if not self.is_loaded:
                self.setup()

            n = len(col)
            if not self.logged:
                print(
                    "openpose_udf",
                    {
                        "device": self.device,
                        "rows": n,
                        "batch_size": self.batch_size,
                        "num_workers": self.num_workers,
                        "repo": self.repo,
                    },
                    flush=True,
                )
                self.logged = True

            if n == 0:
                return pa.array([], type=pa.large_binary())

            class _Frames(Dataset):
                def __init__(self, arr):
                    self.arr = arr

                def __len__(self):
                    return len(self.arr)

                def __getitem__(self, i):  # ty: ignore[invalid-method-override]  # third-party stub gap
                    # `frame` can be null (chunker emits a row even when no
                    # start frame decoded); null/undecodable -> None -> null out.
                    scalar = self.arr[i]
                    if not scalar.is_valid:
                        return None
                    try:
                        raw = scalar.as_buffer().to_pybytes()
                        return Image.open(io.BytesIO(raw)).convert("RGB")
                    except Exception:  # noqa: BLE001
                        return None

            loader_kwargs: dict[str, Any] = dict(
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                collate_fn=list,
            )
            if self.num_workers > 0:
                # Decode/prefetch upcoming frames while the (per-image, serial)
                # detector runs the current batch.
                loader_kwargs["prefetch_factor"] = 4
            loader = DataLoader(_Frames(col), **loader_kwargs)

            out: list[bytes | None] = []
            for images in loader:
                for img in images:
                    if img is None:
                        out.append(None)
                        continue
                    try:
                        pose = self.detector(
                            img,
                            include_hand=self.include_hand,
                            include_face=self.include_face,
                            output_type="pil",
                        )
                        buf = io.BytesIO()
                        pose.save(buf, format="PNG")
                        out.append(buf.getvalue())
                    except Exception as exc:  # noqa: BLE001
                        print("openpose_error", type(exc).__name__, flush=True)
                        out.append(None)

            return pa.array(out, type=pa.large_binary())

    return OpenPose()


# -- geneva_examples/examples/audio/tts.py, as written -----------------------------------------------

MMS_TTS_SAMPLE_RATE = 16_000
MMS_TTS_MODEL_ID = os.environ.get("MMS_TTS_MODEL_ID", "facebook/mms-tts-eng")
MMS_TTS_RUNTIME_PIP: list[str] = []


def build_mms_tts_udf(
    *,
    text_column: str = "text",
    manifest: Any,
    num_cpus: float = 4.0,
    num_gpus: float | None = 0.5,
    memory_bytes: int = 4 * 1024**3,
    checkpoint_size: int = 32,
    task_size: int = 32,
    model_id: str = MMS_TTS_MODEL_ID,
):
    """Build an MMS-TTS UDF: ``text_column`` (string) -> ``list<float32>`` @ 16 kHz."""
    import pyarrow as pa

    import mv_assets as geneva

    _model_id = model_id

    @geneva.udf(
        data_type=pa.list_(pa.float32()),
        input_columns=[text_column],
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory_bytes,
        checkpoint_size=checkpoint_size,
        task_size=task_size,
        field_metadata={"sample_rate_hz": str(MMS_TTS_SAMPLE_RATE)},
        version=uuid.uuid4().hex,
        manifest=manifest,
    )
    class MmsTts(Callable):  # pyright: ignore[reportGeneralTypeIssues]  (as written)
        def __init__(self):
            self.is_loaded = False
            self.logged = False
            self.model_id = _model_id

        def setup(self):
            import torch  # pyright: ignore[reportMissingImports]  (the stand-in)
            from transformers import VitsModel, VitsTokenizer  # pyright: ignore[reportMissingImports]

            self.tokenizer = VitsTokenizer.from_pretrained(self.model_id)
            self.model = VitsModel.from_pretrained(self.model_id)
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            model = self.model.to(self.device)  # ty: ignore[invalid-argument-type]  # transformers .to() stub gap
            self.model = model.eval()
            rate = int(self.model.config.sampling_rate)
            if rate != MMS_TTS_SAMPLE_RATE:
                # Surface a mismatch loudly: the downstream Whisper stage assumes
                # 16 kHz samples, so a different rate would silently corrupt the
                # transcript. Callers can set MMS_TTS_MODEL_ID to a 16 kHz model.
                raise RuntimeError(
                    f"{self.model_id} emits {rate} Hz, expected "
                    f"{MMS_TTS_SAMPLE_RATE} Hz (downstream Whisper assumes 16 kHz)"
                )
            self.is_loaded = True

        def __call__(self, col: pa.Array) -> pa.Array:
            # Runs in the remote Geneva runtime; print -> remote worker stdout.
            import torch  # pyright: ignore[reportMissingImports]

            if not self.is_loaded:
                self.setup()

            n = len(col)
            if not self.logged:
                print(
                    "mms_tts_udf",
                    {"device": self.device, "rows": n, "model": self.model_id},
                    flush=True,
                )
                self.logged = True

            out_type = pa.list_(pa.float32())
            if n == 0:
                return pa.array([], type=out_type)

            rows: list[list[float] | None] = [None] * n
            with torch.inference_mode():
                for i in range(n):
                    scalar = col[i]
                    if not scalar.is_valid:
                        continue
                    text = scalar.as_py()
                    if not isinstance(text, str) or not text.strip():
                        continue
                    inputs = self.tokenizer(text=text, return_tensors="pt").to(
                        self.device
                    )
                    waveform = self.model(**inputs).waveform[0]
                    rows[i] = waveform.detach().to("cpu").float().numpy().tolist()

            return pa.array(rows, type=out_type)

    return MmsTts()


# -- images: ingest.py (with core/utils/images.py), embed.py, caption.py --------------------------------


def load_hf_image_batches(dataset_name: str, split: str, num_images: int, frag_size: int) -> list[pa.RecordBatch]:
    """core/utils/images.py, as written."""
    from datasets import load_dataset  # pyright: ignore[reportMissingImports]  (the stand-in)

    batches: list[pa.RecordBatch] = []
    batch = []
    dataset = load_dataset(dataset_name, split=f"{split}[:{num_images}]")
    for idx, row in enumerate(dataset):
        image = row["image"]
        buf = BytesIO()
        image.save(buf, format="PNG")
        out = {
            "image": buf.getvalue(),
            "label": row.get("label"),
            "image_id": row.get("image_id", idx),
            "label_cat_dog": row.get("label_cat_dog"),
        }
        batch.append(out)
        if len(batch) >= frag_size:
            batches.append(pa.RecordBatch.from_pylist(batch))
            batch = []
    if batch:
        batches.append(pa.RecordBatch.from_pylist(batch))
    return batches


def run_ingest_images(cfg: Config, *, table_name: str = "images", num_images: int = 75, frag_size: int = 25,
                      hf_dataset: str = "timm/oxford-iiit-pet", hf_split: str = "train", overwrite: bool = True,
                      table_write_retries: int = 5, table_write_retry_sleep_s: float = 2.0) -> None:
    """images/ingest.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("HF_HOME", "./huggingface_cache")

    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s", cfg.db_uri, table_name)
    logger.info("hf_dataset %s hf_split %s rows_target %s", hf_dataset, hf_split, num_images)

    conn = connect(cfg)

    image_batches = load_hf_image_batches(
        dataset_name=hf_dataset, split=hf_split, num_images=num_images, frag_size=frag_size,
    )
    if not image_batches:
        raise RuntimeError("no images loaded from Hugging Face dataset")

    if overwrite:
        try:
            conn.drop_table(table_name)
            logger.info("dropped_existing_table %s", table_name)
        except Exception:  # noqa: BLE001
            pass

    table = retry_io(
        "create_table",
        lambda: conn.create_table(
            table_name,
            data=image_batches[0],
            storage_options={OPT_STABLE_ROW_IDS: "true"},
        ),
        attempts=table_write_retries,
        sleep_s=table_write_retry_sleep_s,
    )
    total_batches = len(image_batches)
    for batch_index, batch in enumerate(image_batches[1:], start=2):
        retry_io(
            f"add_batch_{batch_index}",
            lambda batch=batch: table.add(batch),
            attempts=table_write_retries,
            sleep_s=table_write_retry_sleep_s,
        )
        if batch_index % 50 == 0 or batch_index == total_batches:
            logger.info("batches_loaded %d of %d", batch_index, total_batches)

    logger.info("rows_created %s", table.count_rows())
    try:
        logger.info("table_names %s", conn.table_names())
    except Exception:  # noqa: BLE001
        pass
    logger.info("initial_sample\n%s", format_sample(table.search().select(["image_id", "label"]).limit(5).to_list()))
    logger.info("ingest_images_ok")


def run_embed(cfg: Config, *, table_name: str = "images", query_text: str = "a golden retriever",
              batch_size: int = 1024, num_workers: int = 8, num_cpus: float = 8.0, num_gpus: float | None = None,
              memory_gib: int = 1, checkpoint_size: int = 1024, task_size: int = 1024, concurrency: int = 8,
              backfill_timeout_min: int = 1000, flush_interval_s: float = 30.0, schema_wait_attempts: int = 30,
              schema_wait_sleep_s: int = 2, search_demo: bool = True) -> list[dict]:
    """images/embed.py's run() (returns the search demo's rows, which the example logs)."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 1.0
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, 8, batch_size)
    num_workers = local_or(cfg, 0, num_workers)
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s", cfg.db_uri, table_name)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    manifest = build_manifest(cfg, "embed", CLIP_RUNTIME_PIP)
    udf = build_clip_embedding_udf(
        input_column="image", manifest=manifest, batch_size=batch_size, num_workers=num_workers,
        num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes, checkpoint_size=checkpoint_size,
        task_size=task_size,
    )
    with runtime_session(conn, cfg):
        table = backfill_column(
            conn=conn, table=table, table_name=table_name, column="embedding", udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
        )

    rows: list[dict] = []
    if search_demo:
        import open_clip  # pyright: ignore[reportMissingImports]  (the stand-in)
        import torch  # pyright: ignore[reportMissingImports]

        model, _, _ = open_clip.create_model_and_transforms("ViT-B-32", pretrained="laion2b_s34b_b79k")
        tokenizer = open_clip.get_tokenizer("ViT-B-32")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = model.to(device).eval()
        tokens = tokenizer([query_text]).to(device)
        with torch.no_grad():
            query_emb = model.encode_text(tokens)
            query_emb /= query_emb.norm(dim=-1, keepdim=True)
        query_vec = query_emb.squeeze().cpu().numpy().astype(float).tolist()
        rows = table.search(query_vec, "embedding").limit(5).to_list()
        logger.info("embedding_query %s matches %s", query_text, len(rows))
        logger.info("embedding_sample\n%s", format_sample(
            [{"image_id": r.get("image_id"), "label": r.get("label")} for r in rows[:5]]
        ))

    logger.info("embeddings_ok")
    return rows


def _local_caption_preview(table: Any, model_id: str) -> None:
    """images/caption.py: run BLIP locally on one image as a sanity check."""
    import torch  # pyright: ignore[reportMissingImports]  (the stand-in)
    from PIL import Image  # pyright: ignore[reportMissingImports]
    from transformers import BlipForConditionalGeneration, BlipProcessor  # pyright: ignore[reportMissingImports]

    row = table.search().select(["image"]).limit(1).to_list()
    if not row:
        return
    processor = BlipProcessor.from_pretrained(model_id)
    model = BlipForConditionalGeneration.from_pretrained(model_id)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)  # ty: ignore[invalid-argument-type]  # third-party stub gap
    img = Image.open(BytesIO(row[0]["image"])).convert("RGB")
    inputs = {k: v.to(device) for k, v in processor([img], return_tensors="pt").items()}
    out = model.generate(**inputs, max_length=50)
    logger.info("caption_local_preview %s", processor.decode(out[0], skip_special_tokens=True))


def run_caption(cfg: Config, *, table_name: str = "images", batch_size: int = 1024, num_workers: int = 8,
                num_cpus: float = 8.0, num_gpus: float | None = None, memory_gib: int = 1,
                checkpoint_size: int = 1024, task_size: int = 1024, concurrency: int = 8,
                backfill_timeout_min: int = 1000, flush_interval_s: float = 30.0, caption_local_preview: bool = False,
                schema_wait_attempts: int = 30, schema_wait_sleep_s: int = 2) -> None:
    """images/caption.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 1.0
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, 8, batch_size)
    num_workers = local_or(cfg, 0, num_workers)
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s", cfg.db_uri, table_name)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    if caption_local_preview:
        _local_caption_preview(table, "Salesforce/blip-image-captioning-base")

    manifest = build_manifest(cfg, "caption", BLIP_RUNTIME_PIP)
    udf = build_blip_caption_udf(
        input_column="image", manifest=manifest, batch_size=batch_size, num_workers=num_workers,
        num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes, checkpoint_size=checkpoint_size,
        task_size=task_size,
    )
    with runtime_session(conn, cfg):
        table = backfill_column(
            conn=conn, table=table, table_name=table_name, column="caption_blip", udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
        )

    logger.info("caption_sample\n%s", format_sample(table.search().select(["image_id", "caption_blip"]).limit(5).to_list()))
    logger.info("captions_ok")


# -- the images tests --------------------------------------------------------------------------------


def _pet(i: int) -> dict[str, Any]:
    """Row ``i`` of the stand-in oxford-iiit-pet split: a small image (every third one grayscale)."""
    w, h = 2 + i % 4, 1 + i % 3
    if i % 3 == 2:
        mode, pixels = "L", bytes((i * 37 + k * 11) % 256 for k in range(w * h))
    else:
        mode, pixels = "RGB", bytes((i * 53 + k * (5 + i)) % 256 for k in range(3 * w * h))
    return {"image": _PilImage(mode, (w, h), pixels), "label": i % 5, "image_id": f"pet_{i:03d}",
            "label_cat_dog": i % 2}


def _load_dataset(name: str, split: str) -> list[dict[str, Any]]:
    """Stand-in for datasets.load_dataset: ``split`` is ``train[:N]``."""
    assert name == "timm/oxford-iiit-pet" and split.startswith("train[:")
    return [_pet(i) for i in range(int(split[len("train[:") : -1]))]


def _rgb_of(png: bytes) -> tuple[int, int, bytes]:
    mode, (w, h), pixels = _decode(png)
    return w, h, _to_rgb(mode, pixels)


def _expected_embedding(png: bytes | None) -> list[float] | None:
    return None if png is None else _clip_vector(_image_features(*_rgb_of(png)))


def _expected_caption(png: bytes | None) -> str | None:
    return None if png is None else _blip_caption(*_rgb_of(png))


def _close(a: list[float] | None, b: list[float] | None, tol: float = 1e-6) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(abs(x - y) < tol for x, y in zip(a, b, strict=True))


@pytest.fixture
def images_catalog(tmp_path, monkeypatch, model_stand_ins):
    """The images table ``images/ingest.py`` makes, from the stand-in dataset (10 images, 3 fragments)."""
    monkeypatch.setitem(sys.modules, "datasets", _module("datasets", load_dataset=_load_dataset))
    cfg = Config(local_db_path=str(tmp_path / "db"))
    run_ingest_images(cfg, num_images=10, frag_size=4)
    return cfg


def test_images_ingest_writes_the_dataset_as_png_rows(images_catalog):
    rows = connect(images_catalog).open_table("images").to_arrow()
    assert rows.schema.names == ["image", "label", "image_id", "label_cat_dog"]
    got = sorted(rows.to_pylist(), key=lambda r: r["image_id"])
    want = [_pet(i) for i in range(10)]
    assert [(r["image_id"], r["label"], r["label_cat_dog"]) for r in got] == [
        (w["image_id"], w["label"], w["label_cat_dog"]) for w in want
    ]
    assert [r["image"] for r in got] == [_png(w["image"].mode, w["image"].size, w["image"].tobytes()) for w in want]


def test_images_embed_example_backfills_clip_embeddings_and_searches_them(images_catalog, caplog):
    caplog.set_level(logging.INFO)
    cfg = images_catalog
    conn = connect(cfg)
    hits = run_embed(cfg, checkpoint_size=3, task_size=4)

    table = conn.open_table("images")
    got = {r["image_id"]: r for r in table.to_arrow().to_pylist()}
    assert len(got) == 10
    assert all(_close(r["embedding"], _expected_embedding(r["image"])) for r in got.values())
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), CLIP_DIM)
    # one model for the backfill (not one per batch: the rows came in several), one for the search demo
    assert CALLS["open_clip.load"] == 2 and CALLS["clip.rows"] == 10 and CALLS["clip.batches"] >= 3
    # the search demo: the 5 images nearest (L2) to the query's text embedding, nearest first
    q = _clip_vector(_text_features("a golden retriever"))
    ranked = sorted((sum((x - y) ** 2 for x, y in zip(r["embedding"], q, strict=True)), i) for i, r in got.items())
    assert [h["image_id"] for h in hits] == [i for _, i in ranked[:5]]
    assert "embeddings_ok" in caplog.messages and "null_embedding 0" in caplog.messages

    # a second run after adding rows (one without an image): reset=True drops the column and embeds
    # every row again, with the new UDF's model (one more load)
    CALLS.clear()
    table.add([{"image": _png("RGB", (2, 2), bytes(range(40, 52))), "label": 1, "image_id": "new_a",
                "label_cat_dog": 0},
               {"image": None, "label": 2, "image_id": "new_b", "label_cat_dog": 1}])
    run_embed(cfg, checkpoint_size=3, task_size=4, search_demo=False)
    got = {r["image_id"]: r for r in conn.open_table("images").to_arrow().to_pylist()}
    assert len(got) == 12 and got["new_b"]["embedding"] is None
    assert all(_close(r["embedding"], _expected_embedding(r["image"])) for r in got.values())
    assert CALLS["open_clip.load"] == 1 and CALLS["clip.rows"] == 11
    assert "null_embedding 1" in caplog.messages

    # the column's own backfill (Geneva's incremental call) after more rows: only those are embedded,
    # by the model this process already set up
    CALLS.clear()
    table = conn.open_table("images")
    table.add([{"image": _png("L", (3, 1), b"\x10\x80\xf0"), "label": 3, "image_id": "new_c", "label_cat_dog": 1}])
    table.backfill("embedding")
    got = {r["image_id"]: r for r in conn.open_table("images").to_arrow().to_pylist()}
    assert len(got) == 13 and all(_close(r["embedding"], _expected_embedding(r["image"])) for r in got.values())
    assert CALLS["clip.rows"] == 1 and CALLS["open_clip.load"] == 0


def test_images_embed_example_on_threads_sets_its_model_up_once(images_catalog):
    """The threaded inline runner (docs: "its set-up still runs once") with the example's lazy set-up.
    The stand-in load waits (up to 2 s) for a second load to start: it does only when the first calls
    of the instance overlap."""
    loading = threading.Condition()
    started = [0]
    load = _create_model_and_transforms

    def slow_load(*args: Any, **kwargs: Any):
        with loading:
            started[0] += 1
            loading.notify_all()
            loading.wait_for(lambda: started[0] >= 2, timeout=2.0)  # another thread loading too?
        return load(*args, **kwargs)

    open_clip = sys.modules["open_clip"]
    open_clip.create_model_and_transforms = slow_load  # type: ignore[attr-defined]  (the fixture's module)
    set_default_runner(InlineRunner(threads=2))
    run_embed(images_catalog, checkpoint_size=3, task_size=4, search_demo=False)

    got = connect(images_catalog).open_table("images").to_arrow().to_pylist()
    assert all(_close(r["embedding"], _expected_embedding(r["image"])) for r in got)
    assert CALLS["clip.rows"] == 10
    assert CALLS["open_clip.load"] == 1


def test_images_caption_example_backfills_blip_captions_beside_the_embeddings(images_catalog, caplog):
    """As the images pipeline runs: embed, then caption (with its local preview) on the same table."""
    caplog.set_level(logging.INFO)
    cfg = images_catalog
    conn = connect(cfg)
    run_embed(cfg, checkpoint_size=3, task_size=4, search_demo=False)
    run_caption(cfg, checkpoint_size=3, task_size=4, caption_local_preview=True)

    got = {r["image_id"]: r for r in conn.open_table("images").to_arrow().to_pylist()}
    assert {i: r["caption_blip"] for i, r in got.items()} == {i: _expected_caption(r["image"]) for i, r in got.items()}
    assert all(_close(r["embedding"], _expected_embedding(r["image"])) for r in got.values())
    # the preview loads BLIP on the driver; the UDF once for all its batches
    assert CALLS["blip.processor.load"] == 2 and CALLS["blip.model.load"] == 2
    assert CALLS["blip.rows"] == 10 + 1 and CALLS["blip.batches"] >= 1 + 3
    first = conn.open_table("images").search().select(["image"]).limit(1).to_list()[0]["image"]
    assert f"caption_local_preview {_expected_caption(first)}" in caplog.messages
    assert "captions_ok" in caplog.messages

    # a second run after adding rows: reset=True captions every row again (a new model); the embedding
    # column is left as it was (the new rows wait for the next embed)
    CALLS.clear()
    conn.open_table("images").add([
        {"image": _png("RGBA", (1, 2), bytes([200, 10, 10, 0, 190, 20, 5, 255])), "label": 0, "image_id": "new_a",
         "label_cat_dog": 0},
        {"image": None, "label": 0, "image_id": "new_b", "label_cat_dog": 0},
    ])
    run_caption(cfg, checkpoint_size=3, task_size=4)
    got = {r["image_id"]: r for r in conn.open_table("images").to_arrow().to_pylist()}
    assert {i: r["caption_blip"] for i, r in got.items()} == {i: _expected_caption(r["image"]) for i, r in got.items()}
    assert got["new_a"]["caption_blip"] == "a 1x2 picture, mostly red, level 72"
    assert CALLS["blip.model.load"] == 1 and CALLS["blip.rows"] == 11 and CALLS["clip.rows"] == 0
    assert {i: r["embedding"] is None for i, r in got.items()} == {i: i.startswith("new_") for i in got}
    assert all(_close(r["embedding"], _expected_embedding(r["image"])) for i, r in got.items() if r["embedding"])


# -- video: frame_embed.py, frame_caption.py, frame_openpose.py on the clips view --------------------------


def run_frame_embed(cfg: Config, *, table_name: str = "video_clips", input_column: str = "frame",
                    output_column: str = "embedding", model_name: str = "ViT-B-32",
                    pretrained: str = "laion2b_s34b_b79k", dim: int = 512, batch_size: int = 256,
                    num_workers: int = 12, num_cpus: float = 4.0, num_gpus: float | None = None,
                    memory_gib: int = 1, checkpoint_size: int = 65536, task_size: int = 65536,
                    concurrency: int = 16, backfill_timeout_min: int = 1000, flush_interval_s: float = 30.0,
                    schema_wait_attempts: int = 30, schema_wait_sleep_s: int = 2, reset: bool = False) -> None:
    """video/frame_embed.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 0.5
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, 8, batch_size)
    num_workers = local_or(cfg, 0, num_workers)
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s column %s", cfg.db_uri, table_name, input_column)
    logger.info("model %s pretrained %s dim %s batch_size %s num_workers %s num_gpus %s",
                model_name, pretrained, dim, batch_size, num_workers, resolved_gpus)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    manifest = build_manifest(cfg, "frame-embed", CLIP_RUNTIME_PIP)
    udf = build_clip_embedding_udf(
        input_column=input_column, manifest=manifest, batch_size=batch_size, num_workers=num_workers,
        num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes, checkpoint_size=checkpoint_size,
        task_size=task_size, model_name=model_name, pretrained=pretrained, dim=dim,
    )
    with runtime_session(conn, cfg):
        backfill_column(
            conn=conn, table=table, table_name=table_name, column=output_column, udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
            reset=reset,
        )
    logger.info("frame_embed_ok")


def run_frame_caption(cfg: Config, *, table_name: str = "video_clips", input_column: str = "frame",
                      output_column: str = "caption", batch_size: int = 256, num_workers: int = 8,
                      num_cpus: float = 4.0, num_gpus: float | None = None, memory_gib: int = 1,
                      checkpoint_size: int = 4096, task_size: int = 4096, concurrency: int = 16,
                      backfill_timeout_min: int = 1000, flush_interval_s: float = 30.0, schema_wait_attempts: int = 30,
                      schema_wait_sleep_s: int = 2) -> None:
    """video/frame_caption.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 0.5
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, 8, batch_size)
    num_workers = local_or(cfg, 0, num_workers)
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s column %s", cfg.db_uri, table_name, input_column)
    logger.info("batch_size %s num_workers %s num_gpus %s", batch_size, num_workers, resolved_gpus)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    manifest = build_manifest(cfg, "frame-caption", BLIP_RUNTIME_PIP)
    udf = build_blip_caption_udf(
        input_column=input_column, manifest=manifest, batch_size=batch_size, num_workers=num_workers,
        num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes, checkpoint_size=checkpoint_size,
        task_size=task_size,
    )
    with runtime_session(conn, cfg):
        table = backfill_column(
            conn=conn, table=table, table_name=table_name, column=output_column, udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
        )
    logger.info("caption_sample\n%s", format_sample(
        table.search().select(["video_id", "chunk_id", output_column]).limit(5).to_list()
    ))
    logger.info("frame_caption_ok")


def run_frame_openpose(cfg: Config, *, table_name: str = "video_clips", input_column: str = "frame",
                       output_column: str = "pose", include_hand: bool = True, include_face: bool = True,
                       batch_size: int = 256, num_workers: int = 4, num_cpus: float = 2.0,
                       num_gpus: float | None = None, memory_gib: int = 1, checkpoint_size: int = 4096,
                       task_size: int = 4096, concurrency: int = 32, backfill_timeout_min: int = 1000,
                       flush_interval_s: float = 30.0, schema_wait_attempts: int = 30,
                       schema_wait_sleep_s: int = 2) -> None:
    """video/frame_openpose.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 0.25
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    batch_size = local_or(cfg, 8, batch_size)
    num_workers = local_or(cfg, 0, num_workers)
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s column %s", cfg.db_uri, table_name, input_column)
    logger.info("batch_size %s num_workers %s num_gpus %s", batch_size, num_workers, resolved_gpus)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    manifest = build_manifest(cfg, "frame-openpose", OPENPOSE_RUNTIME_PIP)
    udf = build_openpose_udf(
        input_column=input_column, manifest=manifest, batch_size=batch_size, num_workers=num_workers,
        num_cpus=num_cpus, num_gpus=resolved_gpus, memory_bytes=memory_bytes, checkpoint_size=checkpoint_size,
        task_size=task_size, include_hand=include_hand, include_face=include_face,
    )
    with runtime_session(conn, cfg):
        backfill_column(
            conn=conn, table=table, table_name=table_name, column=output_column, udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
        )
    logger.info("frame_openpose_ok")


def _toy_video(video_no: int, duration: float) -> bytes:
    """A video in the format of tests/test_geneva_examples.py's stand-in chunker (its duration, then
    one byte per tenth of a second), with distinct bytes: each clip's ``frame`` is its first one."""
    return f"{duration:.1f}|".encode() + bytes((video_no * 41 + i * 3 + 1) % 256 for i in range(int(duration * 10)))


def _expected_clip_frames(videos: dict[int, float]) -> dict[tuple[int, int], bytes]:
    """(video_id, chunk_id) -> frame, as the stand-in chunker cuts 10 s clips."""
    out = {}
    for v, d in videos.items():
        payload = _toy_video(v, d).split(b"|", 1)[1]
        for cid, start in enumerate(range(0, math.ceil(d / 10) * 10, 10)):
            out[(v, cid)] = payload[start * 10 : start * 10 + 1]
    return out


@pytest.fixture
def clips_catalog(tmp_path, model_stand_ins):
    """The ``video_clips`` chunk view ``video/chunk.py`` builds over three videos (8 clips of 10 s)."""
    cfg = Config(local_db_path=str(tmp_path / "db"))
    videos = {1: 25.0, 2: 8.0, 3: 31.0}
    connect(cfg).create_table("videos", data=[{"video_id": v, "video": _toy_video(v, d)} for v, d in videos.items()],
                              storage_options={OPT_STABLE_ROW_IDS: "true"})
    run_video_chunk(cfg, source_task_size=2)
    frames = _expected_clip_frames(videos)
    assert {(r["video_id"], r["chunk_id"]): r["frame"] for r in connect(cfg).open_table("video_clips").to_arrow()
            .to_pylist()} == frames
    return types.SimpleNamespace(cfg=cfg, videos=videos)


def _clip_values(cfg: Config, column: str) -> dict[tuple[int, int], Any]:
    return {(r["video_id"], r["chunk_id"]): r[column] for r in
            connect(cfg).open_table("video_clips").to_arrow().to_pylist()}


def _add_video_and_refresh(c: types.SimpleNamespace, video_id: int, duration: float) -> int:
    """A new video, and the clips view's refresh (what chunk.py's stable row ids are for)."""
    conn = connect(c.cfg)
    conn.open_table("videos").add([{"video_id": video_id, "video": _toy_video(video_id, duration)}])
    c.videos[video_id] = duration
    result = conn.open_table("video_clips").refresh()
    assert result.rows_inserted == 1  # one parent chunked
    return len(_expected_clip_frames({video_id: duration}))


def test_frame_embed_example_embeds_each_clip_frame_then_only_new_clips(clips_catalog, caplog):
    caplog.set_level(logging.INFO)
    c = clips_catalog
    run_frame_embed(c.cfg, checkpoint_size=2, task_size=3)

    frames = _expected_clip_frames(c.videos)
    got = _clip_values(c.cfg, "embedding")
    assert got.keys() == frames.keys()
    assert all(_close(got[k], _expected_embedding(f)) for k, f in frames.items())
    assert CALLS["open_clip.load"] == 1 and CALLS["clip.rows"] == len(frames) == 8 and CALLS["clip.batches"] >= 3
    assert "frame_embed_ok" in caplog.messages and "null_embedding 0" in caplog.messages

    # incremental (reset=False): a new video's clips, then the example again: only they are embedded,
    # by the column's UDF, whose model this process already set up
    CALLS.clear()
    new = _add_video_and_refresh(c, 4, 19.0)
    run_frame_embed(c.cfg, checkpoint_size=2, task_size=3)
    frames = _expected_clip_frames(c.videos)
    got = _clip_values(c.cfg, "embedding")
    assert got.keys() == frames.keys()
    assert all(_close(got[k], _expected_embedding(f)) for k, f in frames.items())
    assert CALLS["clip.rows"] == new == 2 and CALLS["open_clip.load"] == 0

    # and again with nothing new: nothing is embedded
    CALLS.clear()
    run_frame_embed(c.cfg, checkpoint_size=2, task_size=3)
    assert CALLS["clip.rows"] == 0

    # as the CLI runs it: another video, then frame-embed in a new process (the view's stored UDF,
    # unpickled there: one model load, the new clips only)
    new = _add_video_and_refresh(c, 5, 28.0)
    calls = _run_frame_embed_in_another_process(c.cfg)
    frames = _expected_clip_frames(c.videos)
    got = _clip_values(c.cfg, "embedding")
    assert got.keys() == frames.keys()
    assert all(_close(got[k], _expected_embedding(f)) for k, f in frames.items())
    assert calls["clip.rows"] == new == 3 and calls["open_clip.load"] == 1


_SUBPROCESS = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import test_geneva_examples_models as m
import mv_assets
from mv_assets.execution.spark import InlineRunner, set_default_runner
set_default_runner(InlineRunner())
warnings.simplefilter("ignore")
m._install_stand_ins(sys.modules.__setitem__)
m.run_frame_embed(m.Config(local_db_path=sys.argv[2]), checkpoint_size=2, task_size=3)
print("CALLS=" + json.dumps(dict(m.CALLS)))
"""


def _run_frame_embed_in_another_process(cfg: Config) -> Counter[str]:
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS, str(Path(__file__).parent), cfg.local_db_path],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "LANCE_LOG": "error"})
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("CALLS="))
    return Counter(json.loads(line[len("CALLS="):]))


def test_frame_caption_example_captions_each_clip_frame_beside_embeddings_and_poses(clips_catalog, caplog):
    """As the video pipeline runs: frame-embed, frame-openpose, then frame-caption on the same clips view;
    then a new video, the view's refresh, and the three again."""
    caplog.set_level(logging.INFO)
    c = clips_catalog
    run_frame_embed(c.cfg, checkpoint_size=2, task_size=3)
    run_frame_openpose(c.cfg, checkpoint_size=2, task_size=3)
    run_frame_caption(c.cfg, checkpoint_size=2, task_size=3)

    def check(frames: dict[tuple[int, int], bytes]) -> None:
        assert _clip_values(c.cfg, "caption") == {k: _expected_caption(f) for k, f in frames.items()}
        assert _clip_values(c.cfg, "pose") == {k: _openpose_png(*_rgb_of(f)) for k, f in frames.items()}
        embeddings = _clip_values(c.cfg, "embedding")
        assert embeddings.keys() == frames.keys()
        assert all(_close(embeddings[k], _expected_embedding(f)) for k, f in frames.items())

    frames = _expected_clip_frames(c.videos)
    check(frames)
    assert CALLS["blip.model.load"] == 1 and CALLS["blip.rows"] == len(frames) and CALLS["blip.batches"] >= 3
    assert "frame_caption_ok" in caplog.messages

    # a new video's clips: frame-caption again (it resets: every clip is captioned again, by a new model);
    # the new clips' embeddings and poses wait for their steps
    CALLS.clear()
    new = _add_video_and_refresh(c, 4, 12.0)
    run_frame_caption(c.cfg, checkpoint_size=2, task_size=3)
    frames = _expected_clip_frames(c.videos)
    assert _clip_values(c.cfg, "caption") == {k: _expected_caption(f) for k, f in frames.items()}
    assert CALLS["blip.model.load"] == 1 and CALLS["blip.rows"] == len(frames) == 10
    assert {k for k, v in _clip_values(c.cfg, "embedding").items() if v is None} == {(4, 0), (4, 1)}
    assert {k for k, v in _clip_values(c.cfg, "pose").items() if v is None} == {(4, 0), (4, 1)}
    run_frame_embed(c.cfg, checkpoint_size=2, task_size=3)  # incremental: the new clips only
    run_frame_openpose(c.cfg, checkpoint_size=2, task_size=3)  # resets: every clip again
    check(frames)
    assert CALLS["clip.rows"] == new == 2 and CALLS["openpose.rows"] == len(frames)
    assert CALLS["open_clip.load"] == 0 and CALLS["openpose.load"] == 1


def test_frame_openpose_example_draws_a_pose_per_clip_frame(clips_catalog, caplog):
    caplog.set_level(logging.INFO)
    c = clips_catalog
    run_frame_openpose(c.cfg, checkpoint_size=2, task_size=3)

    frames = _expected_clip_frames(c.videos)
    assert _clip_values(c.cfg, "pose") == {k: _openpose_png(*_rgb_of(f)) for k, f in frames.items()}
    view = connect(c.cfg).open_table("video_clips")
    assert view.schema.field("pose").type == pa.large_binary()
    assert CALLS["openpose.load"] == 1 and CALLS["openpose.rows"] == len(frames)
    assert "frame_openpose_ok" in caplog.messages


# -- audio: ingest.py, synthesize.py (with tts.py), export.py -----------------------------------------

PROMPTS: list[tuple[str, str]] = [
    ("greeting", "Hello, and welcome to the Geneva audio pipeline."),
    ("pangram", "The quick brown fox jumps over the lazy dog."),
    ("weather", "Today the sky is clear and the wind is calm."),
    ("numbers", "One, two, three, four, five, six, seven, eight, nine, ten."),
    ("cantina", "This speech was synthesized and then transcribed back to text."),
]


def run_ingest_audio(cfg: Config, *, table_name: str = "audio", frag_size: int = 1, overwrite: bool = True,
                     table_write_retries: int = 5, table_write_retry_sleep_s: float = 2.0) -> None:
    """audio/ingest.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s", cfg.db_uri, table_name)
    logger.info("prompts %s", [pid for pid, _ in PROMPTS])

    conn = connect(cfg)

    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    batches = [
        pa.record_batch(
            {
                "id": [pid for pid, _ in PROMPTS[i : i + frag_size]],
                "text": [text for _, text in PROMPTS[i : i + frag_size]],
            },
            schema=schema,
        )
        for i in range(0, len(PROMPTS), max(1, frag_size))
    ]
    if not batches:
        raise RuntimeError("no prompts to ingest")

    if overwrite:
        try:
            conn.drop_table(table_name)
            logger.info("dropped_existing_table %s", table_name)
        except Exception:  # noqa: BLE001
            pass

    table = retry_io(
        "create_table",
        lambda: conn.create_table(
            table_name,
            data=batches[0],
            storage_options={OPT_STABLE_ROW_IDS: "true"},
        ),
        attempts=table_write_retries,
        sleep_s=table_write_retry_sleep_s,
    )
    for batch_index, batch in enumerate(batches[1:], start=2):
        retry_io(
            f"add_batch_{batch_index}",
            lambda batch=batch: table.add(batch),
            attempts=table_write_retries,
            sleep_s=table_write_retry_sleep_s,
        )

    logger.info("rows_created %s", table.count_rows())
    try:
        logger.info("table_names %s", conn.table_names())
    except Exception:  # noqa: BLE001
        pass
    logger.info("initial_sample\n%s", format_sample(table.search().select(["id", "text"]).limit(5).to_list()))
    logger.info("ingest_audio_ok")


def run_synthesize(cfg: Config, *, table_name: str = "audio", input_column: str = "text",
                   output_column: str = "audio", num_cpus: float = 4.0, num_gpus: float | None = None,
                   memory_gib: int = 4, checkpoint_size: int = 32, task_size: int = 32, concurrency: int = 16,
                   backfill_timeout_min: int = 1000, flush_interval_s: float = 30.0, schema_wait_attempts: int = 30,
                   schema_wait_sleep_s: int = 2, reset: bool = False) -> None:
    """audio/synthesize.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("HF_HOME", "./huggingface_cache")

    import mv_assets as geneva

    resolved_gpus = num_gpus if num_gpus is not None else 0.5
    num_cpus, resolved_gpus, memory_bytes = resolve_resources(
        cfg, num_cpus=num_cpus, num_gpus=resolved_gpus, memory_gib=memory_gib
    )
    concurrency = local_or(cfg, 1, concurrency)

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s column %s", cfg.db_uri, table_name, input_column)
    logger.info("num_cpus %s num_gpus %s", num_cpus, resolved_gpus)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    manifest = build_manifest(cfg, "audio-tts", MMS_TTS_RUNTIME_PIP)
    udf = build_mms_tts_udf(
        text_column=input_column, manifest=manifest, num_cpus=num_cpus, num_gpus=resolved_gpus,
        memory_bytes=memory_bytes, checkpoint_size=checkpoint_size, task_size=task_size,
    )
    with runtime_session(conn, cfg):
        backfill_column(
            conn=conn, table=table, table_name=table_name, column=output_column, udf=udf, concurrency=concurrency,
            task_size=task_size, checkpoint_size=checkpoint_size, flush_interval_s=flush_interval_s,
            timeout_min=backfill_timeout_min, wait_attempts=schema_wait_attempts, wait_sleep_s=schema_wait_sleep_s,
            reset=reset,
        )
    logger.info("synthesize_audio_ok")


def _write_wav(path: Path, samples: list[float], sample_rate: int) -> None:
    """audio/export.py: write float samples in [-1, 1] as a mono 16-bit PCM WAV at ``sample_rate``."""
    import numpy as np

    arr = np.asarray(samples, dtype=np.float32)
    # Clip to guard against any out-of-range values, then scale to int16.
    arr = np.clip(arr, -1.0, 1.0)
    pcm = (arr * 32767.0).astype(np.int16)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)  # 16-bit
        wav.setframerate(sample_rate)
        wav.writeframes(pcm.tobytes())


def run_export(cfg: Config, *, table_name: str = "audio", audio_column: str = "audio", id_column: str = "id",
               out_dir: str = "/tmp/geneva_audio", sample_rate: int = 16_000, limit: int = 0) -> None:
    """audio/export.py's run()."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

    import mv_assets as geneva

    logger.info("geneva_version %s mode %s", geneva.__version__, cfg.mode)
    logger.info("db_uri %s table %s out_dir %s", cfg.db_uri, table_name, out_dir)

    conn = connect(cfg)
    table = conn.open_table(table_name)

    if audio_column not in set(table.schema.names):
        raise RuntimeError(f"table {table_name!r} has no {audio_column!r} column — run the synthesize step first")

    out_path = Path(out_dir).expanduser()
    out_path.mkdir(parents=True, exist_ok=True)

    query = table.search().select([id_column, audio_column])
    if limit and limit > 0:
        query = query.limit(limit)
    rows = query.to_list()

    written = 0
    skipped = 0
    for row in rows:
        samples = row.get(audio_column)
        if not samples:
            skipped += 1
            continue
        row_id = str(row.get(id_column) or f"row-{written}")
        # Keep the filename filesystem-safe.
        safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in row_id)
        dest = out_path / f"{safe_id}.wav"
        _write_wav(dest, samples, sample_rate)
        logger.info("wrote %s (%d samples)", dest, len(samples))
        written += 1

    logger.info("export_audio_ok wrote %d skipped %d dir %s", written, skipped, out_path)


def _expected_audio(text: str | None) -> list[float] | None:
    return _tts_waveform(text) if text and text.strip() else None


def test_audio_synthesize_example_speaks_each_prompt_then_only_new_ones(tmp_path, model_stand_ins, caplog):
    caplog.set_level(logging.INFO)
    cfg = Config(local_db_path=str(tmp_path / "db"))
    run_ingest_audio(cfg, frag_size=2)
    run_synthesize(cfg, checkpoint_size=2, task_size=2)

    table = connect(cfg).open_table("audio")
    got = {r["id"]: r["audio"] for r in table.to_arrow().to_pylist()}
    assert got == {pid: _expected_audio(text) for pid, text in PROMPTS}
    assert table.schema.field("audio").type == pa.list_(pa.float32())
    assert table.schema.field("audio").metadata == {b"sample_rate_hz": b"16000"}
    assert CALLS["vits.model.load"] == 1 and CALLS["vits.tokenizer.load"] == 1 and CALLS["vits.rows"] == 5
    assert "synthesize_audio_ok" in caplog.messages

    # new prompts (one empty, one NULL), then the example again (reset=False): only they are synthesized
    CALLS.clear()
    more = [("extra", "A short new line."), ("blank", "   "), ("none", None), ("last", "Goodbye.")]
    table.add(pa.table({"id": [p for p, _ in more], "text": [t for _, t in more]},
                       schema=pa.schema([("id", pa.string()), ("text", pa.string())])))
    run_synthesize(cfg, checkpoint_size=2, task_size=2)
    got = {r["id"]: r["audio"] for r in connect(cfg).open_table("audio").to_arrow().to_pylist()}
    assert got == {pid: _expected_audio(text) for pid, text in PROMPTS + more}
    assert CALLS["vits.rows"] == 2 and CALLS["vits.model.load"] == 0

    # export: one 16 kHz WAV per synthesized row, the samples scaled to int16
    out = tmp_path / "wav"
    run_export(cfg, out_dir=str(out))
    assert f"export_audio_ok wrote 7 skipped 2 dir {out}" in caplog.messages
    for pid, text in PROMPTS + more:
        want = _expected_audio(text)
        path = out / f"{pid}.wav"
        assert path.exists() == (want is not None)
        if want is not None:
            with wave.open(str(path), "rb") as wav:
                assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (TTS_RATE, 1, 2)
                pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
            assert pcm.tolist() == [int(s * 32767.0) for s in want]


def test_audio_synthesize_example_fails_on_a_model_of_another_sample_rate(tmp_path, model_stand_ins, monkeypatch):
    """tts.py's set-up refuses a model that is not 16 kHz: the backfill fails with its message, nothing written."""
    def from_pretrained(cls: type[_VitsModel], model_id: str) -> _VitsModel:
        return cls(22_050)

    monkeypatch.setattr(_VitsModel, "from_pretrained", classmethod(from_pretrained))
    cfg = Config(local_db_path=str(tmp_path / "db"))
    run_ingest_audio(cfg)
    with pytest.raises(mv_assets.UdfError, match=r"facebook/mms-tts-eng emits 22050 Hz, expected 16000 Hz"):
        run_synthesize(cfg)
    table = connect(cfg).open_table("audio")
    assert "audio" in table.schema.names and table.count_rows("audio IS NULL") == len(PROMPTS)
