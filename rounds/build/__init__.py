"""The round builder: aggregation, agreement, human-performance estimate, chance-level splits,
reports and export (DynaSent §3.3-3.5, §4.4-4.6).

It reads a closed round through the ``services`` domain and storage and records a build;
nothing in ``services`` imports it. See docs/architecture.md.
"""
