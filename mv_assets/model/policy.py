"""Refresh policies: when a view should be refreshed. Pure code, no I/O.

=============  ==============================================================
policy         refresh when
=============  ==============================================================
``eager``      the source has a version the view does not reflect
``ttl``        the last refresh is older than ``ttl_seconds`` and the source
               moved since (Teiid's MATVIEW_TTL, minus useless reloads)
``cron``       on a cron schedule (Dagster schedule), if the source moved
``staleness``  rows changed in the source since the last refresh reach
               ``max_staleness_pct`` % of the view's cardinality (Teiid's
               MATVIEW_MAX_STALENESS_PCT)
``manual``     only when someone asks (UI click, CLI, Python)
=============  ==============================================================
"""

import json
from dataclasses import asdict, dataclass, field
from datetime import timedelta

__all__ = ["RefreshPolicy", "Decision", "decide", "POLICY_METADATA_KEY", "BUILD_HINT"]

POLICY_METADATA_KEY = "mv_assets.policy"
KINDS = ("eager", "ttl", "cron", "staleness", "manual")


BUILD_HINT = ("build one with RefreshPolicy.eager(), RefreshPolicy.ttl(3600), RefreshPolicy.cron(\"0 6 * * *\"), "
              "RefreshPolicy.staleness(5) or RefreshPolicy.manual()")


def _valid_cron(expression: object) -> bool:
    """Whether ``expression`` is a cron expression Dagster's schedules take:
    five fields croniter reads, not the 30th or 31st of February (a bad one
    stored in a view failed the load of every asset of the catalog)."""
    from croniter import croniter

    if not isinstance(expression, str) or len(expression.split()) != 5 or not croniter.is_valid(expression):
        return False
    fields = croniter.expand(expression)[0]
    return not (len(fields[3]) == 1 and fields[3][0] == 2 and len(fields[2]) == 1 and fields[2][0] in (30, 31))


class _FieldAndConstructor:
    """A field of the policy that is also, on the class, the constructor of
    its kind: ``RefreshPolicy.cron("0 6 * * *")`` builds a cron policy, and
    ``policy.cron`` is its expression (an instance holds its fields: this
    non-data descriptor is read only on the class)."""

    def __init__(self, make: str) -> None:
        self.make = make

    def __get__(self, obj: object, owner: type | None = None):
        if obj is None:
            return getattr(owner, self.make)
        return None  # (not reached: the instance's own value comes first)


@dataclass(frozen=True)
class RefreshPolicy:
    """How a view is kept fresh. Build with the class methods, one per kind:
    ``eager()``, ``ttl(seconds)``, ``cron("0 6 * * *")`` (also
    ``cron_schedule``), ``staleness(pct)``, ``manual()``."""

    kind: str = "eager"
    ttl_seconds: float | None = None
    cron: str | None = None
    max_staleness_pct: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"refresh policy must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "ttl" and not (isinstance(self.ttl_seconds, (int, float)) and self.ttl_seconds > 0):
            raise ValueError("a ttl policy needs a positive ttl (seconds or timedelta)")
        if self.kind == "cron" and not _valid_cron(self.cron):
            raise ValueError(f"a cron policy needs a 5-field cron expression (minute hour day month weekday, as "
                             f"Dagster's schedules take it, e.g. '0 6 * * *'), got {self.cron!r}")
        if self.kind == "staleness" and not (
            isinstance(self.max_staleness_pct, (int, float)) and 0 <= self.max_staleness_pct <= 100
        ):
            raise ValueError("a staleness policy needs max_staleness_pct between 0 and 100")

    @classmethod
    def eager(cls) -> "RefreshPolicy":
        return cls("eager")

    @classmethod
    def ttl(cls, ttl: float | timedelta) -> "RefreshPolicy":
        seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
        return cls("ttl", ttl_seconds=seconds)

    @classmethod
    def cron_schedule(cls, cron: str) -> "RefreshPolicy":
        return cls("cron", cron=cron)

    @classmethod
    def staleness(cls, max_staleness_pct: float) -> "RefreshPolicy":
        return cls("staleness", max_staleness_pct=max_staleness_pct)

    @classmethod
    def manual(cls) -> "RefreshPolicy":
        return cls("manual")

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @staticmethod
    def from_json(raw: str | bytes | None) -> "RefreshPolicy":
        if not raw:
            return RefreshPolicy()
        return RefreshPolicy(**json.loads(raw))

    def describe(self) -> str:
        if self.kind == "ttl":
            return f"ttl: refresh when older than {self.ttl_seconds:g}s and the source moved"
        if self.kind == "cron":
            return f"cron: refresh on schedule '{self.cron}'"
        if self.kind == "staleness":
            return f"staleness: refresh when changed rows reach {self.max_staleness_pct:g}% of the view"
        if self.kind == "manual":
            return "manual: refresh only on request"
        return "eager: refresh on every new source version"


