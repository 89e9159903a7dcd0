"""Process-wide thread pools, started once and started again in a forked child.

Starting threads per call costs up to 35 ms on a busy 2-core machine, so the
engine keeps a few named pools for the life of the process. A forked child
(Spark's Python workers fork) has none of its parent's threads: a pool
inherited from the parent would queue work no thread runs, so every pool is
forgotten at fork and started afresh when the child first asks for it.
"""

import concurrent.futures
import os
import threading

__all__ = ["pool"]

_POOLS: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_POOLS.clear)


def pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool ``name`` (``workers`` threads), started on first use."""
    with _LOCK:
        found = _POOLS.get(name)
        if found is None:
            found = _POOLS[name] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"mv_assets-{name}")
        return found
