"""moto's S3 server, with its LIST answered from the keys under the prefix.

moto answers a LIST by copying and filtering every key of the bucket, so its
LIST grows with the bucket (bench/bench_s3_server_list.py: 10 ms at 150 keys,
20 ms at 16,000), where an object store's LIST by prefix does not. This
server keeps each bucket's key names sorted (rebuilt after any change to the
bucket) and hands moto's own listing code only the keys that start with the
prefix: the same answers (tests/test_s3_servers.py compares them with moto's
as it comes), at a cost that follows what is listed. Used by the catalog
bench (``--s3-list indexed``) to tell our requests' cost from moto's.

Run as moto's server: ``python tests/moto_indexed.py -H 127.0.0.1 -p PORT``.
"""

import bisect
import sys

from moto.s3 import models, utils

_Store = utils._VersionedKeyStore


def _changing(method):
    def changed(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        self.__dict__["_generation"] = self.__dict__.get("_generation", 0) + 1  # (after the change)
        return out

    return changed


for _name in ("__setitem__", "__delitem__", "pop", "setlist", "clear", "update", "popitem", "setdefault"):
    setattr(_Store, _name, _changing(getattr(_Store, _name)))


def _sorted_names(store: _Store) -> list[str]:
    generation = store.__dict__.get("_generation", 0)  # (read before the names: a change meanwhile rebuilds)
    cached = store.__dict__.get("_sorted")
    if cached is None or cached[0] != generation:
        cached = (generation, sorted(dict.keys(store)))
        store.__dict__["_sorted"] = cached
    return cached[1]


class _Under:
    """What moto's listing reads of a bucket's keys (``items()``), narrowed to some names."""

    def __init__(self, store: _Store, names: list[str]) -> None:
        self._store, self._names = store, names

    def items(self):
        for name in self._names:
            try:
                yield name, self._store[name]
            except (KeyError, IndexError):  # (removed meanwhile)
                continue


class _Narrowed:
    """A bucket whose keys are those under a prefix; everything else is the bucket's."""

    def __init__(self, bucket, names: list[str]) -> None:
        self._bucket, self.keys = bucket, _Under(bucket.keys, names)

    def __getattr__(self, name):
        return getattr(self._bucket, name)


_list_objects = models.S3Backend.list_objects


def list_objects(self, bucket, prefix, delimiter, marker, max_keys):
    if prefix and isinstance(bucket.keys, _Store) and not isinstance(bucket, models.FakeTableStorageBucket):
        names = _sorted_names(bucket.keys)
        low = bisect.bisect_left(names, prefix)
        high = low
        while high < len(names) and names[high].startswith(prefix):
            high += 1
        bucket = _Narrowed(bucket, names[low:high])
    return _list_objects(self, bucket, prefix, delimiter, marker, max_keys)


models.S3Backend.list_objects = list_objects

if __name__ == "__main__":
    from moto.server import main

    main(sys.argv[1:])
