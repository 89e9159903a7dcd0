"""Consistency checks of a view against its source (engine code, no dagster).

Each check returns a :class:`CheckOutcome`; the Dagster layer turns them into
asset check results.
"""

from dataclasses import dataclass, field

import numpy as np

from mv_assets.model.definition import SOURCE_ROW_ID
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import isin, select_limited
from mv_assets.storage import objects
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.state import read_refresh_state

__all__ = ["CheckOutcome", "check_view"]


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    description: str
    metadata: dict = field(default_factory=dict)


def check_view(view: ViewRef) -> list[CheckOutcome]:
    """Run every check on ``view`` at the source version it reflects."""
    definition = view.definition
    state = read_refresh_state(view.dataset())
    version = state.source_version or view.source_dataset().version
    src = objects.dataset(view.source_uri, version=version)
    view_tbl = view.dataset().to_table(columns=[SOURCE_ROW_ID] + [c.name for c in definition.udf_columns])
    keys = _ids(view_tbl, SOURCE_ROW_ID)
    out: list[CheckOutcome] = []

    all_ids = _ids(src.to_table(columns=[], with_row_id=True), "_rowid")
    orphans = keys[~isin(keys, all_ids)]
    out.append(
        CheckOutcome(
            "no_orphan_rows",
            len(orphans) == 0,
            f"every view row has its source row at source version {version}",
            {"orphan_rows": int(len(orphans)), "sample": [int(x) for x in orphans[:10]]},
        )
    )

    if state.source_version is None:
        out.append(
            CheckOutcome(
                "matches_source_query",
                True,
                "not checked: the view has only been refreshed partition by partition so far",
                {"view_rows": int(len(keys))},
            )
        )
    else:
        expected = _ids(src.to_table(columns=[], filter=definition.filter, with_row_id=True), "_rowid")
        if definition.limit is not None:
            expected = select_limited(expected, definition.limit, definition.seed if definition.shuffle else None)
        missing = expected[~isin(expected, keys)]
        extra = keys[~isin(keys, expected)]
        dupes = int(len(keys) - len(np.unique(keys)))
        out.append(
            CheckOutcome(
                "matches_source_query",
                len(missing) == 0 and len(extra) == 0 and dupes == 0,
                f"row count and key set equal the view query over the source at version {version}",
                {
                    "expected_rows": int(len(expected)),
                    "view_rows": int(len(keys)),
                    "missing": int(len(missing)),
                    "extra": int(len(extra)),
                    "duplicates": dupes,
                },
            )
        )

    missing_values: dict[str, int] = {}
    for spec in definition.udf_columns:
        col = view_tbl.column(spec.name)
        if col.null_count == 0:
            missing_values[spec.name] = 0
            continue
        null_keys = keys[col.is_null().to_numpy(zero_copy_only=False)]
        inputs = spec.udf.input_columns if spec.udf is not None else []
        if not inputs or not spec.the_udf.skip_nulls:
            missing_values[spec.name] = int(len(null_keys))
            continue
        rows = src.to_table(
            columns=inputs, filter=f"_rowid IN ({', '.join(str(int(k)) for k in null_keys)})", with_row_id=True
        )
        has_all = np.ones(rows.num_rows, dtype=bool)
        for c in inputs:
            has_all &= ~rows.column(c).is_null().to_numpy(zero_copy_only=False)
        missing_values[spec.name] = int(has_all.sum())
    out.append(
        CheckOutcome(
            "udf_values_present",
            all(v == 0 for v in missing_values.values()),
            "no UDF value is missing where its inputs are present",
            {"missing_by_column": missing_values},
        )
    )
    return out
