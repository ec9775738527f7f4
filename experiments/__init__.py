"""Probes: one-off questions about the GPU, asked by a script each and answered in
``experiments/README.md``. They may import ``benchmarks``; nothing in the product or the
benchmarks imports them. Run as modules from the repository root:
``python -m experiments.probe_search_bound --helpfull``."""
