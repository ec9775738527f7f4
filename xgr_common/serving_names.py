"""Names a SavedModel and its server agree on, written once.

``SERVING_SIGNATURE`` is TF Serving's default signature key: every SavedModel we export names
its pipeline by it, and ``xgr serve`` answers a request that names no signature with it.
"""

SERVING_SIGNATURE = "serving_default"
