"""Shipped data files (the GPU pricing catalogue, prices.yaml)."""
