"""Prefill/decode disaggregation (docs/disaggregation.md): deciders, pools, the KV-transfer fabric,
parent-request records, PD metrics and the parent-level projection."""
