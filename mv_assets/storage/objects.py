"""Where bytes live: a catalog on a local path or an object store (s3://,
gs://, az://, memory://), with its storage options.

Every dataset the engine opens and every state file it writes goes through
here, so the same code runs against a local directory and a bucket:

* Lance calls (:func:`dataset`, :func:`write_dataset`, :func:`commit`,
  :func:`write_fragments`, :func:`file_writer`) get the storage options
  registered for the URI's catalog (:func:`register`);
* small state files (:func:`put_bytes`, :func:`get_bytes`, :func:`listdir`,
  :func:`remove_tree`, Arrow and text helpers) use the local filesystem for
  local paths (temp file + rename: whole or absent) and ``obstore`` for object
  stores (a PUT is whole or absent; ``create=True`` is a conditional PUT that
  fails when the object exists, the primitive leases are built on).

Options are registered per catalog root in this process; runners ship the
registry to executors with each job (:func:`registered` /
:func:`register_all`), so nothing depends on executors' environment.
"""

import contextlib
import contextvars
import copy
import json
import os
import posixpath
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import lance
import pyarrow as pa
from lance.file import LanceFileWriter
from lance.fragment import write_fragments as _write_fragments

__all__ = [
    "is_local", "join", "register", "registered", "register_all", "options_for", "dataset", "write_dataset",
    "commit", "write_fragments", "file_writer", "put_bytes", "get_bytes", "exists", "listdir", "remove",
    "remove_tree", "size", "write_arrow", "read_arrow", "write_text", "read_text", "is_dataset", "rename_tree",
    "copy_tree", "reusing_handles", "read_transaction", "write_record", "read_record", "retire_record",
    "committed_in_place", "get_tagged", "put_tagged",
]

_OPTIONS: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()
_STORES: dict[tuple, Any] = {}


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for a path or a URI."""
    return os.path.join(root, *parts) if is_local(root) else posixpath.join(root, *parts)


# -- storage options --------------------------------------------------------


def register(root: str, options: dict[str, str] | None) -> dict[str, str] | None:
    """Use ``options`` for every URI under ``root`` (a catalog) in this
    process; returns the options they replace (None: none, or the same)."""
    if not options:
        return None
    given = {str(k): str(v) for k, v in options.items()}
    with _LOCK:
        before = _OPTIONS.get(root.rstrip("/"))
        _OPTIONS[root.rstrip("/")] = given
    return before if before is not None and before != given else None


def registered_at(root: str) -> dict[str, str] | None:
    """The options registered for exactly ``root`` (None: none)."""
    with _LOCK:
        opts = _OPTIONS.get(root.rstrip("/"))
    return dict(opts) if opts is not None else None


def restore(root: str, options: dict[str, str] | None) -> None:
    """Put back what :func:`registered_at` read for ``root`` before a :func:`register`."""
    with _LOCK:
        if options is None:
            _OPTIONS.pop(root.rstrip("/"), None)
        else:
            _OPTIONS[root.rstrip("/")] = dict(options)


def registered() -> dict[str, dict[str, str]]:
    """The registry, to ship to executors with a job."""
    with _LOCK:
        return {k: dict(v) for k, v in _OPTIONS.items()}


def register_all(options: dict[str, dict[str, str]] | None) -> None:
    for root, opts in (options or {}).items():
        register(root, opts)


def options_for(uri: str) -> dict[str, str] | None:
    """The options of the catalog holding ``uri`` (longest registered prefix)."""
    best = None
    with _LOCK:
        for root, opts in _OPTIONS.items():
            if (uri == root or uri.startswith(root + "/")) and (best is None or len(root) > len(best[0])):
                best = (root, opts)
    return dict(best[1]) if best else None


# -- Lance ------------------------------------------------------------------


# Within :func:`reusing_handles`: uri -> {version: handle} of the datasets opened.
_HANDLES: contextvars.ContextVar[dict[str, dict[int, lance.LanceDataset]] | None] = contextvars.ContextVar(
    "mv_assets_handles", default=None
)
# ... and (uri, version) -> the transaction of that version, read once.
_TXNS: contextvars.ContextVar[dict[tuple[str, int], Any] | None] = contextvars.ContextVar("mv_assets_txns", default=None)
# ... and, in a snapshot block, uri -> the latest version read first (read once).
_LATEST: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("mv_assets_latest", default=None)


@contextlib.contextmanager
def reusing_handles(snapshot: bool = False):
    """Within this block (one refresh, one status read), :func:`dataset` opens
    each dataset once: other versions are checked out of a handle already open
    (~0.1 ms instead of ~0.35 ms locally; no manifest listing on an object
    store) and "latest" asks that handle for the newest version number (~0.02
    ms locally, a listing of its versions on an object store), so a version
    written meanwhile, by anyone, is still seen. A version's handle is reused
    only while it still is at that version (some Lance calls move a handle to
    the version they commit). Nested blocks share the outer one.

    ``snapshot``: for reads that write nothing (a status listing, a
    description of the catalog): "latest" is read once per dataset and kept
    for the block, one listing a dataset on an object store."""
    if _HANDLES.get() is not None:
        yield
        return
    token, txn_token = _HANDLES.set({}), _TXNS.set({})
    latest_token = _LATEST.set({}) if snapshot else None
    try:
        yield
    finally:
        _HANDLES.reset(token)
        _TXNS.reset(txn_token)
        if latest_token is not None:
            _LATEST.reset(latest_token)


def with_own_handles(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with handles of its own, for a thread working beside
    others in one :func:`reusing_handles` block (whose pinned versions and
    commits read it still shares): copies of the handles the block holds
    (``copy.copy``: another Rust dataset at the same version, ~3 us, nothing
    read), and those it opens. A pylance handle is not for threads at once:
    its version checkouts, listings and transaction reads take Rust's
    exclusive borrow, and a call on another thread meanwhile raises "Already
    borrowed" (or "Already mutably borrowed")."""
    held = _HANDLES.get()
    if held is None:
        return fn(*args)
    own = {uri: {v: copy.copy(ds) for v, ds in list(by_version.items())} for uri, by_version in list(held.items())}
    token = _HANDLES.set(own)
    try:
        return fn(*args)
    finally:
        _HANDLES.reset(token)
        # what it opened, the block's from now on (the next threads get copies; a handle is
        # never used by two threads at once: nobody holds this one any more)
        for uri, by_version in own.items():
            for v, ds in by_version.items():
                held.setdefault(uri, {}).setdefault(v, ds)


