"""Metrics: per-instance raw records, aggregation, BLIS's summary schema and reports (spec/08)."""
