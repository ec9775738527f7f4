"""Each ONNX -> Torch converter against onnxruntime on random inputs: one single-node graph per
case, run by onnxruntime and by ``OnnxGraphModule``; compared with the tolerance table."""

from __future__ import annotations

import numpy as np

import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from bridge.onnx_torch.from_onnx import graph_from_onnx
from bridge.onnx_torch.module import OnnxGraphModule
from bridge.onnx_torch.registry import REGISTRY
from xgr_common.errors import ConversionError
from xgr_common.tolerances import tolerance_for

F, I64 = np.float32, np.int64
rng = np.random.default_rng(0)


def rand(*shape, dtype=F, low=-2.0, high=2.0):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(low), int(high), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def const(value, dtype=I64):
    return np.asarray(value, dtype=dtype)


# id -> (op_type, opset, attrs, runtime inputs, constant inputs given as initializers)
CASES = {
    "MatMul": ("MatMul", 17, {}, [rand(3, 4), rand(4, 5)], {}),
    "MatMul_batched": ("MatMul", 17, {}, [rand(2, 3, 4), rand(4, 5)], {}),
    "Gemm": ("Gemm", 17, {"transB": 1, "alpha": 0.5, "beta": 2.0}, [rand(3, 4), rand(5, 4), rand(5)], {}),
    "Add": ("Add", 17, {}, [rand(2, 3), rand(3)], {}),
    "Sub": ("Sub", 17, {}, [rand(2, 3), rand(2, 1)], {}),
    "Mul": ("Mul", 17, {}, [rand(2, 3), rand(2, 3)], {}),
    "Div": ("Div", 17, {}, [rand(2, 3), rand(2, 3, low=0.5, high=2.0)], {}),
    "Div_int": ("Div", 17, {}, [rand(2, 3, dtype=I64, low=-9, high=9),
                                rand(2, 3, dtype=I64, low=1, high=4)], {}),
    "Pow": ("Pow", 17, {}, [rand(2, 3, low=0.1), const([3.0], F)], {}),
    "Sqrt": ("Sqrt", 17, {}, [rand(2, 3, low=0.1)], {}),
    "Reciprocal": ("Reciprocal", 17, {}, [rand(2, 3, low=0.5)], {}),
    "Neg": ("Neg", 17, {}, [rand(2, 3)], {}),
    "Exp": ("Exp", 17, {}, [rand(2, 3)], {}),
    "Erf": ("Erf", 17, {}, [rand(2, 3)], {}),
    "Relu": ("Relu", 17, {}, [rand(2, 3)], {}),
    "LeakyRelu": ("LeakyRelu", 17, {"alpha": 0.2}, [rand(2, 3)], {}),
    "Sigmoid": ("Sigmoid", 17, {}, [rand(2, 3)], {}),
    "Tanh": ("Tanh", 17, {}, [rand(2, 3)], {}),
    "Softmax": ("Softmax", 17, {"axis": 1}, [rand(2, 3, 4)], {}),
    "Softmax_opset11": ("Softmax", 11, {"axis": 1}, [rand(2, 3, 4)], {}),
    "LogSoftmax": ("LogSoftmax", 17, {}, [rand(2, 5)], {}),
    "Max": ("Max", 17, {}, [rand(2, 3), rand(2, 3)], {}),
    "Min": ("Min", 17, {}, [rand(2, 3), rand(1, 3)], {}),
    "Abs": ("Abs", 17, {}, [rand(2, 3)], {}),
    "Log": ("Log", 17, {}, [rand(2, 3, low=0.1)], {}),
    "Floor": ("Floor", 17, {}, [rand(2, 3)], {}),
    "Equal": ("Equal", 17, {}, [rand(2, 3, dtype=I64, low=0, high=3),
                                rand(2, 3, dtype=I64, low=0, high=3)], {}),
    "Less": ("Less", 17, {}, [rand(2, 3), rand(3)], {}),
    "Greater": ("Greater", 17, {}, [rand(2, 3), rand(2, 1)], {}),
    "And": ("And", 17, {}, [rand(2, 3) > 0, rand(2, 3) > 0], {}),
    "Or": ("Or", 17, {}, [rand(2, 3) > 0, rand(2, 3) > 0], {}),
    "Not": ("Not", 17, {}, [rand(2, 3) > 0], {}),
    "Constant": ("Constant", 17, {"value": numpy_helper.from_array(rand(2, 3))}, [], {}),
    "Where": ("Where", 17, {}, [rand(2, 3) > 0, rand(2, 3), rand(2, 3)], {}),
    "Gather": ("Gather", 17, {"axis": 0}, [rand(6, 4)], {"indices": const([[0, 5], [-1, 2]])}),
    "Gather_axis1": ("Gather", 17, {"axis": 1}, [rand(3, 4)], {"indices": const([3, 0])}),
    "Concat": ("Concat", 17, {"axis": -1}, [rand(2, 3), rand(2, 2)], {}),
    "Reshape": ("Reshape", 17, {}, [rand(2, 3, 4)], {"shape": const([0, -1])}),
    "Transpose": ("Transpose", 17, {"perm": [1, 0, 2]}, [rand(2, 3, 4)], {}),
    "Flatten": ("Flatten", 17, {"axis": 2}, [rand(2, 3, 4)], {}),
    "Slice": ("Slice", 17, {}, [rand(4, 6)], {"starts": const([1]), "ends": const([100]),
                                              "axes": const([1]), "steps": const([2])}),
    "Expand": ("Expand", 17, {}, [rand(3, 1)], {"shape": const([2, 3, 4])}),
    "Squeeze": ("Squeeze", 17, {}, [rand(2, 1, 3)], {"axes": const([1])}),
    "Squeeze_opset11": ("Squeeze", 11, {"axes": [1]}, [rand(2, 1, 3)], {}),
    "Unsqueeze": ("Unsqueeze", 17, {}, [rand(2, 3)], {"axes": const([0, -1])}),
    "Unsqueeze_opset11": ("Unsqueeze", 11, {"axes": [1]}, [rand(2, 3)], {}),
    "ReduceMean": ("ReduceMean", 17, {"axes": [1], "keepdims": 0}, [rand(2, 3, 4)], {}),
    "ReduceMean_opset18": ("ReduceMean", 18, {"keepdims": 1}, [rand(2, 3, 4)], {"axes": const([-1])}),
    "ReduceSum": ("ReduceSum", 17, {"keepdims": 0}, [rand(2, 3, 4)], {"axes": const([0, 2])}),
    "ReduceSum_int": ("ReduceSum", 17, {}, [rand(2, 3, dtype=np.int32, low=0, high=9)], {"axes": const([1])}),
    "ReduceMax": ("ReduceMax", 17, {"axes": [1]}, [rand(2, 3)], {}),
    "Cast_int": ("Cast", 17, {"to": TensorProto.INT32}, [rand(2, 3, low=-5, high=5)], {}),
    "Cast_float": ("Cast", 17, {"to": TensorProto.FLOAT}, [rand(2, 3, dtype=I64, low=0, high=9)], {}),
    "Identity": ("Identity", 17, {}, [rand(2, 3)], {}),
    "Shape": ("Shape", 17, {}, [rand(2, 3, 4)], {}),
    "Clip": ("Clip", 17, {}, [rand(2, 3)], {"min": const(-0.5, F), "max": const(0.5, F)}),
    "LayerNormalization": ("LayerNormalization", 17, {"axis": -1, "epsilon": 1e-3},
                           [rand(2, 3, 8), rand(8), rand(8)], {}),
    # Segment sums, ragged pooling, sparse lookups: what tf2onnx emits for them.
    "Tile": ("Tile", 17, {}, [rand(2, 3)], {"repeats": const([2, 1])}),
    "Tile_runtime_repeats": ("Tile", 17, {}, [rand(1, 3), const([3, 2])], {}),
    "ConstantOfShape": ("ConstantOfShape", 17,
                        {"value": numpy_helper.from_array(const([7], np.int32))},
                        [const([2, 3])], {}),
    "ConstantOfShape_default": ("ConstantOfShape", 17, {}, [const([4])], {}),
    "Range": ("Range", 17, {}, [const(1), const(10), const(3)], {}),
    "Range_float_empty": ("Range", 17, {}, [const(2.0, F), const(1.0, F), const(0.5, F)], {}),
    "CumSum": ("CumSum", 17, {}, [rand(3, 4)], {"axis": const(1)}),
    "CumSum_exclusive_reverse": ("CumSum", 17, {"exclusive": 1, "reverse": 1},
                                 [rand(3, 4, dtype=np.int32, low=0, high=9)], {"axis": const(0)}),
    "ScatterND": ("ScatterND", 17, {}, [rand(4, 3), const([[2], [0]]), rand(2, 3)], {}),
    "ScatterND_add_segment_sum": ("ScatterND", 17, {"reduction": "add"},
                                  [np.zeros((3, 2), F), const([[0], [2], [0], [1], [2]]),
                                   rand(5, 2)], {}),
    "ScatterND_elements": ("ScatterND", 17, {"reduction": "mul"},
                           [rand(2, 3), const([[0, 1], [1, 2], [0, 1]]), rand(3)], {}),
    "ScatterElements": ("ScatterElements", 17, {"axis": 1},
                        [rand(2, 4), const([[3, -4], [1, 2]]), rand(2, 2)], {}),
    "ScatterElements_max": ("ScatterElements", 18, {"axis": 0, "reduction": "max"},
                            [rand(3, 2), const([[0, 2], [0, 2]]), rand(2, 2)], {}),
    "Pad": ("Pad", 17, {}, [rand(2, 3)], {"pads": const([0, 1, 1, 2]),
                                          "value": const(-1.0, F)}),
    "Pad_crop": ("Pad", 17, {}, [rand(3, 4)], {"pads": const([-1, 0, 0, -2])}),
    "Pad_edge": ("Pad", 17, {"mode": "edge"}, [rand(2, 3)], {"pads": const([1, 0, 0, 2])}),
    "Pad_reflect": ("Pad", 17, {"mode": "reflect"}, [rand(2, 4)], {"pads": const([0, 2, 0, 3])}),
    "Pad_wrap_axes": ("Pad", 19, {"mode": "wrap"}, [rand(2, 3)],
                      {"pads": const([2, 4]), "value": const(0.0, F), "axes": const([-1])}),
    "Mod": ("Mod", 17, {}, [rand(2, 3, dtype=I64, low=-9, high=9),
                            rand(2, 3, dtype=I64, low=1, high=4) * const([[1, -1, 1]])], {}),
    "Mod_fmod": ("Mod", 17, {"fmod": 1}, [rand(2, 3), rand(2, 3, low=0.5, high=2.0)], {}),
    "GatherND": ("GatherND", 17, {}, [rand(3, 4, 2), const([[[2, 1]], [[0, -1]]])], {}),
    "GatherND_batch_dims": ("GatherND", 17, {"batch_dims": 1},
                            [rand(2, 3, 4), const([[[1], [0]], [[2], [2]]])], {}),
    "NonZero": ("NonZero", 17, {}, [rand(3, 4, dtype=I64, low=0, high=2)], {}),
    "Compress": ("Compress", 17, {"axis": 1}, [rand(2, 4)], {"c": np.array([1, 0, 1], bool)}),
    "Compress_flat": ("Compress", 17, {}, [rand(2, 3)], {"c": np.array([0, 1, 1, 0, 1], bool)}),
}

