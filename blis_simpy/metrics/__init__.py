"""Metrics: per-instance raw records, aggregation, BLIS's summary schema and reports
(docs/metrics.md)."""
