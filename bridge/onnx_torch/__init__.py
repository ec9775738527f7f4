"""ONNX -> Torch: a converter registry (one decorator per op and opset) and an ``nn.Module``
that interprets a converted graph with it. Import :mod:`bridge.onnx_torch.resolve` to get
every converter registered."""