# Ops with several outputs: (op_type, opset, attrs, runtime inputs, constants, output count).
MULTI_OUTPUT_CASES = {
    "TopK": ("TopK", 17, {"axis": 1}, [rand(3, 6)], {"k": const([2])}, 2),
    "TopK_smallest": ("TopK", 17, {"axis": 0, "largest": 0}, [rand(5, 2)], {"k": const([3])}, 2),
    "Unique": ("Unique", 17, {}, [const([4, 1, 4, 9, 1, 1])], {}, 4),
    "Unique_first_occurrence": ("Unique", 17, {"sorted": 0}, [const([[4, 1], [4, 9], [0, 1]])],
                                {}, 4),
    "Unique_rows": ("Unique", 17, {"axis": 0}, [const([[1, 2], [0, 5], [1, 2]])], {}, 4),
}


def single_node_model(op_type, opset, attrs, inputs, constants):
    names = [f"x{i}" for i in range(len(inputs))] + list(constants)
    graph_inputs = [helper.make_tensor_value_info(
        f"x{i}", helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for i, v in enumerate(inputs)]
    inits = [numpy_helper.from_array(v, name) for name, v in constants.items()]
    node = helper.make_node(op_type, names, ["y"], name="n0", **attrs)
    # Output element type: Cast's target, Shape's int64, Where's branches, else the first input.
    if op_type in ("Constant", "ConstantOfShape"):
        out_type = attrs["value"].data_type if "value" in attrs else TensorProto.FLOAT
    elif op_type == "NonZero":
        out_type = TensorProto.INT64
    elif op_type in ("Equal", "Less", "Greater"):
        out_type = TensorProto.BOOL
    else:
        out_type = attrs.get("to") or (TensorProto.INT64 if op_type == "Shape" else
                                       helper.np_dtype_to_tensor_dtype(
                                           inputs[op_type == "Where"].dtype))
    graph = helper.make_graph([node], "case", graph_inputs,
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # onnxruntime validates the model when the session is created.
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_converter_matches_onnxruntime(case):
    op_type, opset, attrs, inputs, constants = CASES[case]
    model = single_node_model(op_type, opset, attrs, inputs, constants)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {f"x{i}": v for i, v in enumerate(inputs)})
    module = OnnxGraphModule(*graph_from_onnx(model))
    got = module(*[torch.from_numpy(v) for v in inputs]).numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = tolerance_for(expected.dtype)
    if tol.exact:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("case", sorted(MULTI_OUTPUT_CASES))
def test_multi_output_converter_matches_onnxruntime(case):
    op_type, opset, attrs, inputs, constants, count = MULTI_OUTPUT_CASES[case]
    model = single_node_model(op_type, opset, attrs, inputs, constants)
    outputs = [f"y{i}" for i in range(count)]
    model.graph.node[0].output[:] = outputs
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {f"x{i}": v for i, v in enumerate(inputs)})
    got = OnnxGraphModule(*graph_from_onnx(model))(*[torch.from_numpy(v) for v in inputs])
    assert len(got) == count
    for g, e in zip(got, expected):
        g = g.numpy()
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, atol=1e-6)


