"""The simulated GPU endpoint: hardware and model profiles, a vLLM-like engine, and two drivers.

Everything it produces is simulated and is labelled so by its callers.
"""
