"""A model column's refresh, against the model alone and a plain single-process loop.

Prints, side by side in one run, for a stateful batched UDF over embedding-like
rows (``--rows`` x ``--dim`` float32 in, ``--out-dim`` float32 out):

* model alone: the UDF's own time over the same batches already in memory;
* plain loop: one process, pylance scan -> model -> ``lance.write_dataset``,
  one step after the other (what a user writes by hand);
* mv_assets inline: a view refresh in this process (the engine's task path),
  cold (its first refresh sets the model up) and warm;
* mv_assets inline on each of ``--threads`` threads (``InlineRunner(threads=)``:
  tasks at once in this process, one model);
* mv_assets with each of ``--workers`` worker processes (a process pool standing
  in for Spark's Python workers, sharing the GPU), cold (each process sets the
  model up in the refresh) and warm (the processes and models kept);
* with ``--spark k ...``, the same on Spark itself, ``local[k]`` (where there is
  Java), cold and warm: how near the pool is to what it stands in for; ``KxT``
  runs T refresh tasks on threads in each Spark task (``task_threads``), one
  model per worker.

Two models: "gpu-bound" stands in for a GPU call that dominates (the thread
waits ``--model-us`` microseconds per row with the GIL released, as a CUDA
call does, holding a lock shared by all processes, as one GPU runs one call
at a time, then copies its output like a device-to-host copy); "io-bound"
runs the same copy with no wait (the model is ~free, decoding and writing
dominate). On a machine with a GPU, ``--torch`` runs real torch models on
``cuda`` instead: an MLP (io-bound) and a 12-layer bf16 encoder over token ids
(gpu-bound); bench/gpu_device_run.sh runs every configuration there.

The overlap goals: gpu-bound refresh throughput >= 0.9x the model's own
throughput; io-bound, the engine with workers >= 3x the plain loop where
there are cores (and a GPU) for them.

Where the time goes, per configuration (seconds): set-up (the UDF's
construction: a model's load, once per process), read (scan and decode to
Arrow), to-model (Arrow -> numpy, and the host-to-device copy with
``--torch``), model, from-model (device-to-host, numpy -> Arrow), glue (the
engine's own per-batch work around the UDF call: checks, markers), write
(encode and write the view's files), commit, plan+other (the refresh's
planning, opening, clean-up). The UDF times its own to/model/from split; the
engine's read, write, set-up and UDF totals come from its stage timings
(``MV_ASSETS_STAGE_TIMINGS=1``, execution/stages.py) in the refresh's
``timings``. Stages of one task overlap (a thread reads, one computes, one
writes), so they add up to more than the wall time; with workers they are
summed over the processes (task-seconds). CPU: the CPU seconds of the
processes over the tasks, all their threads: CPU / wall is how many cores
were kept busy. Faults: the page faults of this process over the
configuration (all its threads; not printed for the pool, whose faults are its
workers'): fresh memory touched, costly in a VM. After each model, the files
the plain loop and the inline refresh wrote (count, rows, bytes, Lance file
version, columns). The values are checked against
the model's own on a sample of rows (with a tolerance: a GPU's kernels may
round differently batch by batch).

Usage: python bench/bench_gpu_udf.py [--rows 200000] [--dim 256] [--out-dim 384]
           [--model-us 20] [--threads 2 ...] [--workers 2 ...] [--spark 2 ...] [--batch 8192] [--torch]
           [--encoder-rows 50000] [--model both|gpu-bound|io-bound] [--root DIR] [--json FILE]
"""

import argparse
import concurrent.futures
import contextlib
import fcntl
import functools
import glob
import json
import multiprocessing
import os
import resource
import shutil
import tempfile
import threading
import time
import warnings
from datetime import timedelta

os.environ.setdefault("LANCE_LOG", "error")
os.environ["MV_ASSETS_STAGE_TIMINGS"] = "1"
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # read-only Arrow memory: only read  # the engine's stage timings (execution.stages), in the workers too

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.execution.spark import InlineRunner, resolve  # noqa: E402

VOCAB = 32_000  # the encoder's token ids