def test_every_registered_op_has_a_case():
    tested = {c[0] for c in CASES.values()} | {c[0] for c in MULTI_OUTPUT_CASES.values()}
    registered = {c.op_type for c in REGISTRY if c.domain == ""}
    untested = registered - tested
    assert not untested, f"converters without an onnxruntime case: {sorted(untested)}"


def test_unknown_op_is_refused_with_its_name():
    model = single_node_model("Erf", 17, {}, [rand(2)], {})
    model.graph.node[0].op_type = "Erfc"
    with pytest.raises(ConversionError, match="Erfc has no Torch converter"):
        OnnxGraphModule(*graph_from_onnx(model))


def test_opset_too_old_for_every_version_is_refused():
    model = single_node_model("LayerNormalization", 17, {}, [rand(2, 4), rand(4)], {})
    model.opset_import[0].version = 16
    with pytest.raises(ConversionError, match="only from opset 17"):
        OnnxGraphModule(*graph_from_onnx(model))


def test_constant_subgraphs_fold_once_at_build():
    """Shape arithmetic on constants (as tf2onnx emits for Reshape) is evaluated at build time;
    only the node touching the runtime input remains a step."""
    shape = helper.make_node("Constant", [], ["shape"], name="c",
                             value=numpy_helper.from_array(const([3, 2])))
    first = helper.make_node("Unsqueeze", ["shape", "zero"], ["shape_2d"], name="u")
    flat = helper.make_node("Squeeze", ["shape_2d", "zero"], ["target"], name="s")
    reshape = helper.make_node("Reshape", ["x0", "target"], ["y"], name="r")
    graph = helper.make_graph(
        [shape, first, flat, reshape], "fold",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        [numpy_helper.from_array(const([0]), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = OnnxGraphModule(*graph_from_onnx(model))
    assert [node.name for node, _ in module._steps] == ["r"]
    x = rand(2, 3)
    np.testing.assert_array_equal(module(torch.from_numpy(x)).numpy(), x.reshape(3, 2))


def test_weights_become_parameters_and_shapes_buffers():
    model = single_node_model("MatMul", 17, {}, [rand(2, 4)], {"w": rand(4, 3)})
    module = OnnxGraphModule(*graph_from_onnx(model))
    assert [tuple(p.shape) for p in module.parameters()] == [(4, 3)]


def test_custom_domain_node_without_twin_is_refused():
    model = single_node_model("Relu", 17, {}, [rand(2)], {})
    model.graph.node[0].domain = "xgr.custom"
    model.graph.node[0].op_type = "XgrNoSuchOp"
    with pytest.raises(ConversionError, match="custom op XgrNoSuchOp has no Torch twin"):
        OnnxGraphModule(*graph_from_onnx(model))


def test_wrong_input_rank_is_named():
    model = single_node_model("Relu", 17, {}, [rand(2, 3)], {})
    module = OnnxGraphModule(*graph_from_onnx(model))
    with pytest.raises(Exception, match="input 'x0': expected rank 2"):
        module(torch.zeros(6))