def _known(uri: str, ds: lance.LanceDataset) -> lance.LanceDataset:
    handles = _HANDLES.get()
    if handles is not None:
        handles.setdefault(uri, {})[ds.version] = ds
    return ds


# One Lance session per process for every dataset it opens: its caches
# (manifests, file metadata, indexes) and object stores are shared, so opening a
# dataset costs ~0.02-0.08 ms instead of ~0.23 ms (a new session and object store
# each time), and an index read once serves the next search. Lance keys what it
# caches by the file (a new version, a table made anew, a removed version are
# seen as they are: tests/test_lance_contract.py). Bounded (MB):
# $MV_ASSETS_LANCE_METADATA_CACHE_MB (default 512), $MV_ASSETS_LANCE_INDEX_CACHE_MB
# (default 2048). A forked child makes its own.
_SESSION: "tuple[int, lance.Session] | None" = None  # pyright: ignore[reportPrivateImportUsage]


def _session() -> "lance.Session":  # pyright: ignore[reportPrivateImportUsage]
    global _SESSION
    held = _SESSION
    if held is None or held[0] != os.getpid():
        held = _SESSION = (os.getpid(), lance.Session(  # pyright: ignore[reportPrivateImportUsage]
            metadata_cache_size_bytes=_megabytes("MV_ASSETS_LANCE_METADATA_CACHE_MB", 512),
            index_cache_size_bytes=_megabytes("MV_ASSETS_LANCE_INDEX_CACHE_MB", 2048),
        ))
    return held[1]


def _megabytes(variable: str, default: int) -> int:
    raw = os.environ.get(variable, "").strip()
    try:
        mb = int(raw) if raw else default
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(f"${variable} is a number of megabytes (0 or more), got {raw!r}")
    return mb * 1024 * 1024


# uri -> (pid, handle, version, signature of that version's manifest file): the
# newest version of each local dataset this process opened at its latest or
# committed, kept across :func:`reusing_handles` blocks. A refresh opens its
# view and its source at their latest versions: most often the ones this
# process read or committed last (the view's own last commit, the table its
# add() wrote), whose manifests Lance read or wrote already. Opening such a
# version anew read its manifest again (~0.3-0.5 ms the first time after a
# commit, most of a no-change refresh); a kept one is reused while it is still
# the latest (:func:`_local_latest`) and its manifest file is the one kept
# (same inode, size and time: a table dropped and made again up to the same
# version is opened anew). The handle kept is never handed out: a copy at its
# version is (some Lance calls move a handle to the version they commit).
# Local datasets only. Bounded: cleared when full.
_KEPT: dict[str, tuple[int, lance.LanceDataset, int, tuple]] = {}
_KEPT_MAX = 256


def _manifest_signature(uri: str, version: int) -> tuple | None:
    """(name, inode, size, mtime, ctime) of the manifest file of ``version`` of the
    local dataset at ``uri`` (either of Lance's naming schemes), None when
    there is none."""
    versions = os.path.join(_local_path(uri), "_versions")
    for name in (f"{(1 << 64) - 1 - version:020d}.manifest", f"{version}.manifest"):
        try:
            st = os.stat(os.path.join(versions, name))
        except OSError:
            continue
        return name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
    return None


def _local_latest(uri: str, version: int) -> tuple | None:
    """For a local dataset whose ``version`` is still its newest, that version's
    manifest signature; else None. Lance numbers versions one after another
    (each commit writes the manifest of the next, whole, in place of none),
    but a history cleanup that keeps a tagged version (or is given the
    versions to remove) leaves gaps: the next version's manifest missing says
    nothing of later ones. The newest is read from a listing of the versions
    (:func:`_newest_listed`), listed again only once the directory changed."""
    sig = _manifest_signature(uri, version)
    if sig is None or _manifest_signature(uri, version + 1) is not None:
        return None
    return sig if _newest_listed(uri) == version else None


