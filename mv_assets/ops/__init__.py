"""The operations: plan -> execute -> commit.

Refresh, column backfill, column add/alter/load, checks. They take frozen
references, never the public handles. Imports model, storage and execution.
"""
