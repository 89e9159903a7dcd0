"""Planning a 1% delete (and update) as views grow: the memory the plan holds
and its time, at 1M and 10M rows, side by side with another checkout.

    python bench/bench_delete_plan.py --rows 1000000 10000000 --compare /path/to/older/checkout
    python bench/bench_delete_plan.py --scoped ...   # the plan of a partition run: one fragment

``--scoped``: the refresh is scoped to one source fragment (what a Dagster
partition run plans), the one the update wrote: its rows are compared, and
the view's rows deleted anywhere found. ``--chunk``: the view is a chunk
view (two children a source row) instead of a 1:1 view.

Each measurement runs in a fresh process: the plan's peak resident memory
above the process's before it (sampled every 0.5 ms), the largest of
--repeat, and its time, the median. Goal (issue 34): a 1%
delete at 10M plans within 1.2x the memory of the same at 1M.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, threading, time, statistics
import mv_assets as mv
page = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * page

db = mv.connect(sys.argv[1], runner=mv.InlineRunner())
view = db.open_view("v")
view.refresh_state()
kw = {"fragments": [max(db.open_table("src").fragment_ids())]} if sys.argv[3] == "scoped" else {}
times, peaks = [], []
for _ in range(int(sys.argv[2])):
    base, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.0005)

    t = threading.Thread(target=sample)
    t.start()
    t0 = time.perf_counter()
    plan = view.plan_refresh(**kw)
    times.append(time.perf_counter() - t0)
    done.set()
    t.join()
    peaks.append(max(peak[0], rss()) - base)
print("RESULT " + json.dumps({"mb": max(peaks) / 2**20, "s": statistics.median(times),
                              "deleted": plan.rows_to_delete, "updated": plan.rows_to_update}))
"""


def build(rows: int, chunk: bool = False) -> str:
    import typing

    import pyarrow as pa

    import mv_assets as mv

    uri = os.path.join(tempfile.mkdtemp(prefix="mvdelete-"), "catalog")
    db = mv.connect(uri, runner=mv.InlineRunner())
    ids = pa.array(range(rows), pa.int64())
    if chunk:
        class Piece(typing.NamedTuple):
            text: str

        @mv.chunker
        def halves(body: str) -> typing.Iterator[Piece]:
            words = body.split()
            yield Piece(" ".join(words[:2]))
            yield Piece(" ".join(words[2:]))

        src = db.create_table("src", pa.table({"id": ids, "body": pa.array(["a b c d"] * rows)}), primary_key="id")
        db.create_udtf_view("v", src.search(None).select(["id"]), halves).refresh()
        src.delete("id % 100 = 7")
        src.update("id < 1000", values_sql={"body": "'e f g h'"})
        return uri
    src = db.create_table("src", pa.table({"id": ids, "x": ids}), primary_key="id")
    db.create_materialized_view("v", src.search(None).where("x >= 0").select({"id": "id", "x": "x"})).refresh()
    src.delete("id % 100 = 7")
    src.update("id < 1000", values_sql={"x": "x + 1"})
    return uri


def measure(uri: str, checkout: str | None, repeat: int, scoped: bool = False) -> dict:
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = checkout + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", CHILD, uri, str(repeat), "scoped" if scoped else "whole"], capture_output=True, text=True, env=env,
                          cwd=checkout or None)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(line[0][7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compare", help="another checkout's root, measured the same way")
    p.add_argument("--scoped", action="store_true", help="plan a refresh of one source fragment (a partition run)")
    p.add_argument("--chunk", action="store_true", help="a chunk view (two children a row) instead of a 1:1 view")
    args = p.parse_args()
    print(f"{'rows':>12} {'plan MB':>9} {'plan s':>8}" + (f" {'compared MB':>12} {'compared s':>11}" if args.compare else ""))
    first = {}
    for rows in args.rows:
        t0 = time.perf_counter()
        uri = build(rows, args.chunk)
        built = time.perf_counter() - t0
        now = measure(uri, None, args.repeat, args.scoped)
        line = f"{rows:>12,} {now['mb']:>9.1f} {now['s']:>8.3f}"
        if args.compare:
            old = measure(uri, args.compare, args.repeat, args.scoped)
            line += f" {old['mb']:>12.1f} {old['s']:>11.3f}"
        first.setdefault("mb", now["mb"])
        print(line + f"   (-{now['deleted']:,} ~{now['updated']:,}; built in {built:.0f} s)", flush=True)
    if len(args.rows) > 1:
        print(f"memory of the largest / the smallest: {now['mb'] / max(first['mb'], 1e-9):.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
