"""Who owns a view and how it is tagged, for orchestrators (the Dagster asset's
owners and tags). Stored in the view's schema metadata like its refresh
policy, so an orchestrator reads it without unpickling any UDF. Pure code,
no I/O.

Owners follow Dagster's format: an email address or ``team:<name>``. Tag keys
are ``[prefix/]name`` (each part 1-63 of ``A-Za-z0-9_.-``), values 0-63 of
those characters; the prefixes ``dagster/`` and ``mv_assets/`` are reserved
(the tags the wiring sets itself).
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Ownership", "OWNERSHIP_METADATA_KEY"]

OWNERSHIP_METADATA_KEY = "mv_assets.ownership"
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Z|a-z]{2,7}\b")  # Dagster's (dagster._core.utils)
_TAG_KEY = re.compile(r"^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$")
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")
_RESERVED = ("dagster/", "mv_assets/")


def _owners(owners: Any) -> tuple[str, ...]:
    if owners is None:
        return ()
    if isinstance(owners, str) or not isinstance(owners, (list, tuple)):
        raise ValueError(f"owners must be a list of strings, e.g. ['team:ml', 'alice@example.com'], got {owners!r}")
    for owner in owners:
        if not isinstance(owner, str) or not (
            _EMAIL.fullmatch(owner) or (owner.startswith("team:") and len(owner) > len("team:"))
        ):
            raise ValueError(f"invalid owner {owner!r}: an owner is an email address or a team name prefixed "
                             "with 'team:' (e.g. 'team:ml')")
    if len(set(owners)) != len(owners):
        raise ValueError(f"owners {list(owners)} name someone twice")
    return tuple(owners)


def _tags(tags: Any) -> dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise ValueError(f"tags must be a dict of str -> str, got {tags!r}")
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.match(key):
            raise ValueError(f"invalid tag key {key!r}: [prefix/]name, each part 1-63 characters of A-Za-z0-9_.-")
        if key.startswith(_RESERVED):
            raise ValueError(f"tag key {key!r}: the prefixes {', '.join(_RESERVED)} are reserved")
        if not isinstance(value, str) or not _TAG_VALUE.match(value):
            raise ValueError(f"invalid value {value!r} of tag {key!r}: a string of 0-63 characters of A-Za-z0-9_.-")
    return dict(tags)


@dataclass(frozen=True)
class Ownership:
    """A view's owners and tags, validated when built (``ValueError``)."""

    owners: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "owners", _owners(self.owners))
        object.__setattr__(self, "tags", _tags(self.tags))

    @classmethod
    def of(cls, owners: Any = None, tags: Any = None) -> "Ownership":
        """From what a user passes (a list of owners, a dict of tags; None for none)."""
        return cls(tuple(owners) if isinstance(owners, list) else owners, tags)  # (others refused in __post_init__)

    @property
    def empty(self) -> bool:
        return not self.owners and not self.tags

    def to_json(self) -> str:
        return json.dumps({"owners": list(self.owners), "tags": self.tags}, sort_keys=True)

    @staticmethod
    def from_json(raw: str | bytes | None) -> "Ownership":
        if not raw:
            return Ownership()
        d = json.loads(raw)
        return Ownership(tuple(d.get("owners") or ()), d.get("tags") or {})
