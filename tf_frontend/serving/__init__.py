"""A TF-Serving-compatible model server (REST + gRPC) for SavedModels; ``xgr serve``."""
