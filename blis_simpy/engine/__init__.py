"""The engine: one simulated vLLM instance (docs/engine.md)."""
