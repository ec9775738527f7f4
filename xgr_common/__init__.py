"""The leaves every package of xgr-bridge shares: the error hierarchy, the TF/Triton import
order, the tolerance table, the token layout and the prompt contract.

Imports neither TensorFlow nor torch (nor numpy): TF-only code (``custom_ops``, serving) and
the engine import it alike. Keep it that way: a module here that needs a heavy import belongs
in the package that owns that import.
"""