RefreshPolicy.cron = _FieldAndConstructor("cron_schedule")  # type: ignore[assignment]  (RefreshPolicy.cron(expr))


@dataclass(frozen=True)
class Decision:
    refresh: bool
    reason: str
    # when the decision may turn without the source moving (a ttl running out), or None
    retry_at: float | None = field(default=None, repr=False)


def decide(
    policy: RefreshPolicy,
    *,
    source_version: int,
    reflected_version: int | None,
    last_refreshed_at: float | None,
    now: float,
    rows_changed: int,
    cardinality: int,
    scheduled: bool = False,
    moved: bool | None = None,
) -> Decision:
    """Whether ``policy`` asks for a refresh now.

    ``moved``: whether anything the view reads changed since it was refreshed
    (default: the source version differs from the reflected one; a join view
    also moves when only a joined table did).

    ``rows_changed`` counts source rows inserted, updated or deleted since the
    reflected version (Teiid's StaleCount); ``scheduled`` is True when a cron
    schedule is firing.

    >>> decide(RefreshPolicy.staleness(10), source_version=5, reflected_version=4,
    ...        last_refreshed_at=0, now=1, rows_changed=5, cardinality=100)
    Decision(refresh=False, reason='5.0% of rows changed, below 10%')
    """
    if reflected_version is None:
        if policy.kind == "manual":
            return Decision(False, "manual policy: never loaded, waiting for a request")
        if policy.kind == "cron" and not scheduled:
            return Decision(False, "cron policy: waiting for the schedule")
        return Decision(True, "never loaded")
    moved = source_version != reflected_version if moved is None else moved
    if policy.kind == "manual":
        return Decision(False, "manual policy")
    if not moved:
        return Decision(False, f"up to date with source version {source_version}")
    if policy.kind == "eager":
        if source_version == reflected_version:
            return Decision(True, "a joined table moved")
        return Decision(True, f"source moved from version {reflected_version} to {source_version}")
    if policy.kind == "cron":
        return Decision(scheduled, "schedule fired" if scheduled else "cron policy: waiting for the schedule")
    if policy.kind == "ttl":
        age = now - (last_refreshed_at or 0.0)
        assert policy.ttl_seconds is not None
        if age >= policy.ttl_seconds:
            return Decision(True, f"last refresh {age:.0f}s ago, ttl {policy.ttl_seconds:g}s")
        return Decision(False, f"last refresh {age:.0f}s ago, within ttl {policy.ttl_seconds:g}s",
                        retry_at=(last_refreshed_at or 0.0) + policy.ttl_seconds)
    assert policy.max_staleness_pct is not None
    pct = 100.0 * rows_changed / max(cardinality, 1)
    if pct >= policy.max_staleness_pct and rows_changed > 0:
        return Decision(True, f"{pct:.1f}% of rows changed, reaching {policy.max_staleness_pct:g}%")
    return Decision(False, f"{pct:.1f}% of rows changed, below {policy.max_staleness_pct:g}%")
