"""blis_simpy — BLIS (Blackbox Inference Simulator) on SimPy.

A deterministic discrete-event simulator of LLM inference serving: vLLM-style engine
instances behind a cluster control plane. Time is an integer number of microseconds.
"""

__version__ = "0.1.0"
