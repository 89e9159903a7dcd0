"""An arrangement: a relation's integer key columns kept in memory, by row,
so that finding the rows holding some key values costs a probe of memory,
not a read of the relation (Materialize's arrangements, seed 004: the
indexed state an incremental join keeps between updates).

A join view's refresh asks two questions every time a source changes:
which view rows came from these source rows (by the stable row ids each
view row keeps), and which first-table rows hold these join key values (a
joined row's key, probed to the first table). Answered from Lance each time,
both read a whole column of the view or of the first table (~0.2-0.9 s at
10M rows); answered from an arrangement, one pass over the key arrays in
memory, a byte-table lookup a row over the probed ids' span (~5 ns a row,
0.02-0.06 s at 10M rows), with no sort and no build beyond the read that
loads it (:mod:`mv_assets.ops.arrangements` loads, keeps and brings them up
to date). The pass is O(rows) in memory; a sorted index would make a probe
O(probed rows) at a sort of each key column when loaded (~2 s a random
column at 10M rows): not built; nor a table from each value of a column of
distinct values to its slot (no sort, but 0.5 s to build at 10M rows once
rows have died, against the 0.03 s pass it saves a probe: measured in
docs/performance.md, seventh session).

Rows are removed by id (their slots marked dead, dropped once a quarter of
the rows are dead) and added in chunks (merged into one when there are
many): an arrangement follows its relation's changes in O(changed rows)
(the removal's mark: a pass over the ids in memory).

Pure: numpy only (a probe of millions of values runs in parts on threads: numpy lets go of the GIL).

>>> a = Arrangement("id", {"id": np.array([10, 11, 12]), "k": np.array([5, 7, 5])},
...                 {"k": np.array([True, True, False])})
>>> a.rows(a.find({"k": np.array([5])}))["id"].tolist()   # (row 12's key is NULL)
[10]
>>> a.remove(np.array([10]))
>>> a.add({"id": np.array([13]), "k": np.array([5])})
>>> a.rows(a.find({"k": np.array([5, 7])}))["id"].tolist()
[11, 13]
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from mv_assets.model.planning import Membership

__all__ = ["Arrangement", "key_codes", "HASHED", "HASH_VERSION"]

# More chunks than this (rows added since the last merge) are merged into one.
MAX_CHUNKS = 8
# Dead slots dropped when they are at least this share of the slots.
DEAD_SHARE = 0.25


class Arrangement:
    """Int64 columns of a relation, one slot a row: ``id`` names the column
    holding each row's id (distinct); ``valid``: per column, which rows hold
    a value (a NULL matches nothing; absent: every row)."""

    def __init__(self, id_column: str, columns: dict[str, np.ndarray],
                 valid: dict[str, np.ndarray] | None = None) -> None:
        self.id_column = id_column
        self.names = list(columns)
        self._chunks: list[dict[str, np.ndarray]] = []
        self._alive: list[np.ndarray] = []
        self._live: list[int] = []  # live rows a chunk (kept: no pass over the alive masks to count)
        self.generation = 0  # moves when slots move (a merge): slots :meth:`find` gave stay valid until then
        self._add(columns, valid)

    # -- reading -----------------------------------------------------------------

    def __len__(self) -> int:
        return int(sum(self._live))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for c in self._chunks for a in c.values()) + sum(a.nbytes for a in self._alive)

    def find(self, wanted: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Per chunk, the slots of the live rows whose value in some column of
        ``wanted`` is one of its values (the union over the columns)."""
        probes = {name: _Probe(np.asarray(values, np.int64)) for name, values in wanted.items() if len(values)}
        out = []
        for chunk, alive in zip(self._chunks, self._alive, strict=True):
            hit = None
            for name, probe in probes.items():
                match = probe.mask(chunk[name])
                valid = chunk.get(_valid(name))
                if valid is not None:
                    match &= valid  # (a NULL's placeholder matches nothing)
                if hit is None:
                    hit = match
                else:
                    hit |= match
            if hit is None:
                out.append(np.empty(0, np.int64))
                continue
            hit &= alive
            out.append(np.flatnonzero(hit))
        return out

    def rows(self, slots: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The columns of the rows at ``slots`` (as :meth:`find` returns them);
        a NULL reads -1 (no row id is)."""
        if not slots:
            return {name: np.empty(0, np.int64) for name in self.names}
        out = {}
        for name in self.names:
            parts = []
            for chunk, s in zip(self._chunks, slots, strict=True):
                part, valid = chunk[name][s], chunk.get(_valid(name))
                parts.append(part if valid is None else np.where(valid[s], part, -1))
            out[name] = np.concatenate(parts)
        return out

    # -- saving ------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        """Its live rows as plain arrays (merged into one chunk first): each
        column, and ``valid:<column>`` for a column holding NULLs; what
        :meth:`restore` takes."""
        if len(self._chunks) > 1 or sum(self._live) < sum(len(a) for a in self._alive):
            self._merge()
        chunk = self._chunks[0]
        return {("valid:" + k[1:] if k.startswith("\0") else k): v for k, v in chunk.items()}

    @classmethod
    def restore(cls, id_column: str, state: dict[str, np.ndarray]) -> "Arrangement":
        """The arrangement :meth:`state` gave."""
        columns = {k: v for k, v in state.items() if not k.startswith("valid:")}
        valid = {k.removeprefix("valid:"): v for k, v in state.items() if k.startswith("valid:")}
        return cls(id_column, columns, valid)

    # -- changing ----------------------------------------------------------------

    def remove(self, ids: np.ndarray) -> None:
        """Forget the rows with these ids (those it holds)."""
        if not len(ids):
            return
        gone = _Probe(np.asarray(ids, np.int64))
        for k, (chunk, alive) in enumerate(zip(self._chunks, self._alive, strict=True)):
            dead = alive & gone.mask(chunk[self.id_column])
            alive &= ~dead
            self._live[k] -= int(np.count_nonzero(dead))
        slots = sum(len(a) for a in self._alive)
        if slots - sum(self._live) >= DEAD_SHARE * slots:
            self._merge()

    def kill(self, finds: list[list[np.ndarray]]) -> int:
        """Forget the rows at the slots some :meth:`find` calls gave (at this
        :attr:`generation`; one of them may find a row another found):
        O(slots), no pass over the ids. The rows forgotten."""
        gone = 0
        for slots in finds:
            if len(slots) > len(self._chunks):  # (chunks added since keep their slots; a merge moves them)
                raise ValueError(f"slots of {len(slots)} chunks given to an arrangement of {len(self._chunks)}")
            for k, (alive, s) in enumerate(zip(self._alive, slots, strict=False)):
                if not len(s):
                    continue
                dead = int(np.count_nonzero(alive[s]))  # (a find's slots are distinct a chunk)
                alive[s] = False
                self._live[k] -= dead
                gone += dead
        slots_total = sum(len(a) for a in self._alive)
        if slots_total - sum(self._live) >= DEAD_SHARE * slots_total:
            self._merge()
        return gone

    def add(self, columns: dict[str, np.ndarray], valid: dict[str, np.ndarray] | None = None) -> None:
        """Rows added to the relation (their ids new to it, or removed first)."""
        self._add(columns, valid)
        if len(self._chunks) > MAX_CHUNKS:
            self._merge()

    def _add(self, columns: dict[str, np.ndarray], valid: dict[str, np.ndarray] | None) -> None:
        if set(columns) != set(self.names) or self.id_column not in columns:
            raise ValueError(f"an arrangement of {self.names} was given {sorted(columns)}")
        chunk = {name: np.ascontiguousarray(columns[name], dtype=np.int64) for name in self.names}
        n = len(chunk[self.id_column])
        for name, mask in (valid or {}).items():
            mask = np.asarray(mask, dtype=bool)
            if not mask.all():
                chunk[_valid(name)] = mask
        if n or not self._chunks:
            self._chunks.append(chunk)
            self._alive.append(np.ones(n, dtype=bool))
            self._live.append(n)

    def _merge(self) -> None:
        """One chunk of the live rows."""
        keys = {k for c in self._chunks for k in c}
        merged = {}
        for k in keys:
            parts = []
            for chunk, alive in zip(self._chunks, self._alive, strict=True):
                n = len(alive)
                part = chunk.get(k, np.ones(n, dtype=bool) if k.startswith("\0") else None)
                assert part is not None
                parts.append(part[alive])
            merged[k] = np.concatenate(parts)
        self._chunks = [merged]
        self.generation += 1
        self._alive = [np.ones(len(merged[self.id_column]), dtype=bool)]
        self._live = [len(merged[self.id_column])]


# Values a step of a probe: its temporaries stay in cache.
_BLOCK = 1 << 18
# A lookup table of one byte a value of the probed values' span, up to this many bytes
# (else :class:`Membership`'s bitmap or sorted array).
_TABLE_MAX = 1 << 26
# The low-bits table of ids far apart: 64 slots an id, at most this many bits' worth (16 MiB).
_FILTER_BITS = 24


# A probe of at least twice this many values runs in parts on threads (one a CPU, at most 4):
# at 10M values, 0.018 s on 2 cores against 0.034 s.
_PARALLEL_MIN = 1 << 20
_CPUS = min(4, os.cpu_count() or 1)
_POOL: "tuple[int, ThreadPoolExecutor] | None" = None


def _pool() -> ThreadPoolExecutor:
    """This process's probe threads (a process forked from one that had them makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(_CPUS, thread_name_prefix="mv-assets-probe"))
    return _POOL[1]


class _Probe:
    """Membership of a column's values in a set of ids: a byte table over the
    ids' span (one gather a value) when it is small; else (hashed keys, ids
    far apart) a byte table over the values' low bits first, which passes
    every member and about one value in 64 of the others, and
    :class:`Membership` only for the values it passes."""

    def __init__(self, ids: np.ndarray) -> None:
        self._table: np.ndarray | None = None
        self._set: Membership | None = None
        if not len(ids):
            self._lo, self._span, self._shift = 0, 0, np.int64(-1)
            self._table = np.zeros(2, dtype=bool)
            return
        lo, hi = int(ids.min()), int(ids.max())
        if hi - lo + 1 <= _TABLE_MAX:
            self._lo, self._span = lo, hi - lo + 1
            with np.errstate(over="ignore"):  # (lo - 1 of the smallest int64 wraps: values minus it still land right)
                self._shift = np.int64(lo) - np.int64(1)
            # (slot 0: every value below the span, the last: every value above; a value is clipped into them)
            self._table = np.zeros(self._span + 2, dtype=bool)
            self._table[ids - lo + 1] = True
        else:
            self._set = Membership(ids)
            self._low = (1 << min(max(16, (64 * len(ids)).bit_length()), _FILTER_BITS)) - 1
            self._table = np.zeros(self._low + 1, dtype=bool)
            self._table[ids & self._low] = True

    def mask(self, values: np.ndarray) -> np.ndarray:
        out = np.empty(len(values), dtype=bool)
        fill = self._mask_into if self._set is None else self._filter_into
        threads = min(_CPUS, len(values) // _PARALLEL_MIN)
        if threads < 2:
            fill(values, out)
        else:
            step = -(-len(values) // threads)  # (numpy lets go of the GIL: the parts run at once)
            parts = [_pool().submit(fill, values[k:k + step], out[k:k + step]) for k in range(0, len(values), step)]
            for part in parts:
                part.result()
        if self._set is not None:  # (those the low bits pass: checked against the ids themselves)
            passed = np.flatnonzero(out)
            out[passed] = self._set.mask(values[passed])
        return out

    def _mask_into(self, values: np.ndarray, out: np.ndarray) -> None:
        assert self._table is not None
        rel = np.empty(min(len(values), _BLOCK), np.int64)
        for start in range(0, len(values), _BLOCK):
            part = values[start:start + _BLOCK]
            at = rel[:len(part)]
            np.subtract(part, self._shift, out=at)  # (wrapping: a value 2**63 or more above lo - 1 goes negative)
            np.clip(at, 0, self._span + 1, out=at)  # (one pass each, no temporaries: ~30% faster than a mask)
            np.take(self._table, at, out=out[start:start + _BLOCK])

    def _filter_into(self, values: np.ndarray, out: np.ndarray) -> None:
        assert self._table is not None
        rel = np.empty(min(len(values), _BLOCK), np.int64)
        for start in range(0, len(values), _BLOCK):
            at = rel[:len(values[start:start + _BLOCK])]
            np.bitwise_and(values[start:start + _BLOCK], self._low, out=at)
            np.take(self._table, at, out=out[start:start + _BLOCK])


def _valid(name: str) -> str:
    return "\0" + name


# -- keys as int64 codes -------------------------------------------------------------
#
# An arrangement holds int64 values. An integer key is its own code; a string
# or binary key is held as a 64-bit hash of its bytes, so text keys (customer
# codes, UUIDs as text) are probed in memory as integer keys are, where a
# filtered scan read the first table's key column at each refresh. Two
# different keys may share a code (about one pair in 2**64 / rows**2): a probe
# then also finds the rows of the other key, which are computed again and come
# out the same (found is a superset: nothing is missed, nothing wrong is kept).

# Key types held as a hash of their bytes (equal bytes, equal code; a string and
# a large string alike).
HASHED = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
# The hash's version: part of the name of an arrangement of hashed keys (copies on
# disk written with another hash are never read).
HASH_VERSION = 1
_P = 0x100000001B3  # (FNV's 64-bit prime: odd, so invertible modulo 2**64)
_P_INV = pow(_P, -1, 1 << 64)
_ROWS = 2048  # strings a step (their bytes' passes stay in cache)
_POWERS: tuple[np.ndarray, np.ndarray] = (np.ones(1, np.uint64), np.ones(1, np.uint64))


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**k and P**-k (mod 2**64) for k < n, at least (the pair replaced
    whole when grown: a probe in another thread reads one pair or the other)."""
    global _POWERS
    powers = _POWERS
    if len(powers[0]) < n:
        m = max(n, 2 * len(powers[0]))
        with np.errstate(over="ignore"):
            up, down = (np.concatenate([[np.uint64(1)], np.cumprod(np.full(m - 1, p, np.uint64))])
                        for p in (_P, _P_INV))
        powers = _POWERS = (up, down)
    return powers[0], powers[1]


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of the code depends on every bit of ``z``."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _hashed(values: pa.Array) -> np.ndarray:
    """The codes of a string or binary array: a polynomial hash of each value's
    bytes (sum of (byte + 1) * P**j, modulo 2**64) mixed with its length. Found
    for many values at once: a running sum over the bytes of ``_ROWS`` values
    weighted by powers of P, each value's part of it taken out and brought
    back to power 0. A NULL's code is its placeholder's (the arrangement keeps
    validity apart)."""
    wide = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    out = np.empty(len(values), np.uint64)
    with np.errstate(over="ignore"):
        for at in range(0, len(values), _ROWS):
            part = values.slice(at, _ROWS)
            buffers = part.buffers()
            offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[part.offset:part.offset + len(part) + 1]
            lo, n = int(offsets[0]), int(offsets[-1] - offsets[0])
            data = np.frombuffer(buffers[2], np.uint8, count=n, offset=lo).astype(np.uint64) if n else \
                np.empty(0, np.uint64)
            data += np.uint64(1)
            power, inverse = _powers(n + 1)
            np.multiply(data, power[:n], out=data)
            running = np.empty(n + 1, np.uint64)
            running[0] = 0
            np.cumsum(data, out=running[1:])
            rel = (offsets - lo).astype(np.int64)
            raw = (running[rel[1:]] - running[rel[:-1]]) * inverse[rel[:-1]]
            raw ^= np.diff(rel).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            out[at:at + len(part)] = _mix(raw)
    return out.view(np.int64)


def key_codes(values: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    """Key values as the int64 codes an arrangement holds: an integer as
    itself, a string or binary value as a hash of its bytes (:data:`HASHED`).
    A NULL's code is a placeholder (0 for integers): pass validity apart."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    out = np.empty(len(values), np.int64)
    at = 0
    for chunk in chunks:
        if any(is_type(chunk.type) for is_type in HASHED):
            out[at:at + len(chunk)] = _hashed(chunk)
        else:
            if chunk.null_count:
                chunk = chunk.fill_null(0)
            out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)  # (uint64 ids: below 2**63, the same value)
        at += len(chunk)
    return out
