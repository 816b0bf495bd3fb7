"""The store: one DuckDB file (db: connections, writes, reads, the views users query) and its DDL
(schema).
"""
