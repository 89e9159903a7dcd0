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
           [--model-us 20] [--workers 2] [--batch 8192] [--torch] [--model both|gpu-bound|io-bound]
"""

import argparse
import concurrent.futures
import fcntl
import glob
import json
import multiprocessing
import os
import resource
import shutil
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")
os.environ["MV_ASSETS_STAGE_TIMINGS"] = "1"  # the engine's stage timings (execution.stages), in the workers too

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
        started = time.perf_counter()
        self.spent = {"setup_s": 0.0, "to_s": 0.0, "model_s": 0.0, "from_s": 0.0}
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
            self._sync()
        self.spent["setup_s"] = time.perf_counter() - started
        self._report()

    def _sync(self) -> None:
        """Wait for the device (the stages are timed apart: a copy or a kernel runs on after its call returns)."""
        if self.model is not None and str(self.device).startswith("cuda"):
            self.torch.cuda.synchronize(self.device)

    def _report(self) -> None:
        """This instance's totals so far, where the bench reads them (one file per process and instance)."""
        where = os.environ.get("BENCH_STAGE_DIR")
        if where:
            with open(os.path.join(where, f"{os.getpid()}-{id(self)}.json"), "w") as f:
                json.dump(self.spent, f)

    def __call__(self, x: pa.Array) -> pa.Array:
        t0 = time.perf_counter()
        m = x.flatten().to_numpy(zero_copy_only=False).reshape(-1, self.dim)
        if self.model is not None:
            with self.torch.inference_mode():
                xs = self.torch.from_numpy(m).to(self.device, non_blocking=True)  # host to device
                self._sync()
                t1 = time.perf_counter()
                ys = self.model(xs)
                self._sync()
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
        self.spent["to_s"] += t1 - t0
        self.spent["model_s"] += t2 - t1
        self.spent["from_s"] += t3 - t2
        self._report()
        return result


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
    t0 = time.perf_counter()
    r = v.refresh(runner=runner, mode="full")
    wall = time.perf_counter() - t0
    spent = _since(before)
    t = r.timings
    own = spent.get("to_s", 0.0) + spent.get("model_s", 0.0) + spent.get("from_s", 0.0)
    stages = {**spent, "setup_s": t.get("stage_setup_s", 0.0), "read_s": t.get("stage_read_s", 0.0),
              "glue_s": t.get("stage_udf_s", 0.0) - own, "write_s": t.get("stage_write_s", 0.0),
              "commit_s": t.get("commit_s", 0.0), "other_s": wall - t.get("execute_s", 0.0) - t.get("commit_s", 0.0),
              "cpu_s": t.get("stage_cpu_s", 0.0)}
    if runner.name == "inline":  # (a pool's faults are its workers')
        stages["faults"] = _faults() - faults
    if os.environ.get("BENCH_VERBOSE"):
        print(f"      {r.runner}: {r.tasks} tasks, {r.timings}")
    return wall, r.udf_rows_computed["emb"], stages


COLUMNS = [("setup_s", "set-up"), ("read_s", "read"), ("to_s", "to-model"), ("model_s", "model"),
           ("from_s", "from-model"), ("glue_s", "glue"), ("write_s", "write"), ("commit_s", "commit"),
           ("other_s", "plan+other"), ("cpu_s", "CPU"), ("faults", "faults")]


def _row(label: str, wall: float, stages: dict, rows: int, versus: str = "") -> str:
    cells = "".join(f"{'-':>11}" if k not in stages else f"{stages[k]:>11,}" if k == "faults" else f"{stages[k]:>11.2f}"
                    for k, _ in COLUMNS)
    return f"    {label:<24}{wall:>8.2f}{rows / 1e3 / wall:>9.0f}k{cells}  {versus}"


