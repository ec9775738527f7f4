"""Stepwise TF -> Torch migration: a committed plan saying where each stage runs, a runner that
executes a Keras model under it, and automatic conversion of stages through ONNX."""
