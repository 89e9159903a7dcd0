"""A model column's refresh, against the model alone and a plain single-process loop.

Prints, side by side in one run, for a stateful batched UDF over embedding-like
rows (``--rows`` x ``--dim`` float32 in, ``--out-dim`` float32 out):

* model alone: the UDF's own time over the same batches already in memory;
* plain loop: one process, pylance scan -> model -> ``lance.write_dataset``,
  one step after the other (what a user writes by hand);
* mv_assets inline: a view refresh in this process (the engine's task path);
* mv_assets with ``--workers`` worker processes (a process pool standing in
  for Spark's Python workers; on a GPU machine they would share the GPU).

Two models: "gpu-bound" stands in for a GPU call that dominates (the thread
waits ``--model-us`` microseconds per row with the GIL released, as a CUDA
call does, holding a lock shared by all processes, as one GPU runs one call
at a time, then copies its output like a device-to-host copy); "io-bound"
runs the same copy with no wait (the model is ~free, decoding and writing
dominate). On a machine with a GPU, ``--torch`` runs a real torch MLP on
``cuda`` instead (the io-bound case of the GPU issue).

The overlap goals: gpu-bound refresh throughput >= 0.9x the model's own
throughput; io-bound, the engine with workers >= 3x the plain loop where
there are cores (and a GPU) for them.

Usage: python bench/bench_gpu_udf.py [--rows 200000] [--dim 256] [--out-dim 384]
           [--model-us 20] [--workers 2] [--batch 8192] [--torch]
"""

import argparse
import concurrent.futures
import fcntl
import multiprocessing
import os
import shutil
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.execution.spark import InlineRunner, resolve  # noqa: E402

ARGS = {"dim": 256, "out_dim": 384, "model_us": 20.0, "torch": False}


class Embed:
    """A stateful batched UDF shaped like a model column: set-up once per
    process, then one call per batch: inputs to a matrix, the "model", its
    output back to Arrow."""

    def __init__(self) -> None:
        self.dim, self.out_dim = int(os.environ["BENCH_DIM"]), int(os.environ["BENCH_OUT_DIM"])
        self.wait = float(os.environ["BENCH_MODEL_US"]) * 1e-6
        self.model = None
        if os.environ.get("BENCH_TORCH") == "1":
            import torch

            device = mv.current_device()  # a Spark task's GPU; inline or in the pool: $MV_ASSETS_DEVICE
            if device == "cpu" and torch.cuda.is_available():
                device = "cuda:0"  # one GPU shared by the worker processes
            self.torch, self.device = torch, device
            torch.manual_seed(0)  # the same weights in every process (and in the oracle)
            self.model = torch.nn.Sequential(
                torch.nn.Linear(self.dim, 1024), torch.nn.GELU(), torch.nn.Linear(1024, self.out_dim)
            ).to(device).eval()

    def __call__(self, x: pa.Array) -> pa.Array:
        m = x.flatten().to_numpy(zero_copy_only=False).reshape(-1, self.dim)
        if self.model is not None:
            with self.torch.inference_mode():
                out = self.model(self.torch.from_numpy(m).to(self.device, non_blocking=True)).float().cpu().numpy()
        else:
            if self.wait:  # the device working; the GIL is free meanwhile
                with open(os.environ["BENCH_GPU_LOCK"], "rb") as device:
                    fcntl.flock(device, fcntl.LOCK_EX)  # one device for all worker processes
                    time.sleep(self.wait * len(m))
            out = np.empty((len(m), self.out_dim), np.float32)  # the device-to-host copy
            out[:, : self.dim] = m[:, : min(self.dim, self.out_dim)]
            if self.out_dim > self.dim:
                out[:, self.dim:] = m[:, : self.out_dim - self.dim]
        return pa.FixedSizeListArray.from_arrays(pa.array(out.ravel(), pa.float32()), self.out_dim)


def _udf(out_dim: int, model: str, batch: int = 8192) -> mv.UDF:
    # one version per model: a stateful UDF's instance is kept per process by its code
    # fingerprint, and the two models are one class set up from the environment
    return mv.udf(Embed, data_type=pa.list_(pa.float32(), out_dim), input_columns=["x"], version=model,
                  batch_size=batch)  # the model's batches: as in "model alone"


def _source(path: str, rows: int, dim: int) -> pa.Table:
    rng = np.random.default_rng(7)
    x = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * dim, dtype=np.float32)), dim)
    return pa.table({"id": pa.array(np.arange(rows)), "x": x})


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


