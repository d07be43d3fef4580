"""The round builder: aggregation, agreement, human-performance estimate, chance-level splits,
reports and export (DynaSent §3.3-3.5, §4.4-4.6), as a library with a CLI and API on top.

It uses the ``services`` domain and storage (to read a round and record a build) and writes
model directories that ``model_server`` loads; nothing in ``services`` imports it.
"""
