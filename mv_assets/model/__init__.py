"""The model layer: pure values and rules, no I/O beyond validating against a schema.

Internal names and kinds, errors, the UDF model, view definitions, pure planning and
refresh policies. Imports nothing else of mv_assets.
"""