class Embed:
    """A stateful batched UDF shaped like a model column: set-up once per
    process, then one call per batch: inputs to a matrix, the "model", its
    output back to Arrow. Calls may come from several threads at once (the
    inline runner's ``threads``): with torch each thread copies and computes
    on a CUDA stream of its own, so one thread's copies overlap another's
    kernels on the one model."""

    def __init__(self) -> None:
        started = time.perf_counter()
        self.spent = {"setup_s": 0.0, "to_s": 0.0, "model_s": 0.0, "from_s": 0.0}
        self._lock = threading.Lock()
        self.dim, self.out_dim = int(os.environ["BENCH_DIM"]), int(os.environ["BENCH_OUT_DIM"])
        self.wait = float(os.environ["BENCH_MODEL_US"]) * 1e-6
        self.kind = os.environ.get("BENCH_TORCH_MODEL", "")  # "mlp", "encoder" or "" (a stand-in)
        self.model = None
        self._local = threading.local()
        if self.kind:
            import torch

            device = mv.current_device()  # a Spark task's GPU; inline or in the pool: $MV_ASSETS_DEVICE
            if device == "cpu" and torch.cuda.is_available():
                device = "cuda:0"  # one GPU shared by the threads or worker processes
            self.torch, self.device = torch, device
            torch.manual_seed(0)  # the same weights in every process (and in the oracle)
            if self.kind == "mlp":
                self.model = torch.nn.Sequential(
                    torch.nn.Linear(self.dim, 1024), torch.nn.GELU(), torch.nn.Linear(1024, self.out_dim)
                ).to(device).eval()
                self.dtype = torch.float32
            else:  # a 12-layer d=1024 encoder over token ids, mean-pooled: GPU-bound
                self.dtype = torch.bfloat16
                layer = torch.nn.TransformerEncoderLayer(self.out_dim, 16, 4 * self.out_dim, batch_first=True,
                                                         dropout=0.0)
                self.model = torch.nn.ModuleDict({
                    "emb": torch.nn.Embedding(VOCAB, self.out_dim),
                    "enc": torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False),
                }).to(device, dtype=self.dtype).eval()
            self._sync()
        self.spent["setup_s"] = time.perf_counter() - started
        self._report()

    def _stream(self):
        """This thread's CUDA stream (None: not on a GPU). ``$BENCH_STREAMS=shared``: one
        stream for every thread (a diagnostic: is a stream per thread what costs at 16 threads?)."""
        if self.model is None or not str(self.device).startswith("cuda"):
            return None
        if os.environ.get("BENCH_STREAMS") == "shared":
            with self._lock:
                if getattr(self, "_shared", None) is None:
                    self._shared = self.torch.cuda.Stream(self.device)
            return self._shared
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = self.torch.cuda.Stream(self.device)
        return stream

    def _sync(self, stream=None) -> None:
        """Wait for this thread's work on the device (the stages are timed apart: a copy or a kernel runs on after its call returns)."""
        if stream is not None:
            stream.synchronize()
        elif self.model is not None and str(self.device).startswith("cuda"):
            self.torch.cuda.synchronize(self.device)

    def _report(self) -> None:
        """This instance's totals so far, where the bench reads them (one file per process and instance)."""
        where = os.environ.get("BENCH_STAGE_DIR")
        if where:
            with self._lock, open(os.path.join(where, f"{os.getpid()}-{id(self)}.json"), "w") as f:
                json.dump(self.spent, f)

    def _forward(self, xs):
        if self.kind == "mlp":
            return self.model(xs)
        return self.model["enc"](self.model["emb"](xs)).mean(dim=1)

    def __call__(self, x: pa.Array) -> pa.Array:
        t0 = time.perf_counter()
        m = x.flatten().to_numpy(zero_copy_only=False).reshape(-1, self.dim)
        if self.model is not None:
            torch = self.torch
            stream = self._stream()
            with torch.inference_mode(), torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                xs = torch.from_numpy(m).to(self.device, non_blocking=False)  # host to device
                if self.kind == "mlp":
                    xs = xs.to(self.dtype)
                else:
                    xs = xs.long()
                self._sync(stream)
                t1 = time.perf_counter()
                ys = self._forward(xs)
                self._sync(stream)
                t2 = time.perf_counter()
                out = ys.float().cpu().numpy()  # device to host
        else:
            t1 = time.perf_counter()
            if self.wait:  # the device working; the GIL is free meanwhile
                with open(os.environ["BENCH_GPU_LOCK"], "rb") as device:
                    fcntl.flock(device, fcntl.LOCK_EX)  # one device for all worker processes
                    time.sleep(self.wait * len(m))
            t2 = time.perf_counter()
            out = np.empty((len(m), self.out_dim), np.float32)  # the device-to-host copy
            out[:, : self.dim] = m[:, : min(self.dim, self.out_dim)]
            if self.out_dim > self.dim:
                out[:, self.dim:] = m[:, : self.out_dim - self.dim]
        result = pa.FixedSizeListArray.from_arrays(pa.array(out.ravel(), pa.float32()), self.out_dim)
        t3 = time.perf_counter()
        with self._lock:
            self.spent["to_s"] += t1 - t0
            self.spent["model_s"] += t2 - t1
            self.spent["from_s"] += t3 - t2
        self._report()
        return result


