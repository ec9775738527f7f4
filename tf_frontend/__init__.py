"""TF feature graphs, Keras layers, SavedModel export and the TF-Serving-compatible server."""
