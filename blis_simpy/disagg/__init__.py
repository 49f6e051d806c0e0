"""Prefill/decode disaggregation (spec/06): deciders, pools, the KV-transfer fabric,
parent-request records, PD metrics and the parent-level projection."""
