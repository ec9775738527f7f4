"""Residual k-means for the demo world: the one implementation lives in
``xgr_catalog.kmeans`` (``xgr catalog build`` uses it at catalog scale); these are its names."""

from xgr_catalog.kmeans import KMeansConfig, ResidualCodes, residual_kmeans

__all__ = ["KMeansConfig", "ResidualCodes", "residual_kmeans"]
