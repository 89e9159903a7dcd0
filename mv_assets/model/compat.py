"""Geneva's parameters that have no meaning here: the warning they raise.

The API layer (``mv_assets.api.geneva``) maps Geneva's call parameters; the
decorators of the model (``@udf``, ``@chunker``) take Geneva's too, and warn
from here (the model imports nothing above it).
"""

import warnings
from typing import Any

__all__ = ["GenevaCompatWarning", "warn_ignored"]


class GenevaCompatWarning(UserWarning):
    """A Geneva parameter accepted so that Geneva code runs, which does not apply here (the message says why)."""


NO_MANIFEST = ("tasks run in the Python environment of the Spark executors (in process: this one); a UDF from a "
               "module they cannot import is shipped by value with its code (docs/deploy.md)")


def warn_ignored(api: str, name: str, value: Any, why: str, *, stacklevel: int = 3) -> None:
    """One :class:`GenevaCompatWarning`: ``api(name=value)`` is accepted and ignored because ``why``."""
    warnings.warn(f"{api}({name}={value!r}) does not apply here and is ignored: {why}", GenevaCompatWarning,
                  stacklevel=stacklevel)