# uri -> (inode and mtime of its _versions directory, the newest version there): from a
# listing, or a version this process committed or opened at the latest; listed again only
# once the directory changed (a manifest written or removed, by anyone). A change stamped
# with the mtime held (within one tick of a coarse file system clock, right after it) goes
# unseen: a gap needs two commits and a cleanup in that tick, and since 6.13 Linux stamps a
# change made after a stat with a finer time.
_LISTED: dict[str, tuple[int, int, int]] = {}
_V2_MANIFEST = len("18446744073709551614.manifest")


def _versions_dir(uri: str) -> str:
    return os.path.join(_local_path(uri), "_versions")


def _note_newest(uri: str, version: int) -> None:
    """Hold ``version`` as the newest of the local dataset at ``uri`` (this
    process just committed it, or Lance just listed it as the latest) while
    its versions directory stays as it is now."""
    try:
        st = os.stat(_versions_dir(uri))
    except OSError:
        return
    if _manifest_signature(uri, version + 1) is None:  # (looked at after the stat: one written since shows)
        _hold_newest(uri, st, version)


def _hold_newest(uri: str, st: os.stat_result, version: int) -> None:
    if len(_LISTED) >= _KEPT_MAX:
        _LISTED.clear()
    _LISTED[uri] = (st.st_ino, st.st_mtime_ns, version)


def _newest_listed(uri: str) -> int | None:
    """The newest version whose manifest the local dataset at ``uri`` holds
    (either of Lance's naming schemes), None without any."""
    versions = _versions_dir(uri)
    try:
        st = os.stat(versions)
    except OSError:
        return None
    held = _LISTED.get(uri)
    if held is not None and held[0] == st.st_ino and held[1] == st.st_mtime_ns:
        return held[2]
    try:
        names = [n for n in os.listdir(versions) if n.endswith(".manifest")]
    except OSError:
        return None
    # v2 names count down from 2**64 - 1 (the newest sorts first), v1 names are the version
    v2 = [n for n in names if len(n) == _V2_MANIFEST and n[:20].isdigit()]
    v1 = [int(n[:-9]) for n in names if len(n) != _V2_MANIFEST and n[:-9].isdigit()]
    newest = max(([(1 << 64) - 1 - int(min(v2)[:20])] if v2 else []) + v1, default=None)
    if newest is not None:
        _hold_newest(uri, st, newest)
    return newest


def _latest_version(uri: str, handle: lance.LanceDataset) -> int:
    """The newest version of the dataset ``handle`` (of ``uri``) reads: the
    handle's own when it still is (a local dataset, :func:`_local_latest`),
    else as Lance lists it."""
    if is_local(uri):
        v = handle.version
        if _local_latest(uri, v) is not None:
            return v
    return handle.latest_version


def _keep_latest(uri: str, ds: lance.LanceDataset) -> None:
    """Keep ``ds`` (at the newest version of ``uri``, as just opened or committed) for :func:`_kept_latest`."""
    if not is_local(uri):
        return
    try:
        version = ds.version
        sig = _manifest_signature(uri, version)
        copy = ds.checkout_version(version) if sig is not None else None
    except (ValueError, OSError):
        return
    if copy is None or sig is None:
        return
    if len(_KEPT) >= _KEPT_MAX:
        _KEPT.clear()
    _KEPT[uri] = (os.getpid(), copy, version, sig)
    _note_newest(uri, version)


def _kept_latest(uri: str) -> lance.LanceDataset | None:
    """A new handle of the kept version of ``uri`` when it is still the newest
    and its manifest is the one kept; else None (the dataset is opened anew)."""
    kept = _KEPT.get(uri)
    if kept is None:
        return None
    pid, handle, version, sig = kept
    if pid != os.getpid() or _local_latest(uri, version) != sig:
        return None
    try:
        return handle.checkout_version(version)
    except (ValueError, OSError):
        return None


def forget_kept(uri: str | None = None) -> None:
    """Drop the kept handle of ``uri`` (every one: None)."""
    if uri is None:
        _KEPT.clear()
    else:
        _KEPT.pop(uri, None)


def dataset(uri: str, version: int | None = None, **kwargs: Any) -> lance.LanceDataset:
    handles = _HANDLES.get()
    known = handles.get(uri) if handles is not None and not kwargs else None
    if known:
        try:
            # (the newest handle: "latest" is most often its version still)
            some = max(known.values(), key=lambda d: d.version)
            pinned = _LATEST.get()
            if version is None and pinned is not None:
                v = pinned.get(uri)
                if v is None:
                    v = pinned[uri] = _latest_version(uri, some)
            else:
                v = _latest_version(uri, some) if version is None else version
            ds = known.get(v)
            if ds is None or ds.version != v:
                ds = known[v] = some.checkout_version(v)
            return ds
        except (ValueError, OSError):
            pass  # opened anew below: the same error as without the block
    plain = not kwargs
    session = kwargs.pop("session", None) or _session()
    pinned = _LATEST.get()
    if version is None and plain and pinned is not None and uri in pinned:
        # the block's latest, known from a listing already (pin_latest): opened at it, not listed again
        ds = lance.dataset(uri, version=pinned[uri], storage_options=options_for(uri), session=session)
        return _known(uri, ds) if handles is not None else ds
    if version is None and plain and handles is not None:
        kept = _kept_latest(uri)  # (within a block: the latest this process read or committed, still the latest)
        if kept is not None:
            if pinned is not None:
                pinned.setdefault(uri, kept.version)
            return _known(uri, kept)
    ds = lance.dataset(uri, version=version, storage_options=options_for(uri), session=session, **kwargs)
    if version is None and plain:
        _keep_latest(uri, ds)
        if (pinned := _LATEST.get()) is not None:
            pinned.setdefault(uri, ds.version)
    return _known(uri, ds) if handles is not None and plain else ds


