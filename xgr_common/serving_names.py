"""Names a SavedModel and its server agree on, written once.

``SERVING_SIGNATURE`` is TF Serving's default signature key: every SavedModel we export names
its pipeline by it, and ``xgr serve`` answers a request that names no signature with it.
``CONTROLS_SIGNATURE`` names the same pipeline with each request's own controls as inputs.
``SERVING_SPEC_FILE`` (relative to a version folder) holds the serving hints an export leaves
for ``xgr serve``: which inputs are ragged, the longest history it accepts. ``WARMUP_FILE`` is
TF Serving's warm-up record file: requests a server replays before a version goes live.
``USER_KEY`` names a request's user key where the engine keeps a prompt cache, and
``USER_KEY_HEADER`` the header (REST) or metadata entry (gRPC) that may carry it instead.
"""

SERVING_SIGNATURE = "serving_default"
# The same pipeline taking per-request controls beside the features (``exclude_items``).
CONTROLS_SIGNATURE = "serving_with_controls"
SERVING_SPEC_FILE = "assets.extra/xgr_serving.json"
WARMUP_FILE = "assets.extra/tf_serving_warmup_requests"
# A request's user key, where the engine keeps a prompt-KV cache: the signature's input, and
# the REST header / gRPC metadata entry that carries it instead (so a load balancer that
# routes by user can read it; the body's value wins when both are sent).
USER_KEY = "user_key"
USER_KEY_HEADER = "x-user-key"
