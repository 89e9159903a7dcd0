"""Source tables the tests build: rows spread over many fragments."""

import numpy as np
import pyarrow as pa


def fragmented(db, fragments: int, rows: int, seed: int = 5, name: str = "src"):
    """A table ``name`` of ``fragments`` fragments of ``rows`` rows each: ``id``
    (0, 1, ...) and ``x`` (random floats in [0, 1))."""
    rng = np.random.default_rng(seed)

    def part(i: int) -> pa.Table:
        return pa.table({"id": np.arange(i * rows, (i + 1) * rows), "x": rng.random(rows)})

    src = db.create_table(name, part(0))
    for i in range(1, fragments):
        src.add(part(i))
    return src
