"""The public API: catalog connection, table and view handles, the query builder,
views declared in code. Thin: the handles build references and call the operations.
"""