def _udf(out_dim: int, model: str, batch: int = 8192, gpus: float = 0.0, calls: int | None = None) -> mv.UDF:
    # one version per model: a stateful UDF's instance is kept per process by its code
    # fingerprint, and the two models are one class set up from the environment. A torch
    # model is declared as users declare one (num_gpus=1); ``calls`` sets max_concurrency
    return mv.udf(Embed, data_type=pa.list_(pa.float32(), out_dim), input_columns=["x"], version=model,
                  batch_size=batch, num_gpus=gpus, max_concurrency=calls)  # the batches: as in "model alone"


def _source(rows: int, dim: int, tokens: bool = False) -> pa.Table:
    rng = np.random.default_rng(7)
    values = (pa.array(rng.integers(0, VOCAB, rows * dim, dtype=np.int32)) if tokens
              else pa.array(rng.random(rows * dim, dtype=np.float32)))
    return pa.table({"id": pa.array(np.arange(rows)), "x": pa.FixedSizeListArray.from_arrays(values, dim)})


class GpuUse:
    """The GPU's mean utilisation (NVML: the share of time a kernel ran) while
    a configuration runs; "-" without a GPU or NVML."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no GPU, no NVML: nothing sampled
            self._nvml = None

    def __enter__(self) -> "GpuUse":
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> str:
        return f"{sum(self.samples) / len(self.samples):.0f}%" if self.samples else "-"


def _init_worker(env: dict) -> None:
    os.environ.update(env)


def _call(func_ref: str, payload: str, shared: bytes) -> str:
    return resolve(func_ref)(payload, shared)


class PoolRunner:
    """Tasks on a pool of worker processes (one task each at a time)."""

    name = "process-pool"

    def __init__(self, workers: int, env: dict) -> None:
        self.workers = workers
        self.pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker, initargs=(env,))

    def parallelism(self) -> int:
        return self.workers

    def run(self, tasks, definition_raw, *, estimated_seconds=None):
        from mv_assets.execution.spark import _RUN_TASK
        from mv_assets.execution.tasks import TaskResult

        out = self.map(_RUN_TASK, [t.to_json() for t in tasks], definition_raw)
        return [TaskResult.from_json(r) for r in out]

    def map(self, func_ref, payloads, shared, rows=0):
        return list(self.pool.map(_call, [func_ref] * len(payloads), payloads, [shared] * len(payloads)))

    def describe_last_run(self) -> str:
        return f"{self.name}[{self.workers}]"

    def warm(self) -> None:  # start the processes and import the engine there
        list(self.pool.map(_call, ["mv_assets.execution.tasks:and_filters"] * self.workers,
                           [None] * self.workers, [None] * self.workers))

    def close(self) -> None:
        self.pool.shutdown()


def _faults() -> int:
    """Page faults of this process so far, all its threads (fresh memory touched: costly in a VM)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt


