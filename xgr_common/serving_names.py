"""Names a SavedModel and its server agree on, written once.

``SERVING_SIGNATURE`` is TF Serving's default signature key: every SavedModel we export names
its pipeline by it, and ``xgr serve`` answers a request that names no signature with it.
``CONTROLS_SIGNATURE`` names the same pipeline with each request's own controls as inputs.
``SERVING_SPEC_FILE`` (relative to a version folder) holds the serving hints an export leaves
for ``xgr serve``: which inputs are ragged, the longest history it accepts. ``WARMUP_FILE`` is
TF Serving's warm-up record file: requests a server replays before a version goes live.
"""

SERVING_SIGNATURE = "serving_default"
# The same pipeline taking per-request controls beside the features (``exclude_items``).
CONTROLS_SIGNATURE = "serving_with_controls"
SERVING_SPEC_FILE = "assets.extra/xgr_serving.json"
WARMUP_FILE = "assets.extra/tf_serving_warmup_requests"
