"""Parity between a TF model and its migrated plan: comparisons keyed by the one tolerance
table, a harness over real batches, Markdown/HTML reports and a pytest helper."""
