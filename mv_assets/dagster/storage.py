"""Dagster's SQLite event log, storing a run's materializations in batches.

A run over every partition of a source of 10,000 fragments records one
materialization per asset and partition (its own numbers and data versions).
Dagster's SQLite event log stores each in its own pair of transactions (the
run's shard, then the cross-run index, each opened anew): ~10-17 ms an event,
so ~200 s for a view and one UDF column at 10,000 partitions. Dagster batches
such events where the storage can (``DAGSTER_EVENT_BATCH_SIZE``: Postgres
writes a batch with one INSERT); its SQLite storage takes them one by one.

:class:`BatchingSqliteEventLogStorage` is that storage with the batch write
Dagster's Postgres storage has: the batch's events go into the run's shard in
one INSERT, and into the index in one transaction with their tags, the asset's
latest event updated once. Everything else (runs, schedules, other events,
reads, watching) is Dagster's SQLite storage unchanged, on the same files: a
home can switch to it and back.

``prepare_home`` (``make demo``, ``dagster dev`` through
``mv_assets.dagster.devserver``) writes :func:`sqlite_storage_yaml`, and
``DAGSTER_ENV`` sets ``DAGSTER_EVENT_BATCH_SIZE``. The materializations of a
run are sent as one batch per asset (``mv_assets.dagster.assets``).
"""

import json
import os
from collections.abc import Sequence

from dagster import DagsterEventType
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationPlanned
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster._serdes import serialize_value

__all__ = ["BATCH_SIZE", "BatchingSqliteEventLogStorage", "sqlite_storage_yaml"]

# events a batch holds at most (Dagster's DAGSTER_EVENT_BATCH_SIZE): one
# transaction each, of a size SQLite writes in a few tens of milliseconds
BATCH_SIZE = 1000

# Asset events stored in a batch; and the planned check evaluations that come with a run's
# planned materializations (a run's creation logs one planned event per asset and per check as
# one batch: the demo's lineage run, 11 assets and 23 checks, spent ~1 s in ~90 SQLite
# transactions between its creation and its enqueueing, now 3).
_BATCHED = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_OBSERVATION,
            DagsterEventType.ASSET_MATERIALIZATION_PLANNED}
_CHECK_PLANNED = DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED


class BatchingSqliteEventLogStorage(SqliteEventLogStorage):
    """:class:`SqliteEventLogStorage` with a batch write (see the module)."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        return cls(inst_data=inst_data, **config_value)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        kinds = {e.dagster_event_type for e in events}
        runs = {e.run_id for e in events}
        assets = [e for e in events if e.dagster_event_type in _BATCHED]
        checks = [e for e in events if e.dagster_event_type == _CHECK_PLANNED]
        if (len(events) < 2 or not kinds <= _BATCHED | {_CHECK_PLANNED} or len(runs) != 1
                or any(e.dagster_event is None or e.dagster_event.asset_key is None for e in assets)
                or (checks and not self.supports_asset_checks)):
            super().store_event_batch(events)  # one by one, as Dagster does
            return
        with self.run_connection(events[0].run_id) as conn:
            conn.execute(self.prepare_insert_event_batch(events))
        with self.index_transaction() as conn:
            if assets:
                rows = conn.execute(self.prepare_insert_event_batch(assets).returning(SqlEventLogStorageTable.c.id))
                ids = [int(row[0]) for row in rows.fetchall()]
                self._store_asset_event_tags(conn, assets, ids)
                latest = {}
                for event, event_id in zip(assets, ids, strict=True):
                    latest[event.get_dagster_event().asset_key] = (event, event_id)
                for event, event_id in latest.values():  # each asset's latest event, as one by one would leave it
                    self._store_asset_event(conn, event, event_id)
            if checks:
                rows = conn.execute(self.prepare_insert_event_batch(checks).returning(SqlEventLogStorageTable.c.id))
                ids = [int(row[0]) for row in rows.fetchall()]
                conn.execute(AssetCheckExecutionsTable.insert().values(
                    [row for event, event_id in zip(checks, ids, strict=True)
                     for row in self._planned_check_rows(event, event_id)]))

    def _planned_check_rows(self, event: EventLogEntry, event_id: int) -> list[dict]:
        """The check executions a planned check evaluation records: what
        Dagster's ``_store_asset_check_evaluation_planned`` inserts, one per
        partition (one without partitions)."""
        planned = event.get_dagster_event().event_specific_data
        assert isinstance(planned, AssetCheckEvaluationPlanned)
        partitions = planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        return [dict(asset_key=planned.asset_key.to_string(), check_name=planned.check_name, partition=partition,
                     run_id=event.run_id, execution_status=AssetCheckExecutionRecordStatus.PLANNED.value,
                     evaluation_event=serialize_value(event),
                     evaluation_event_timestamp=self._event_insert_timestamp(event),
                     evaluation_event_storage_id=event_id)
                for partition in partitions]


def sqlite_storage_yaml(dagster_home: str) -> str:
    """The instance storage of a ``dagster.yaml`` in ``dagster_home``: the
    files of Dagster's default SQLite storage (``$DAGSTER_HOME/history``,
    ``.../history/runs``, ``.../schedules``), events written in batches."""
    history = os.path.join(dagster_home, "history", "")
    return (
        "run_storage:\n  module: dagster._core.storage.runs\n  class: SqliteRunStorage\n"
        f"  config:\n    base_dir: {json.dumps(history)}\n"
        f"event_log_storage:\n  module: {__name__}\n  class: BatchingSqliteEventLogStorage\n"
        f"  config:\n    base_dir: {json.dumps(os.path.join(history, 'runs', ''))}\n"
        "schedule_storage:\n  module: dagster._core.storage.schedules\n  class: SqliteScheduleStorage\n"
        f"  config:\n    base_dir: {json.dumps(os.path.join(dagster_home, 'schedules'))}\n"
    )
