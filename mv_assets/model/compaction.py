"""A base table's compaction policy: how many fragments it may have before
the runs of its lineage compact it (pure values; no Lance).

Dagster allows 100,000 dynamic partitions per asset, and every view over a
base table is partitioned by its fragments: a table that grows by many small
appends would pass that. Compaction merges fragments (row ids and row
versions are kept: views see no change), and the sensor retires the
partitions of the fragments it merged.
"""

import json
from dataclasses import dataclass

__all__ = ["CompactionPolicy", "COMPACTION_CONFIG_KEY", "DAGSTER_PARTITION_LIMIT", "FRAGMENT_WARNING"]

COMPACTION_CONFIG_KEY = "mv_assets.compaction"
DAGSTER_PARTITION_LIMIT = 100_000  # Dagster's dynamic partitions per asset
FRAGMENT_WARNING = DAGSTER_PARTITION_LIMIT // 2  # a table's sensor warns past this many fragments


@dataclass(frozen=True)
class CompactionPolicy:
    """Compact the table once it has more than ``max_fragments`` fragments,
    into fragments of up to ``target_rows_per_fragment`` rows.

    >>> p = CompactionPolicy(max_fragments=1000)
    >>> p.due(1000), p.due(1001)
    (False, True)
    >>> CompactionPolicy.from_json(p.to_json()) == p
    True
    >>> CompactionPolicy(max_fragments=0)
    Traceback (most recent call last):
    ...
    ValueError: max_fragments must be an int >= 1, got 0
    """

    max_fragments: int
    target_rows_per_fragment: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("max_fragments", "target_rows_per_fragment"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    def due(self, fragments: int) -> bool:
        """Whether a table of ``fragments`` fragments is to be compacted."""
        return fragments > self.max_fragments

    def to_json(self) -> str:
        return json.dumps({"max_fragments": self.max_fragments, "target_rows_per_fragment": self.target_rows_per_fragment})

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> "CompactionPolicy | None":
        if not raw:
            return None
        d = json.loads(raw)
        return cls(int(d["max_fragments"]), int(d.get("target_rows_per_fragment", 1 << 20)))