def pin_latest(uri: str, version: int) -> None:
    """In a ``reusing_handles(snapshot=True)`` block: the latest version of
    the dataset at ``uri`` is ``version`` (its newest manifest, listed by the
    caller), so opening it reads that manifest (Lance: a HEAD and a GET)
    instead of listing its versions once more. Outside such a block, or once
    the block read the dataset's latest, nothing changes."""
    pinned = _LATEST.get()
    if pinned is not None:
        pinned.setdefault(uri, version)


def read_transaction(ds: lance.LanceDataset, version: int) -> "lance.Transaction | None":
    """``ds.read_transaction(version)``: a version's commit never changes, so
    within :func:`reusing_handles` each is read once (a refresh reads the
    newest ones for its history, its change feed and its writer checks)."""
    txns = _TXNS.get()
    if txns is None:
        return _read_committed(ds, version)
    key = (ds.uri, version)
    if key not in txns:
        txns[key] = _read_committed(ds, version)
    return txns[key]


# (dataset, version, commit time in ns) -> that commit's transaction, kept across
# blocks: what a view's status and its next refresh read first is the commit its
# last refresh made (~0.17 ms of a ~1 ms no-change refresh), remembered as it is
# committed (:func:`commit`, :func:`committed_in_place`) or read. A commit never
# changes, and its time tells a table made anew, or restored from a copy of
# another history, from the one read before. A local dataset's versions are
# keyed by their manifest file instead (name, inode, size and times: one
# ``stat``, for any version, not only the one a handle is at): a refresh reads
# the commits since the version its view reflects, most often made or read by
# this process already (a compaction's, an index update's).
_COMMITTED: dict[tuple, Any] = {}
_COMMITTED_MAX = 1024


def version_signature(uri: str, version: int) -> tuple | None:
    """What the manifest of ``version`` of the dataset at ``uri`` is on
    storage now (a local file's inode, size and times; an object's e-tag,
    size and time), read past every handle and cache; None when there is
    none. A dataset dropped and made again up to the same version number has
    another: a writer that planned on the old one compares it before its
    commit (a commit's read version is only a number)."""
    if is_local(uri):
        return _manifest_signature(uri, version)
    import obstore
    from obstore.exceptions import NotFoundError

    for name in (f"{(1 << 64) - 1 - version:020d}.manifest", f"{version}.manifest"):
        store, key = _store(join(uri, "_versions", name))
        try:
            meta = obstore.head(store, key)
        except (NotFoundError, FileNotFoundError):
            continue
        return name, meta.get("e_tag"), meta.get("size"), str(meta.get("last_modified"))
    return None


def _commit_key(ds: lance.LanceDataset) -> tuple | None:
    """The key of the commit of the version ``ds`` is at."""
    try:
        if is_local(ds.uri):
            return _version_key(ds.uri, ds.version)
        return ds.uri, ds.version, ds._ds.current_version()["timestamp"]
    except Exception:  # (a pylance without it: read every time)
        return None


def _version_key(uri: str, version: int) -> tuple | None:
    """The key of the commit of ``version`` of the local dataset at ``uri`` (None: none to stat)."""
    sig = _manifest_signature(uri, version)
    return None if sig is None else (uri, version, sig)


def _remember(ds: lance.LanceDataset, txn: "lance.Transaction") -> None:
    key = _commit_key(ds)
    if key is not None:
        if len(_COMMITTED) >= _COMMITTED_MAX:
            _COMMITTED.clear()
        _COMMITTED[key] = txn


def committed_in_place(uri: str, ds: lance.LanceDataset) -> None:
    """After a Lance call that committed through the handle ``ds`` (moving it
    to the version it made: a compaction, an index update), its commit is
    remembered (it came with the manifest the handle holds: no read) and the
    handle kept as the newest of ``uri``. What reads those commits next, a
    refresh of a view over the table, reads none of them again."""
    try:
        txns = ds.get_transactions(1)
    except (ValueError, OSError):
        return
    if txns and txns[0] is not None:
        _remember(ds, txns[0])
    _keep_latest(uri, ds)


