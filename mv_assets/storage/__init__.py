"""The storage layer: the catalog's layout and state on disk.

Lance compatibility helpers, change detection, refresh state, status records, error
records, checkpoint files, and the frozen references (TableRef, ViewRef) the
operations are given. Imports only the model layer.
"""
