"""Geneva's error matchers: ``Retry``, ``Skip``, ``Fail`` and the factories
``retry_transient()``, ``retry_all()``, ``fail_fast()`` (``skip_on_error()``
is in :mod:`mv_assets.model.udf`).

A UDF's ``on_error=[...]`` is an ordered list of matchers: the first one whose
exception classes (and ``match=`` regex, searched in ``str(exc)``) fit the
exception decides. ``Retry`` calls again, waiting as its ``backoff`` says
(Geneva's documented schedules: ``"exponential"`` 1 s, 2 s, 4 s... with jitter,
``"fixed"`` 1 s, ``"linear"`` 1 s, 2 s, 3 s..., all capped at 60 s) up to
``max_attempts`` calls in all; ``Skip`` leaves the row NULL and records the
error; ``Fail`` and an exception no matcher fits fail the job. A row whose
retries run out is skipped when the list holds a ``Skip`` (Geneva's
row-isolating mode), else it fails the job.

>>> policy = [Retry(ValueError, match="rate limit", max_attempts=5), Skip(ValueError), Fail(KeyError)]
>>> outcome(policy, ValueError("rate limit hit")), outcome(policy, ValueError("bad")), outcome(policy, KeyError())
('retry', 'skip', 'fail')
>>> outcome(policy, TypeError())
'fail'
"""

import random
import re
from typing import Any

__all__ = [
    "ExceptionMatcher", "Retry", "Skip", "Fail", "retry_transient", "retry_all", "fail_fast", "outcome",
    "BACKOFF_STRATEGIES", "backoff_seconds",
]

BACKOFF_STRATEGIES = ("exponential", "fixed", "linear")
_MAX_WAIT_S = 60.0


def _exception_types(api: str, exceptions: tuple) -> tuple[type[BaseException], ...]:
    if len(exceptions) == 1 and isinstance(exceptions[0], tuple | list):  # Retry((E1, E2)) as Retry(E1, E2)
        exceptions = tuple(exceptions[0])
    for exc in exceptions:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ValueError(f"{api}(...) takes exception classes, got {exc!r}")
    return tuple(exceptions)


class ExceptionMatcher:
    """Exceptions of these classes whose message the ``match`` regex finds (any, without one)."""

    _fields: tuple[str, ...] = ("exceptions", "match")

    def __init__(self, *exceptions: type[BaseException], match: str | None = None) -> None:
        self.exceptions = _exception_types(type(self).__name__, exceptions)
        if match is not None and not isinstance(match, str):
            raise ValueError(f"{type(self).__name__}(match=...) takes a regex string, got {match!r}")
        try:
            self._pattern = re.compile(match) if match is not None else None
        except re.error as exc:
            raise ValueError(f"Invalid regex pattern in match parameter: {match!r}: {exc}") from exc
        self.match = match

    def matches(self, exc: BaseException) -> bool:
        if not isinstance(exc, self.exceptions):
            return False
        return self._pattern is None or self._pattern.search(str(exc)) is not None

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._values()))

    def __repr__(self) -> str:
        names = ", ".join(e.__name__ for e in self.exceptions)
        extra = "".join(f", {f}={getattr(self, f)!r}" for f in self._fields[1:])
        return f"{type(self).__name__}({names}{extra})"


class Retry(ExceptionMatcher):
    """Call again on these exceptions, up to ``max_attempts`` calls in all,
    waiting as ``backoff`` says between them (Geneva's ``Retry``)."""

    _fields = ("exceptions", "match", "max_attempts", "backoff")

    def __init__(self, *exceptions: type[BaseException], match: str | None = None, max_attempts: int = 3,
                 backoff: str = "exponential") -> None:
        super().__init__(*exceptions, match=match)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"Retry(max_attempts=...) must be an int >= 1, got {max_attempts!r}")
        if backoff not in BACKOFF_STRATEGIES:
            raise ValueError(f"Invalid backoff strategy: {backoff!r}. Must be one of: {', '.join(BACKOFF_STRATEGIES)}")
        self.max_attempts = max_attempts
        self.backoff = backoff


class Skip(ExceptionMatcher):
    """Leave the row NULL and record the error on these exceptions (Geneva's ``Skip``).
    ``max_skip_count`` / ``max_skip_fraction`` are accepted with a warning."""

    _fields = ("exceptions", "match", "max_skip_count", "max_skip_fraction")

    def __init__(self, *exceptions: type[BaseException], match: str | None = None,
                 max_skip_count: int | None = None, max_skip_fraction: float | None = None) -> None:
        super().__init__(*exceptions, match=match)
        if max_skip_count is not None and (not isinstance(max_skip_count, int) or max_skip_count < 0):
            raise ValueError(f"max_skip_count must be >= 0, got {max_skip_count!r}")
        if max_skip_fraction is not None and not (0.0 <= max_skip_fraction <= 1.0):
            raise ValueError(f"max_skip_fraction must be between 0.0 and 1.0, got {max_skip_fraction!r}")
        self.max_skip_count = max_skip_count
        self.max_skip_fraction = max_skip_fraction


class Fail(ExceptionMatcher):
    """Fail the job on these exceptions (Geneva's ``Fail``)."""


def retry_transient(max_attempts: int = 3, backoff: str = "exponential") -> list[ExceptionMatcher]:
    """Retry ``ConnectionError``, ``TimeoutError``, ``OSError`` (Geneva's).

    >>> retry_transient()
    [Retry(ConnectionError, TimeoutError, OSError, match=None, max_attempts=3, backoff='exponential')]
    """
    return [Retry(ConnectionError, TimeoutError, OSError, max_attempts=max_attempts, backoff=backoff)]


def retry_all(max_attempts: int = 3, backoff: str = "exponential") -> list[ExceptionMatcher]:
    """Retry any exception (Geneva's)."""
    return [Retry(Exception, max_attempts=max_attempts, backoff=backoff)]


def fail_fast() -> list[ExceptionMatcher]:
    """Fail on any exception: the default (Geneva's; no matchers)."""
    return []


def first_match(matchers: tuple | list, exc: BaseException) -> ExceptionMatcher | None:
    for m in matchers:
        if m.matches(exc):
            return m
    return None


def outcome(matchers: tuple | list, exc: BaseException) -> str:
    """``"retry"``, ``"skip"`` or ``"fail"``: what the first matcher fitting ``exc`` says (none: fail)."""
    m = first_match(matchers, exc)
    if isinstance(m, Retry):
        return "retry"
    if isinstance(m, Skip):
        return "skip"
    return "fail"


def backoff_seconds(backoff: str, attempt: int, rng: Any = random) -> float:
    """Seconds to wait after failed call number ``attempt`` (1, 2, ...), as
    Geneva documents its strategies: exponential 1, 2, 4, 8... with jitter
    (uniform between 1 and that), fixed 1, linear 1, 2, 3...; capped at 60.

    >>> [backoff_seconds("linear", a) for a in (1, 2, 3, 100)], backoff_seconds("fixed", 7)
    ([1.0, 2.0, 3.0, 60.0], 1.0)
    >>> all(1.0 <= backoff_seconds("exponential", 3) <= 4.0 for _ in range(20))
    True
    """
    if backoff == "fixed":
        return 1.0
    if backoff == "linear":
        return min(float(attempt), _MAX_WAIT_S)
    if backoff == "exponential":
        return rng.uniform(1.0, min(2.0 ** (attempt - 1), _MAX_WAIT_S))
    raise ValueError(f"Invalid backoff strategy: {backoff!r}. Must be one of: {', '.join(BACKOFF_STRATEGIES)}")
