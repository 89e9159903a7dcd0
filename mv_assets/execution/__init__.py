"""The execution layer: where tasks run.

Executor-side tasks (read, compute UDFs, write Lance files) and the runners that
schedule them (in process, local Spark, Spark Connect). Imports model and storage.
"""