def _check(db, view: str, src_uri: str, dim: int, out_dim: int, sample: int = 1000) -> None:
    """The view's values for a sample of rows equal the model's own on the same inputs (a tolerance:
    a GPU's kernels may round differently batch by batch)."""
    ds = lance.dataset(db.open_table(view).uri)
    ids = ds.to_table(columns=["id"]).column("id").to_numpy()
    rng = np.random.default_rng(1)
    want_ids = np.sort(rng.choice(ids, size=min(sample, len(ids)), replace=False))
    got = ds.take(np.searchsorted(ids, want_ids) if np.all(ids[:-1] <= ids[1:]) else
                  np.argsort(ids)[np.searchsorted(np.sort(ids), want_ids)], columns=["id", "emb"])
    assert got.column("id").to_numpy().tolist() == want_ids.tolist()
    src = lance.dataset(src_uri)
    src_ids = src.to_table(columns=["id"]).column("id").to_numpy()
    x = src.take(np.argsort(src_ids)[np.searchsorted(np.sort(src_ids), want_ids)], columns=["x"]).column("x")
    want = Embed()(x.combine_chunks())
    g = got.column("emb").combine_chunks().flatten().to_numpy().reshape(-1, out_dim)
    w = want.flatten().to_numpy().reshape(-1, out_dim)
    assert np.allclose(g, w, rtol=1e-3, atol=1e-4), f"view {view}: its values differ from the model's"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--out-dim", type=int, default=384)
    ap.add_argument("--model-us", type=float, default=20.0, help="gpu-bound model: microseconds per row")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--torch", action="store_true", help="a real torch MLP on the GPU (io-bound case only)")
    ap.add_argument("--model", choices=["both", "gpu-bound", "io-bound"], default="both",
                    help="which stand-in model(s) to run")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_gpu_")
    print(f"\nmodel column benchmark: {args.rows:,} rows x {args.dim} float32 -> {args.out_dim}, "
          f"{os.cpu_count()} cores, {args.workers} workers")
    print("  seconds per stage; stages of one task overlap (read, compute, write threads); with workers, "
          "summed over the processes;\n  CPU: CPU seconds of the processes over the tasks (all their threads)")
    models = [("io-bound", 0.0)] if args.torch else [("gpu-bound", args.model_us), ("io-bound", 0.0)]
    models = [m for m in models if args.model in ("both", m[0])]
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=InlineRunner())
        src = db.create_table("src", _source(root, args.rows, args.dim))
        src_uri = src.uri
        for name, us in models:
            lock = os.path.join(root, "gpu.lock")
            open(lock, "wb").close()
            stage_dir = os.path.join(root, f"stages_{name}")
            os.makedirs(stage_dir)
            env = {"BENCH_GPU_LOCK": lock, "BENCH_DIM": str(args.dim), "BENCH_OUT_DIM": str(args.out_dim),
                   "BENCH_MODEL_US": str(us), "BENCH_TORCH": "1" if args.torch else "0",
                   "BENCH_STAGE_DIR": stage_dir, "MV_ASSETS_STAGE_TIMINGS": "1"}
            os.environ.update(env)
            view = f"v_{name.replace('-', '_')}"
            db.create_materialized_view(view, src.search(None).select({"id": "id", "emb": _udf(args.out_dim, name, args.batch)}))
            model, model_st = _model_alone(src_uri, args.batch)
            plain, plain_st = _plain_loop(src_uri, os.path.join(root, f"plain_{view}.lance"), args.batch)
            inline, n1, inline_st = _refresh(db, view, InlineRunner())
            _check(db, view, src_uri, args.dim, args.out_dim)
            written = (f"    written: plain loop {_files(os.path.join(root, f'plain_{view}.lance'))}\n"
                       f"             inline    {_files(db.open_table(view).uri)}")
            pool = PoolRunner(args.workers, env)
            try:
                pool.warm()
                pooled, n2, pooled_st = _refresh(db, view, pool)
            finally:
                pool.close()
            assert n1 == n2 == args.rows, (n1, n2)
            _check(db, view, src_uri, args.dim, args.out_dim)
            print(f"\n  {name} model ({us:g} us/row wait + output copy){' : torch MLP' if args.torch else ''}")
            print(f"    {'':<24}{'wall s':>8}{'rows/s':>10}" + "".join(f"{h:>11}" for _, h in COLUMNS))
            rows = args.rows
            print(_row("model alone", model, model_st, rows))
            print(_row("plain loop (1 process)", plain, plain_st, rows, "(write: encode+write+commit)"))
            print(_row("mv_assets inline", inline, inline_st, rows,
                       f"{model / inline:5.2f}x model, {plain / inline:5.2f}x plain loop"))
            print(_row(f"mv_assets {args.workers} workers", pooled, pooled_st, rows,
                       f"{model / pooled:5.2f}x model, {plain / pooled:5.2f}x plain loop"))
            print(written)
        print("\n  values: a sample of 1,000 rows of the view equals the model's own after each refresh")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
