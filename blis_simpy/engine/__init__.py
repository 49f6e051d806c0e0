"""The engine: one simulated vLLM instance (spec/02)."""