def _model_alone(src_uri: str, batch: int) -> float:
    batches = list(lance.dataset(src_uri).to_batches(columns=["x"], batch_size=batch))
    f = Embed()
    f(batches[0].column(0).slice(0, 8))  # warm
    t0 = time.perf_counter()
    for b in batches:
        f(b.column(0))
    return time.perf_counter() - t0


def _plain_loop(src_uri: str, out_uri: str, batch: int) -> float:
    f = Embed()
    t0 = time.perf_counter()
    ds = lance.dataset(src_uri)
    schema = pa.schema([("id", pa.int64()), ("emb", pa.list_(pa.float32(), f.out_dim))])

    def gen():
        for b in ds.to_batches(columns=["id", "x"], batch_size=batch):
            yield pa.RecordBatch.from_arrays([b.column(0), f(b.column(1))], schema=schema)

    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, gen()), out_uri, mode="overwrite")
    return time.perf_counter() - t0


def _refresh(db, name: str, runner) -> tuple[float, int]:
    v = db.open_table(name)
    t0 = time.perf_counter()
    r = v.refresh(runner=runner, mode="full")
    if os.environ.get("BENCH_VERBOSE"):
        print(f"      {r.runner}: {r.tasks} tasks, {r.timings}")
    return time.perf_counter() - t0, r.udf_rows_computed["emb"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--out-dim", type=int, default=384)
    ap.add_argument("--model-us", type=float, default=20.0, help="gpu-bound model: microseconds per row")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--torch", action="store_true", help="a real torch MLP on the GPU (io-bound case only)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_gpu_")
    print(f"\nmodel column benchmark: {args.rows:,} rows x {args.dim} float32 -> {args.out_dim}, "
          f"{os.cpu_count()} cores, {args.workers} workers")
    models = [("io-bound", 0.0)] if args.torch else [("gpu-bound", args.model_us), ("io-bound", 0.0)]
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=InlineRunner())
        src = db.create_table("src", _source(root, args.rows, args.dim))
        src_uri = src.uri
        for name, us in models:
            lock = os.path.join(root, "gpu.lock")
            open(lock, "wb").close()
            env = {"BENCH_GPU_LOCK": lock, "BENCH_DIM": str(args.dim), "BENCH_OUT_DIM": str(args.out_dim), "BENCH_MODEL_US": str(us),
                   "BENCH_TORCH": "1" if args.torch else "0"}
            os.environ.update(env)
            view = f"v_{name.replace('-', '_')}"
            db.create_materialized_view(view, src.search(None).select({"id": "id", "emb": _udf(args.out_dim, name, args.batch)}))
            model = _model_alone(src_uri, args.batch)
            plain = _plain_loop(src_uri, os.path.join(root, f"plain_{view}.lance"), args.batch)
            inline, n1 = _refresh(db, view, InlineRunner())
            pool = PoolRunner(args.workers, env)
            try:
                pool.warm()
                pooled, n2 = _refresh(db, view, pool)
            finally:
                pool.close()
            assert n1 == n2 == args.rows, (n1, n2)
            emb = db.open_table(view).to_arrow().sort_by("id").column("emb")
            # (a real model on a GPU: its kernels may round differently batch by batch: a tolerance)
            got, want = np.array(emb.to_pylist()[:3]), np.array(_plain_emb(src_uri, args.dim, args.out_dim)[:3])
            assert np.allclose(got, want, rtol=1e-3, atol=1e-4), "the view's values differ from the model's"
            rate = args.rows / 1e3
            print(f"\n  {name} model ({us:g} us/row wait + output copy)")
            print(f"    {'model alone':<26} {model:7.2f} s  {rate / model:8.0f}k rows/s")
            print(f"    {'plain loop (1 process)':<26} {plain:7.2f} s  {rate / plain:8.0f}k rows/s")
            print(f"    {'mv_assets inline':<26} {inline:7.2f} s  {rate / inline:8.0f}k rows/s  "
                  f"{model / inline:5.2f}x model throughput, {plain / inline:5.2f}x plain loop")
            print(f"    {f'mv_assets {args.workers} workers':<26} {pooled:7.2f} s  {rate / pooled:8.0f}k rows/s  "
                  f"{model / pooled:5.2f}x model throughput, {plain / pooled:5.2f}x plain loop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _plain_emb(src_uri: str, dim: int, out_dim: int) -> list:
    """The oracle: the first rows' outputs computed directly from the source."""
    x = lance.dataset(src_uri).to_table(columns=["id", "x"]).sort_by("id").slice(0, 3)
    return Embed()(x.column("x").combine_chunks()).to_pylist()


if __name__ == "__main__":
    main()
