"""Opening a dataset at a version, and saying in our words why it cannot be:
the version was removed by history cleanup, or never written; either way the
versions that exist are named (long runs compressed into ranges)."""

import lance

from mv_assets.model.definition import short_error
from mv_assets.storage import objects

__all__ = ["version_list", "existing_versions", "versions_phrase", "dataset_at"]


def version_list(versions: list[int]) -> str:
    """Versions as a short list, runs of three or more as ranges.

    >>> version_list([1, 3, 4, 5, 6, 9, 10])
    '1, 3-6, 9, 10'
    >>> version_list([])
    'none'
    """
    vs = sorted(set(versions))
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{vs[i]}-{vs[j]}")
        else:
            parts.extend(str(v) for v in vs[i:j + 1])
        i = j + 1
    if len(parts) > 20:  # a long, ragged history: its ends
        parts = [*parts[:10], f"... ({len(parts) - 20} more)", *parts[-10:]]
    return ", ".join(parts) or "none"


def listed_versions(ds: lance.LanceDataset) -> list:
    """``ds.versions()``, listed again when a manifest it listed was gone
    before it was read: a cleanup of old versions meanwhile, by any process
    (Lance's "Not found" then failed ``list_jobs()`` and ``status()``)."""
    for attempt in range(_LIST_TRIES):
        try:
            return list(ds.versions())
        except (ValueError, OSError) as exc:
            if "not found" not in str(exc).lower() or attempt == _LIST_TRIES - 1:
                raise
    raise AssertionError("not reached")


_LIST_TRIES = 8


def existing_versions(latest: lance.LanceDataset) -> list[int]:
    """The versions of the dataset that can be opened (one listing of its manifests)."""
    return sorted(int(v["version"]) for v in listed_versions(latest))


def versions_phrase(latest: lance.LanceDataset) -> str:
    """'between 1 and N' while every version is there, else 'one of 1, 3-5'."""
    have = existing_versions(latest)
    if have == list(range(1, latest.version + 1)):
        return f"between 1 and {latest.version}"
    return f"one of {version_list(have)}"


def dataset_at(uri: str, name: str, version: int, latest: lance.LanceDataset | None = None) -> lance.LanceDataset:
    """The dataset ``name`` at ``uri`` at ``version`` (``latest``: its newest
    version when at hand). A version that cannot be opened raises ValueError
    saying why: removed by history cleanup, never written, or Lance's reason
    (short) when it exists but does not open; with the versions that exist."""
    if latest is not None and version == latest.version:
        return latest
    error: Exception | None = None
    if version >= 1 and (latest is None or version <= latest.version):
        try:
            return objects.dataset(uri, version=version)
        except (ValueError, OSError) as exc:
            error = exc
    latest = objects.dataset(uri)
    have = existing_versions(latest)
    if version in have and error is not None:
        raise ValueError(f"cannot open version {version} of {name!r}: {short_error(error)}") from error
    if version in have:  # written since ``latest`` was opened
        return objects.dataset(uri, version=version)
    if 1 <= version <= latest.version:
        raise ValueError(
            f"version {version} of {name!r} was removed by history cleanup; versions that exist: {version_list(have)}"
        ) from None
    raise ValueError(f"{name!r} has no version {version} (versions that exist: {version_list(have)})") from None