def _files(uri: str) -> str:
    """The current version's data files of a dataset: how many, rows per file, bytes, file version."""
    ds = lance.dataset(uri)
    files = [(f, fr.count_rows()) for fr in ds.get_fragments() for f in fr.data_files()]
    size = sum(os.path.getsize(os.path.join(uri, "data", f.path)) for f, _ in files)
    return (f"{len(files)} file(s), {sorted({n for _, n in files})} rows each, {size / 1e6:.1f} MB, "
            f"Lance file {ds.data_storage_version}, columns {ds.schema.names}")


def _udf_spent() -> dict[str, float]:
    """The UDF instances' own totals so far, over every process (bench.Embed._report)."""
    total: dict[str, float] = {}
    for path in glob.glob(os.path.join(os.environ["BENCH_STAGE_DIR"], "*.json")):
        with open(path) as f:
            for k, v in json.load(f).items():
                total[k] = total.get(k, 0.0) + v
    return total


def _since(before: dict[str, float]) -> dict[str, float]:
    after = _udf_spent()
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _model_alone(src_uri: str, batch: int) -> tuple[float, dict]:
    batches = list(lance.dataset(src_uri).to_batches(columns=["x"], batch_size=batch))
    before = _udf_spent()
    f = Embed()
    setup = _since(before)["setup_s"]
    f(batches[0].column(0).slice(0, 8))  # warm
    before, faults = _udf_spent(), _faults()
    t0, cpu = time.perf_counter(), time.process_time()
    for b in batches:
        f(b.column(0))
    wall = time.perf_counter() - t0
    return wall, {**_since(before), "setup_s": setup, "cpu_s": time.process_time() - cpu, "faults": _faults() - faults}


def _plain_loop(src_uri: str, out_uri: str, batch: int) -> tuple[float, dict]:
    before, faults = _udf_spent(), _faults()
    t0, cpu = time.perf_counter(), time.process_time()
    f = Embed()
    ds = lance.dataset(src_uri)
    schema = pa.schema([("id", pa.int64()), ("emb", pa.list_(pa.float32(), f.out_dim))])
    stages = {"read_s": 0.0, "in_loop_s": 0.0}

    def gen():
        batches = iter(ds.to_batches(columns=["id", "x"], batch_size=batch))
        while True:
            r0 = time.perf_counter()
            b = next(batches, None)
            r1 = time.perf_counter()
            stages["read_s"] += r1 - r0
            if b is None:
                stages["in_loop_s"] += r1 - r0
                return
            out = pa.RecordBatch.from_arrays([b.column(0), f(b.column(1))], schema=schema)
            stages["in_loop_s"] += time.perf_counter() - r0
            yield out

    w0 = time.perf_counter()
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, gen()), out_uri, mode="overwrite")
    wall = time.perf_counter() - t0
    # write_dataset pulls the loop's batches: its own time (encode, write, commit) is the rest
    spent = _since(before)
    return wall, {**spent, "read_s": stages["read_s"], "write_s": time.perf_counter() - w0 - stages["in_loop_s"],
                  "cpu_s": time.process_time() - cpu, "faults": _faults() - faults}


def _refresh(db, name: str, runner) -> tuple[float, int, dict]:
    v = db.open_table(name)
    before, faults = _udf_spent(), _faults()
    t0, cpu = time.perf_counter(), time.process_time()
    with GpuUse() as gpu:
        r = v.refresh(runner=runner, mode="full")
    wall = time.perf_counter() - t0
    spent = _since(before)
    t = r.timings
    own = spent.get("to_s", 0.0) + spent.get("model_s", 0.0) + spent.get("from_s", 0.0)
    stages = {**spent, "setup_s": t.get("stage_setup_s", 0.0), "read_s": t.get("stage_read_s", 0.0),
              "glue_s": t.get("stage_udf_s", 0.0) - own, "write_s": t.get("stage_write_s", 0.0),
              "commit_s": t.get("commit_s", 0.0), "other_s": wall - t.get("execute_s", 0.0) - t.get("commit_s", 0.0),
              "cpu_s": t.get("stage_cpu_s", 0.0), "gpu": gpu.mean()}
    if runner.name == "inline":  # (a pool's faults are its workers')
        stages["faults"] = _faults() - faults
        # tasks on threads overlap: each one's cpu_s counts the others'; the process's own is the truth
        stages["cpu_s"] = time.process_time() - cpu
    if os.environ.get("BENCH_VERBOSE"):
        print(f"      {r.runner}: {r.tasks} tasks, {r.timings}")
    v.cleanup_old_versions(timedelta(0), delete_unverified=True)  # the disk holds one copy of the view at a time
    return wall, r.udf_rows_computed["emb"], stages