def _read_committed(ds: lance.LanceDataset, version: int) -> "lance.Transaction | None":
    own = ds.version == version
    try:
        key = _commit_key(ds) if own else _version_key(ds.uri, version) if is_local(ds.uri) else None
    except Exception:
        key = None
    known = _COMMITTED.get(key) if key is not None else None  # (one lookup: another thread may clear it)
    if known is not None:
        return known
    # The handle's own version: its transaction came with the manifest the handle
    # read (Lance 14 writes it inline) and get_transactions(1) serves it from there,
    # where read_transaction(version) reads the manifest again: one more GET on an
    # object store (a new process's status read each view's manifest twice), ~0.07
    # ms instead of ~0.01 locally. The same transaction: tests/test_lance_contract.py.
    txn = ds.get_transactions(1)[0] if own else ds.read_transaction(version)
    if key is not None and txn is not None:
        if len(_COMMITTED) >= _COMMITTED_MAX:
            _COMMITTED.clear()
        _COMMITTED[key] = txn
    return txn


def write_dataset(data: Any, uri: str, **kwargs: Any) -> lance.LanceDataset:
    if kwargs.get("mode") == "append" and "session" not in kwargs:
        # the process's session: its object store and the manifest it cached (~0.8 ms of a
        # 10-row append); the dataset returned opens in it too
        kwargs["session"] = _session()
        ds = lance.write_dataset(data, uri, storage_options=options_for(uri), **kwargs)
        _keep_latest(uri, ds)  # (a refresh of a view over it opens it next)
        return ds
    return lance.write_dataset(data, uri, storage_options=options_for(uri), **kwargs)


def _open_handle(uri: str) -> "str | lance.LanceDataset":
    """A handle of ``uri`` already open in this :func:`reusing_handles` block,
    else ``uri``: Lance writes and commits through an open handle reuse its
    object store instead of setting one up (10 rows written and committed:
    ~0.4-0.8 ms less locally). Any version's handle does: the store is the
    dataset's, and what is written or committed names its own versions."""
    handles = _HANDLES.get()
    known = handles.get(uri) if handles is not None else None
    return next(iter(known.values())) if known else uri


def commit(uri: str, operation: Any, **kwargs: Any) -> lance.LanceDataset:
    ds = _known(uri, lance.LanceDataset.commit(_open_handle(uri), operation, storage_options=options_for(uri),
                                               **kwargs))
    _keep_latest(uri, ds)  # (the next refresh opens it: its manifest is not read again)
    if (isinstance(operation, lance.Transaction) and isinstance(operation.operation, lance.LanceOperation.Append)
            and operation.read_version == ds.version - 1):
        # stored as given (nothing landed between); an Update is not (Lance fills in its update mode)
        _remember(ds, operation)
    return ds


def write_fragments(data: Any, uri: str, **kwargs: Any):
    return _write_fragments(data, _open_handle(uri), storage_options=options_for(uri), **kwargs)


def file_writer(uri: str, schema: pa.Schema, **kwargs: Any) -> LanceFileWriter:
    return LanceFileWriter(uri, schema, storage_options=options_for(uri), **kwargs)


# -- object stores ----------------------------------------------------------

_CLIENT_KEYS = {"allow_http", "allow_invalid_certificates", "timeout", "connect_timeout", "proxy_url", "user_agent",
                "proxy_excludes", "proxy_ca_certificate", "pool_idle_timeout", "pool_max_idle_per_host",
                "http1_only", "http2_only"}
# Lance's names of client options (obstore's as values), and of its retries (obstore's retry_config)
_LANCE_CLIENT = {"request_timeout": "timeout", "aws_allow_http": "allow_http", "azure_allow_http": "allow_http",
                 "google_allow_http": "allow_http"}
_LANCE_RETRY = {"client_max_retries": "max_retries", "client_retry_timeout": "retry_timeout"}
_LANCE_ONLY = {"download_retry_count"}  # (Lance's reads only: the engine's own files have obstore's retries)
_S3_SHORT = {"access_key_id", "secret_access_key", "session_token", "region", "endpoint", "endpoint_url",
             "virtual_hosted_style_request", "skip_signature"}


def _store(uri: str):
    """The obstore store of the bucket holding ``uri`` and the key of ``uri`` in it."""
    from obstore.store import from_url

    parsed = urlparse(uri)
    base = f"{parsed.scheme}://{parsed.netloc}"
    opts = options_for(uri) or {}
    key = (base, tuple(sorted(opts.items())))
    with _LOCK:
        store = _STORES.get(key)
    if store is None:
        config, client, retry = {}, {}, {}
        for k, v in opts.items():
            k = k.lower()
            k = _LANCE_CLIENT.get(k, k)
            if k in _CLIENT_KEYS:
                client[k] = v.lower() == "true" if v.lower() in ("true", "false") else v
            elif k in _LANCE_RETRY:
                retry[_LANCE_RETRY[k]] = int(v) if k == "client_max_retries" else timedelta(seconds=float(v))
            elif k in _LANCE_ONLY:
                continue
            elif parsed.scheme == "s3" and k in _S3_SHORT:
                config["aws_endpoint" if k == "endpoint_url" else f"aws_{k}"] = v
            elif parsed.scheme in ("memory",):
                continue
            else:
                config[k] = v
        kwargs: dict[str, Any] = {}
        if config:
            kwargs["config"] = config
        if client:
            kwargs["client_options"] = client
        if retry:
            kwargs["retry_config"] = retry
        store = from_url(base, **kwargs)
        with _LOCK:
            _STORES[key] = store
    return store, parsed.path.lstrip("/")


