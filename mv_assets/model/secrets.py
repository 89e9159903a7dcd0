"""Credentials kept out of what is stored and shown.

A Spark Connect URL carries its token as a parameter
(``sc://host:port/;use_ssl=true;token=...``, pyspark's way); an object store
URL or an error may carry a key the same way. What the engine writes into a
view's status (``last_error``) and says in its errors goes through
:func:`redact` first: the value of each such parameter is replaced by
``***``; the rest (host, port, other parameters) stays, to say where.
"""

import re

__all__ = ["redact"]

# name=value where the name says it is a credential; the value runs to the next separator
_SECRET = re.compile(
    r"(?i)\b([a-z_]*(?:token|password|passwd|secret|api_key|apikey|access_key|credential)[a-z_]*)=([^;&\s'\"]+)")


def redact(text: str) -> str:
    """``text`` with the values of credential parameters (``token=...``,
    ``password=...``, ``secret_access_key=...``) replaced by ``***``."""
    return _SECRET.sub(lambda m: f"{m.group(1)}=***", text)