COLUMNS = [("setup_s", "set-up"), ("read_s", "read"), ("to_s", "to-model"), ("model_s", "model"),
           ("from_s", "from-model"), ("glue_s", "glue"), ("write_s", "write"), ("commit_s", "commit"),
           ("other_s", "plan+other"), ("cpu_s", "CPU"), ("faults", "faults"), ("gpu", "GPU busy")]


def _row(label: str, wall: float, stages: dict, rows: int, versus: str = "") -> str:
    def cell(k: str) -> str:
        v = stages.get(k)
        return f"{'-':>11}" if v is None else f"{v:>11}" if isinstance(v, str) else f"{v:>11,}" if k == "faults" \
            else f"{v:>11.2f}"

    return f"    {label:<40}{wall:>8.2f}{rows / 1e3 / wall:>9.0f}k{''.join(cell(k) for k, _ in COLUMNS)}  {versus}"


def _check(db, view: str, src_uri: str, dim: int, out_dim: int, tolerance: float, sample: int = 1000) -> float:
    """The view's values for a sample of rows equal the model's own on the same inputs, within
    ``tolerance`` (the largest per-row relative error: a GPU's kernels may round differently
    batch by batch; bf16 more than float32). Returns that error."""
    ds = lance.dataset(db.open_table(view).uri)
    ids = ds.to_table(columns=["id"]).column("id").to_numpy()
    rng = np.random.default_rng(1)
    want_ids = np.sort(rng.choice(ids, size=min(sample, len(ids)), replace=False))
    got = ds.take(np.argsort(ids, kind="stable")[np.searchsorted(np.sort(ids), want_ids)], columns=["id", "emb"])
    assert got.column("id").to_numpy().tolist() == want_ids.tolist()
    src = lance.dataset(src_uri)
    src_ids = src.to_table(columns=["id"]).column("id").to_numpy()
    x = src.take(np.argsort(src_ids)[np.searchsorted(np.sort(src_ids), want_ids)], columns=["x"]).column("x")
    model = _CHECKERS.get(os.environ["BENCH_TORCH_MODEL"]) or Embed()
    _CHECKERS[os.environ["BENCH_TORCH_MODEL"]] = model
    want = model(x.combine_chunks())
    g = got.column("emb").combine_chunks().flatten().to_numpy().reshape(-1, out_dim)
    w = want.flatten().to_numpy().reshape(-1, out_dim)
    assert np.isfinite(g).all(), f"view {view}: values that are not finite"
    error = float((np.linalg.norm(g - w, axis=1) / np.maximum(np.linalg.norm(w, axis=1), 1e-12)).max())
    assert error <= tolerance, f"view {view}: its values differ from the model's (relative error {error:.2e})"
    return error


_CHECKERS: dict[str, Embed] = {}  # one model instance per kind for the checks