def put_bytes(uri: str, data: bytes, *, create: bool = False, durable: bool = True) -> bool:
    """Write ``data`` whole (readers see the old object or the new one). With
    ``create``, only if nothing is there: False when something was.
    ``durable=False`` (local files): no fsync; whole or absent still holds for
    every reader and after a process crash, not after an OS crash (for records
    that describe a running process, like a view's load state)."""
    if is_local(uri):
        path = _local_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if create:
            try:
                os.link(tmp, path)  # fails if the path exists: atomic create
            except FileExistsError:
                return False
            finally:
                os.remove(tmp)
            return True
        os.replace(tmp, path)
        return True
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, key = _store(uri)
    try:
        obstore.put(store, key, data, mode="create" if create else "overwrite")
    except (AlreadyExistsError, PreconditionError):
        return False
    return True


def get_bytes(uri: str) -> bytes | None:
    """The object's bytes, None when there is none."""
    if is_local(uri):
        try:
            with open(_local_path(uri), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _store(uri)
    try:
        return bytes(obstore.get(store, key).bytes())
    except (NotFoundError, FileNotFoundError):
        return None


def _local_tag(path: str) -> str | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return f"{st.st_size}:{st.st_ino}:{st.st_mtime_ns}"


@contextlib.contextmanager
def _local_guard(path: str):
    """Writers of one local file, one at a time (a lock on a file beside it):
    what the object store's conditional requests give."""
    import filelock

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with filelock.FileLock(path + ".guard"):
        yield


def get_tagged(uri: str) -> tuple[bytes, str] | None:
    """The object's bytes and a tag that changes with every write of it (its
    e-tag; a local file's size, inode and modification time), or None when
    there is none: what :func:`put_tagged` is conditional on."""
    if is_local(uri):
        path = _local_path(uri)
        with _local_guard(path):
            tag = _local_tag(path)
            try:
                with open(path, "rb") as fh:
                    return (fh.read(), tag) if tag is not None else None
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _store(uri)
    try:
        got = obstore.get(store, key)
    except (NotFoundError, FileNotFoundError):
        return None
    return bytes(got.bytes()), _tag_of(got.meta)


def put_tagged(uri: str, data: bytes, *, tag: str | None = None) -> str | None:
    """Write ``data`` whole if nothing is there (``tag`` None) or if the
    object is still the one ``tag`` names (a conditional PUT, ``If-Match``
    on its e-tag): its new tag, None when the condition failed (someone
    wrote or removed it since). What leases are taken over and renewed with:
    of two writers that read the same object, one wins."""
    if is_local(uri):
        path = _local_path(uri)
        with _local_guard(path):
            if _local_tag(path) != tag:
                return None
            put_bytes(uri, data)
            return _local_tag(path)
    import obstore
    from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

    store, key = _store(uri)
    mode: Any = "create"
    if tag is not None:
        e_tag, _, version = tag.partition("\n")
        mode = {k: v for k, v in (("e_tag", e_tag), ("version", version)) if v}
    try:
        done = obstore.put(store, key, data, mode=mode)
    except (AlreadyExistsError, PreconditionError, NotFoundError, FileNotFoundError):
        return None
    return _tag_of(done)


def _tag_of(meta) -> str:
    """An object's e-tag and version (a GCS generation; None elsewhere) as one tag."""
    return f"{meta.get('e_tag') or ''}\n{meta.get('version') or ''}"


def exists(uri: str) -> bool:
    if is_local(uri):
        return os.path.exists(_local_path(uri))
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _store(uri)
    try:
        obstore.head(store, key)
        return True
    except (NotFoundError, FileNotFoundError):
        return bool(listdir(uri))  # a "directory": some object under it


def size(uri: str) -> int:
    if is_local(uri):
        return os.path.getsize(_local_path(uri))
    import obstore

    store, key = _store(uri)
    return int(obstore.head(store, key)["size"])


def listdir(uri: str) -> list[str]:
    """Names directly under ``uri`` (files and folders), sorted; [] if none."""
    if is_local(uri):
        path = _local_path(uri)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    import obstore

    store, key = _store(uri)
    prefix = key.rstrip("/") + "/" if key else None
    res = obstore.list_with_delimiter(store, prefix=prefix)
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"]]
    names += [o["path"].rsplit("/", 1)[-1] for o in res["objects"]]
    return sorted(set(names))


def stamped(uri: str) -> list[tuple[str, str]]:
    """The files directly under ``uri`` (not folders), sorted, each with a
    stamp that tells that object from any other ever written there: its size
    and e-tag (or last-modified time) on an object store, its size, inode and
    nanosecond modification time on a local disk. One listing; [] if none."""
    if is_local(uri):
        try:
            with os.scandir(_local_path(uri)) as it:
                found = []
                for e in it:
                    if e.is_file():
                        st = e.stat()
                        found.append((e.name, f"{st.st_size}:{st.st_ino}:{st.st_mtime_ns}"))
                return sorted(found)
        except (FileNotFoundError, NotADirectoryError):
            return []
    import obstore

    store, key = _store(uri)
    res = obstore.list_with_delimiter(store, prefix=key.rstrip("/") + "/" if key else None)
    return sorted((o["path"].rsplit("/", 1)[-1], f"{o['size']}:{o.get('e_tag') or o['last_modified'].isoformat()}")
                  for o in res["objects"])


def remove(uri: str) -> None:
    """Remove one object or file (nothing if absent)."""
    if is_local(uri):
        try:
            os.remove(_local_path(uri))
        except FileNotFoundError:
            pass
        return
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _store(uri)
    try:
        obstore.delete(store, key)
    except (NotFoundError, FileNotFoundError):
        pass


def remove_tree(uri: str) -> None:
    """Remove everything under ``uri``."""
    if is_local(uri):
        import shutil

        shutil.rmtree(_local_path(uri), ignore_errors=True)
        return
    import obstore

    store, key = _store(uri)
    paths = [o["path"] for batch in obstore.list(store, prefix=key.rstrip("/") + "/") for o in batch]
    if paths:
        obstore.delete(store, paths)


def rename_tree(src: str, dst: str) -> None:
    """Move a local directory in one ``rename`` (same filesystem; ``dst`` must
    not exist). Object stores have no such call: see :func:`copy_tree`."""
    if not is_local(src) or not is_local(dst):
        raise ValueError(f"rename_tree moves local directories only, not {src} -> {dst}")
    os.rename(_local_path(src), _local_path(dst))


def copy_tree(src: str, dst: str, *, last: str = "_versions") -> int:
    """Copy every object under ``src`` to the same key under ``dst`` (server-side
    copies on object stores); objects under ``src/last`` go after all others,
    so a Lance dataset appears at ``dst`` only once its data files are there
    (locally a plain ``copytree``). Not atomic: a reader can see a partial
    copy. Returns the files copied."""
    if is_local(src):
        import shutil

        shutil.copytree(_local_path(src), _local_path(dst), dirs_exist_ok=True)
        return sum(len(files) for _, _, files in os.walk(_local_path(dst)))
    import obstore

    if urlparse(src)[:2] != urlparse(dst)[:2]:
        raise ValueError(f"copy_tree copies within one bucket, not {src} -> {dst}")
    store, key = _store(src)
    _, dst_key = _store(dst)
    prefix = key.rstrip("/") + "/"
    paths = [o["path"] for batch in obstore.list(store, prefix=prefix) for o in batch]
    tail = prefix + last.strip("/") + "/"
    for path in sorted(paths, key=lambda p: p.startswith(tail)):  # False (data) first, True (manifests) last
        obstore.copy(store, path, dst_key.rstrip("/") + "/" + path[len(prefix):])
    return len(paths)


def is_dataset(uri: str) -> bool:
    """Whether a Lance dataset lives at ``uri``: a manifest under ``_versions``
    (the first entry found answers: a table's history can hold thousands)."""
    versions = join(uri, "_versions")
    if is_local(versions):
        held = _LISTED.get(uri)
        if held is not None:  # a manifest was there, listed or committed: still, while the directory is as it was
            try:
                st = os.stat(_local_path(versions))
            except OSError:
                return False
            if st.st_ino == held[0] and st.st_mtime_ns == held[1]:
                return True
        try:
            with os.scandir(_local_path(versions)) as it:
                return any(True for _ in it)
        except (FileNotFoundError, NotADirectoryError):
            return False
    return bool(listdir(versions))


def write_arrow(uri: str, table: pa.Table, *, create: bool = False) -> bool:
    """``table`` as an Arrow IPC file, whole or not at all."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return put_bytes(uri, sink.getvalue().to_pybytes(), create=create)


# An IPC file holds its buffers at 8 bytes. Lance (arrow-rs) panics on a
# decimal buffer not at 16 ("Memory pointer from external source ... is not
# aligned"), and pyarrow's type-specific alignment takes 8 as enough for one:
# a file holding a decimal anywhere (an aggregate view's max(d) of a decimal,
# its new rows handed to the task; a UDF's decimal results checkpointed) is
# read with its buffers copied to 64 bytes where they are not; any other is
# mapped as it is.
_ALIGNED = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.At64Byte)


def _holds_wide_values(t: pa.DataType) -> bool:
    """Whether values of ``t`` (or of a type nested in it) are 16 bytes or more."""
    if pa.types.is_decimal(t) or pa.types.is_interval(t):
        return True
    return any(_holds_wide_values(t.field(i).type) for i in range(t.num_fields))


def _read_ipc(source: Any) -> pa.Table:
    reader = pa.ipc.open_file(source)
    if any(_holds_wide_values(f.type) for f in reader.schema):
        reader = pa.ipc.open_file(source, options=_ALIGNED)
    return reader.read_all()


def read_arrow(uri: str) -> pa.Table:
    """An Arrow IPC file (memory-mapped when local: columns are paged in when
    used; a decimal's buffers copied, aligned)."""
    if is_local(uri):
        with pa.memory_map(_local_path(uri)) as source:
            return _read_ipc(source)
    data = get_bytes(uri)
    if data is None:
        raise FileNotFoundError(uri)
    return _read_ipc(pa.py_buffer(data))


def write_text(uri: str, text: str, *, create: bool = False, durable: bool = True) -> bool:
    return put_bytes(uri, text.encode(), create=create, durable=durable)


def read_text(uri: str) -> str | None:
    data = get_bytes(uri)
    return None if data is None else data.decode()


# -- small records rewritten in place --------------------------------------

def _sealed(body: bytes) -> bytes:
    return body + b"\n%08x\n" % zlib.crc32(body)


def _unsealed(data: bytes) -> tuple[bytes, bool | None]:
    """``(body, intact)``: intact None for a record written whole (by
    :func:`put_bytes`: one line of JSON, no checksum, no padding); False for a
    torn one (a read racing a rewrite: its end is not the checksum of its
    start followed by spaces; or no checksum line at all, where the new
    record's start was read over the old one's padding: spaces after it, or
    not one JSON text)."""
    if b"\n" not in data:
        return data, (None if data and not data.endswith(b" ") and _one_json(data) else False)
    raw = data.rstrip(b" ")
    try:
        intact = raw[-10:-9] == b"\n" and raw[-1:] == b"\n" and zlib.crc32(raw[:-10]) == int(raw[-9:-1], 16)
    except ValueError:
        intact = False
    return raw[:-10], intact


def _one_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


# A record padded to more than this is written anew (and so shrunk), not in place.
_RECORD_SHRINK_BYTES = 64 * 1024


def write_record(uri: str, text: str) -> None:
    """Replace a small record that one writer at a time writes (its writers
    hold a lock) and that describes a running process (not fsynced), such as a
    view's load state. Local files are rewritten in place: one ``pwrite`` of
    the text and its checksum, padded with spaces to the file's length.
    Writing a file anew and renaming it over the old one, or truncating it,
    makes ext4 write the new data out first (``auto_da_alloc``): ~0.2-0.4 ms
    a write, a twentieth of a small refresh. A reader racing the write may read
    a mix of the two, which the checksum rejects and :func:`read_record` reads
    again. Object stores: one PUT. ``text`` is one line (JSON)."""
    if "\n" in text:
        raise ValueError("a record is one line")
    body = text.encode()
    if not is_local(uri):
        put_bytes(uri, body)
        return
    path = _local_path(uri)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        if not _from_spare(path, _sealed(body)) and not _create_record(path, _sealed(body)):
            put_bytes(uri, _sealed(body), durable=False)
        return
    try:
        old = os.pread(fd, max(os.fstat(fd).st_size, 1), 0)
        data = _sealed(body)
        # in place only over a sealed record (a reader of a mix with an unsealed one could not tell)
        if _unsealed(old)[1] is not None and len(old) <= max(_RECORD_SHRINK_BYTES, 2 * len(data)):
            os.pwrite(fd, data + b" " * (len(old) - len(data)), 0)
            return
    finally:
        os.close(fd)
    put_bytes(uri, data, durable=False)


def retire_record(uri: str) -> None:
    """Remove a record written by :func:`write_record` (nothing if absent).
    A local one is renamed aside (``<name>.spare``, which no listing of
    ``*.json`` records sees) for the next :func:`write_record` to fill and
    rename back: a view's load state record is written and removed by every
    refresh, and creating a file costs ext4 ~0.15-0.25 ms (an inode
    allocated and journaled) where a rename costs ~0.01-0.02 ms."""
    if not is_local(uri):
        remove(uri)
        return
    path = _local_path(uri)
    try:
        os.rename(path, path + _SPARE)
    except FileNotFoundError:
        pass


_SPARE = ".spare"


def _from_spare(path: str, data: bytes) -> bool:
    """Write ``data`` into the spare of the record at ``path`` (see
    :func:`retire_record`) and rename it into place: readers find no record,
    then the whole new one (a reader still holding the old file open and
    racing the write reads a mix, which the checksum rejects). False when
    there is no spare (or one too large to fill in place)."""
    spare = path + _SPARE
    try:
        fd = os.open(spare, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size > max(_RECORD_SHRINK_BYTES, 2 * len(data)):
            return False
        os.pwrite(fd, data + b" " * max(size - len(data), 0), 0)
    finally:
        os.close(fd)
    try:
        os.rename(spare, path)
    except FileNotFoundError:
        return False
    return True


def _create_record(path: str, data: bytes) -> bool:
    """Create the record at ``path`` with ``data`` in one write (no temporary
    file and rename: ~40 us instead of ~150 us, a refresh creates one each
    time). False when it could not (its folder missing, or another writer
    created it first): then it is written whole by :func:`put_bytes`. A reader
    in between finds it empty and reads again (:func:`read_record`)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except (FileExistsError, FileNotFoundError):
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return True


def read_record(uri: str) -> str | None:
    """A record written by :func:`write_record` (or whole, by :func:`put_bytes`),
    None when there is none. A read that raced a rewrite (checksum wrong) is
    read again; a record still torn after that (a writer killed in the middle
    of a record over 4 KiB, an OS crash) reads as none."""
    for attempt in range(50):
        data = get_bytes(uri)
        if data is None:
            return None
        body, intact = _unsealed(data)
        if intact is not False and data:  # (empty: created, its content not written yet)
            return body.decode()
        time.sleep(0.0002 * (attempt + 1))
    return None