def _configurations(db, view: str, env: dict, threads: list[int], workers: list[int], rows: int, check,
                    spark: "list[str] | tuple[str, ...]" = (), free: "tuple[str, list[int], int] | None" = None) -> list:
    """(label, wall, stages) of the refreshes: inline twice (cold: its first refresh sets the
    model up in this process; warm: it is kept), inline on each thread count, and a pool of
    each worker count twice: its first refresh (cold: each process imports the model's library,
    makes its CUDA context and loads the model) and its second (warm: the processes and their
    models kept, as Spark keeps its Python workers)."""
    out = []
    for when in ("cold", "warm"):  # the first refresh in this process sets the model up
        wall, n, st = _refresh(db, view, InlineRunner())
        assert n == rows, (n, rows)
        st["error"] = check()
        out.append((f"mv_assets inline, {when}", wall, st))
    for k in threads:
        wall, n, st = _refresh(db, view, InlineRunner(threads=k))
        assert n == rows, (n, rows)
        st["error"] = check()
        out.append((f"mv_assets inline, {k} threads", wall, st))
    if free is not None:  # the same model and threads, at most ``bound`` of its calls at once (max_concurrency)
        bound_view, counts, bound = free
        for k in counts:
            wall, n, st = _refresh(db, bound_view, InlineRunner(threads=k))
            assert n == rows, (n, rows)
            st["error"] = check(view=bound_view)
            out.append((f"mv_assets inline, {k} threads, {bound} calls", wall, st))
    for k in workers:
        pool = PoolRunner(k, env)
        try:
            pool.warm()
            for when in ("cold", "warm"):
                wall, n, st = _refresh(db, view, pool)
                assert n == rows, (n, rows)
                st["error"] = check()
                out.append((f"mv_assets {k} workers, {when}", wall, st))
        finally:
            pool.close()
    for spec in spark:  # the path the pool stands in for: Spark's reused Python workers (local[k])
        from mv_assets.execution.spark import SparkRunner

        k, _, t = spec.partition("x")  # "KxT": local[K], T refresh tasks on threads in each Spark task
        runner = SparkRunner(master=f"local[{k}]", local_below_rows=0, forward_env=sorted(env),
                             task_threads=int(t or 1))
        try:
            runner.session()  # the JVM's start is not the refresh's
            for when in ("cold", "warm"):
                wall, n, st = _refresh(db, view, runner)
                assert n == rows, (n, rows)
                st["error"] = check()
                label = f"Spark local[{k}]" + (f" x {t} threads" if t else "")
                out.append((f"mv_assets {label}, {when}", wall, st))
        finally:
            runner.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the io-bound model (and the stand-ins)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--out-dim", type=int, default=384)
    ap.add_argument("--model-us", type=float, default=20.0, help="gpu-bound stand-in: microseconds per row")
    ap.add_argument("--workers", type=int, nargs="*", default=[2], help="worker-process counts (a pool each)")
    ap.add_argument("--threads", type=int, nargs="*", default=[2], help="the inline runner's thread counts")
    ap.add_argument("--bound-threads", type=int, nargs="*", default=[],
                    help="thread counts run again with at most --bound calls of the model at once (max_concurrency)")
    ap.add_argument("--bound", type=int, default=4, help="max_concurrency of the --bound-threads runs")
    ap.add_argument("--skip-plain", action="store_true", help="no plain loop (a shorter run)")
    ap.add_argument("--spark", nargs="*", default=[],
                    help="also on Spark: K for local[K], KxT for local[K] with T refresh tasks on threads in "
                         "each Spark task (task_threads); needs Java: not on the GPU machine")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--torch", action="store_true",
                    help="real torch models on the GPU: an MLP (io-bound) and a 12-layer encoder (gpu-bound)")
    ap.add_argument("--encoder-rows", type=int, default=50_000, help="--torch: rows of 128 tokens for the encoder")
    ap.add_argument("--model", choices=["both", "gpu-bound", "io-bound"], default="both",
                    help="which model(s) to run")
    ap.add_argument("--root", default=None, help="where the datasets are written (a temporary folder under it)")
    ap.add_argument("--json", default=None, help="also write every figure to this file (JSON lines)")
    args = ap.parse_args()
    if os.environ.get("BENCH_SWITCH_INTERVAL"):  # a diagnostic: the interpreter's thread switch interval (s)
        import sys

        sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
    root = tempfile.mkdtemp(prefix="mv_bench_gpu_", dir=args.root)
    print(f"\nmodel column benchmark: {os.cpu_count()} cores, threads {args.threads}, workers {args.workers}")
    print("  seconds per stage; stages of one task overlap (read, compute, write threads); with workers, "
          "summed over the processes;\n  CPU: CPU seconds of the processes over the tasks (all their threads); "
          "GPU busy: NVML's mean utilisation")
    # (name, torch model, rows, dim, out dim, batch, stand-in wait, tolerance)
    if args.torch:
        models = [("io-bound", "mlp", args.rows, args.dim, args.out_dim, args.batch, 0.0, 1e-3),
                  ("gpu-bound", "encoder", args.encoder_rows, 128, 1024, 256, 0.0, 3e-2)]
    else:
        models = [("gpu-bound", "", args.rows, args.dim, args.out_dim, args.batch, args.model_us, 1e-3),
                  ("io-bound", "", args.rows, args.dim, args.out_dim, args.batch, 0.0, 1e-3)]
    models = [m for m in models if args.model in ("both", m[0])]
    out = open(args.json, "a") if args.json else None
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=InlineRunner())
        for name, kind, rows, dim, out_dim, batch, us, tolerance in models:
            src = db.create_table(f"src_{name.replace('-', '_')}", _source(rows, dim, tokens=kind == "encoder"))
            src_uri = src.uri
            lock = os.path.join(root, "gpu.lock")
            open(lock, "wb").close()
            stage_dir = os.path.join(root, f"stages_{name}")
            os.makedirs(stage_dir)
            env = {"BENCH_GPU_LOCK": lock, "BENCH_DIM": str(dim), "BENCH_OUT_DIM": str(out_dim),
                   "BENCH_MODEL_US": str(us), "BENCH_TORCH_MODEL": kind,
                   "BENCH_STAGE_DIR": stage_dir, "MV_ASSETS_STAGE_TIMINGS": "1"}
            os.environ.update(env)
            view = f"v_{name.replace('-', '_')}"
            gpus = 1.0 if kind else 0.0
            db.create_materialized_view(view, src.search(None).select({"id": "id", "emb": _udf(out_dim, name, batch,
                                                                                              gpus)}))
            free = None
            if args.bound_threads:
                free = (f"{view}_bound", args.bound_threads, args.bound)
                db.create_materialized_view(free[0], src.search(None).select(
                    {"id": "id", "emb": _udf(out_dim, name, batch, gpus, calls=args.bound)}))
            with GpuUse() as gpu:
                model, model_st = _model_alone(src_uri, batch)
            model_st["gpu"] = gpu.mean()
            plain_uri = os.path.join(root, f"plain_{view}.lance")
            if args.skip_plain:
                plain, plain_st, plain_files = float("nan"), {}, "(not run)"
            else:
                with GpuUse() as gpu:
                    plain, plain_st = _plain_loop(src_uri, plain_uri, batch)
                plain_st["gpu"] = gpu.mean()
                plain_files = _files(plain_uri)
            shutil.rmtree(plain_uri, ignore_errors=True)
            results = _configurations(db, view, env, args.threads, args.workers, rows,
                                      functools.partial(_check, db, view=view, src_uri=src_uri, dim=dim, out_dim=out_dim,
                                                        tolerance=tolerance),
                                      args.spark, free)
            what = f"torch {kind}" if kind else f"stand-in, {us:g} us/row wait + output copy"
            print(f"\n  {name} model ({what}): {rows:,} rows x {dim} {'token ids' if kind == 'encoder' else 'float32'}"
                  f" -> {out_dim} float32, batches of {batch}")
            print(f"    {'':<40}{'wall s':>8}{'rows/s':>10}" + "".join(f"{h:>11}" for _, h in COLUMNS))
            print(_row("model alone", model, model_st, rows))
            print(_row("plain loop (1 process)", plain, plain_st, rows, "(write: encode+write+commit)"))
            for label, wall, st in results:
                print(_row(label, wall, st, rows, f"{model / wall:5.2f}x model, {plain / wall:5.2f}x plain loop"))
            print(f"    written: plain loop {plain_files}\n             view      {_files(db.open_table(view).uri)}")
            print(f"    values: a sample of 1,000 rows of the view equals the model's own after each refresh "
                  f"(largest relative error {max(st['error'] for _, _, st in results):.1e}, tolerance {tolerance:g})")
            if out is not None:
                for label, wall, st in [("model alone", model, model_st), ("plain loop", plain, plain_st), *results]:
                    out.write(json.dumps({"model": name, "torch": kind, "rows": rows, "config": label, "wall_s": wall,
                                          "vs_model": model / wall, "vs_plain": plain / wall, **st}) + "\n")
                out.flush()
            db.drop_table(view)
            if free is not None:
                db.drop_table(free[0])
            db.drop_table(src.name)
    finally:
        if out is not None:
            out.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
