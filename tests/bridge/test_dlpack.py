"""The DLPack bridge: zero-copy proven by data pointers, values for every dtype both ways."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from bridge.dlpack import plan_to_tf, plan_to_torch, tf_data_pointer, to_tf, to_torch
from bridge.dtypes import DTYPES, Mode
from xgr_common.errors import BridgeError, InvalidInputError
from xgr_common.tolerances import tolerance_for

ZERO_COPY = [row.name for row in DTYPES
             if row.to_torch.mode is Mode.ZERO_COPY and row.to_tf.mode is Mode.ZERO_COPY]
SHAPES = {"matrix": (3, 5), "scalar": (), "empty": (0,), "empty_inner": (2, 0, 3)}


def _sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct values exactly representable in ``dtype`` (bfloat16 included)."""
    n = int(np.prod(shape, dtype=np.int64))
    values = (np.arange(n) % 7 - (0 if dtype.startswith("uint") else 3)).reshape(shape)
    if dtype == "bool":
        return np.asarray(values % 2 == 0)
    if dtype.startswith("complex"):
        return np.asarray(values + 0.5j * values, dtype=dtype)
    return np.asarray(values, dtype="float32" if dtype == "bfloat16" else dtype)


def _tf_values(x: tf.Tensor) -> np.ndarray:
    return tf.cast(x, tf.float32).numpy() if x.dtype == tf.bfloat16 else x.numpy()


def _torch_values(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", ZERO_COPY)
def test_tf_to_torch_keeps_dtype_shape_values(dtype, shape):
    x = tf.cast(tf.constant(_sample(dtype, shape)), dtype)
    t = to_torch(x)
    assert str(t.dtype) == f"torch.{dtype}" and tuple(t.shape) == shape
    np.testing.assert_array_equal(_torch_values(t), _tf_values(x))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", ZERO_COPY)
def test_torch_to_tf_keeps_dtype_shape_values(dtype, shape):
    t = torch.from_numpy(_sample(dtype, shape)).to(getattr(torch, dtype)).clone()
    x = to_tf(t)
    assert x.dtype.name == dtype and tuple(x.shape) == shape
    np.testing.assert_array_equal(_tf_values(x), _torch_values(t))


@pytest.mark.parametrize("dtype", ZERO_COPY)
def test_tf_to_torch_shares_the_buffer(dtype):
    x = tf.cast(tf.constant(_sample(dtype, (4, 8))), dtype)
    assert plan_to_torch(x).mode is Mode.ZERO_COPY
    assert to_torch(x).data_ptr() == tf_data_pointer(x)


@pytest.mark.parametrize("dtype", ZERO_COPY)
def test_torch_to_tf_shares_the_buffer(dtype):
    t = torch.from_numpy(_sample(dtype, (4, 8))).to(getattr(torch, dtype)).clone()
    assert plan_to_tf(t).mode is Mode.ZERO_COPY
    assert tf_data_pointer(to_tf(t)) == t.data_ptr()


def test_zero_copy_aliases_and_keeps_the_source_alive():
    t = torch.zeros(16)
    x = to_tf(t)
    t[3] = 7.0  # an in-place write on the torch side is visible to TF: one buffer
    assert float(x[3]) == 7.0
    del t  # the TF tensor holds the torch buffer through the DLPack deleter
    assert float(tf.reduce_sum(x)) == 7.0


def test_round_trip_returns_the_same_buffer():
    t = torch.arange(64, dtype=torch.int64)
    back = to_torch(to_tf(t))
    assert back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)


def test_requires_grad_is_detached_without_a_copy():
    t = torch.ones(4, 4, requires_grad=True)
    plan = plan_to_tf(t)
    assert plan.mode is Mode.ZERO_COPY and plan.steps == ("requires_grad",)
    x = to_tf(t)
    assert tf_data_pointer(x) == t.data_ptr()
    np.testing.assert_array_equal(x.numpy(), np.ones((4, 4), np.float32))


NON_CONTIGUOUS = {
    "transpose": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "step_slice": lambda: torch.arange(20.0)[::3],
    "expand": lambda: torch.arange(4.0).reshape(1, 4).expand(3, 4),
    "permute_3d": lambda: torch.arange(24, dtype=torch.int32).reshape(2, 3, 4).permute(2, 0, 1),
}


@pytest.mark.parametrize("make", NON_CONTIGUOUS.values(), ids=NON_CONTIGUOUS.keys())
def test_non_contiguous_is_copied_once_into_a_compact_buffer(make):
    t = make()
    plan = plan_to_tf(t)
    assert plan.mode is Mode.COPY and "non_contiguous" in plan.steps
    x = to_tf(t)
    np.testing.assert_array_equal(x.numpy(), t.numpy())
    assert tf_data_pointer(x) % 64 == 0
    # TF arithmetic on the result must see the logical (strided) values.
    assert float(tf.reduce_sum(tf.cast(x, tf.float64))) == float(t.double().sum())


@pytest.mark.parametrize("offset", [1, 3, 15])
def test_unaligned_torch_memory_reaches_tf_aligned(offset):
    base = torch.arange(256, dtype=torch.float32)
    t = base[offset:]
    assert t.is_contiguous() and t.data_ptr() % 64 != 0
    plan = plan_to_tf(t)
    assert plan.mode is Mode.COPY and plan.steps == ("unaligned",)
    x = to_tf(t)
    assert tf_data_pointer(x) % 64 == 0
    np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_aligned_view_into_a_larger_buffer_stays_zero_copy():
    base = torch.arange(256, dtype=torch.float32)
    t = base[16:]  # 16 float32 = 64 bytes: still on a 64-byte boundary
    x = to_tf(t)
    assert plan_to_tf(t).mode is Mode.ZERO_COPY and tf_data_pointer(x) == t.data_ptr()


def test_numpy_backed_tensor_is_aligned_for_tf():
    array = np.arange(40, dtype=np.float64)[1:]  # NumPy guarantees only 16-byte alignment
    t = torch.from_numpy(array)
    x = to_tf(t)
    assert tf_data_pointer(x) % 64 == 0
    np.testing.assert_array_equal(x.numpy(), array)


def test_lazy_conjugate_and_negation_bits_are_resolved():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    conj = z.conj()          # lazy: same buffer, conj bit set; raw DLPack would drop the bit
    neg = z.conj().imag      # lazy negation bit
    assert plan_to_tf(conj).steps == ("lazy_conj_or_neg",)
    np.testing.assert_array_equal(to_tf(conj).numpy(), np.array([1 - 2j, 3 + 4j], np.complex64))
    np.testing.assert_array_equal(to_tf(neg).numpy(), np.array([-2.0, 4.0], np.float32))


def test_capsules_are_consumed_once():
    capsule = tf.experimental.dlpack.to_dlpack(tf.constant([1.0, 2.0]))
    assert to_torch(capsule).tolist() == [1.0, 2.0]
    with pytest.raises(BridgeError, match="consumed once"):
        to_torch(capsule)
    capsule = torch.utils.dlpack.to_dlpack(torch.tensor([3, 4]))
    assert to_tf(capsule).numpy().tolist() == [3, 4]
    with pytest.raises(BridgeError, match="consumed once"):
        to_tf(capsule)


def test_capsule_to_tf_still_gets_the_alignment_check():
    capsule = torch.utils.dlpack.to_dlpack(torch.arange(33.0)[1:])
    assert tf_data_pointer(to_tf(capsule)) % 64 == 0


def test_rejects_what_is_not_an_eager_tensor():
    with pytest.raises(BridgeError, match="ResourceVariable"):
        to_torch(tf.Variable([1.0]))
    with pytest.raises(BridgeError, match="ndarray"):
        to_torch(np.ones(3))
    with pytest.raises(BridgeError, match="expected a torch.Tensor"):
        to_tf(np.ones(3))

    @tf.function(autograph=False)  # autograph would wrap the error in a StagingError
    def inside_graph(x):
        return to_torch(x)

    with pytest.raises(BridgeError, match="symbolic"):
        inside_graph(tf.constant([1.0]))


def test_bad_device_argument_is_named():
    with pytest.raises(InvalidInputError, match="device must be a torch device.*'gpu0'"):
        to_torch(tf.constant([1.0]), device="gpu0")


def test_rejects_sparse_and_meta_tensors():
    with pytest.raises(BridgeError, match="to_dense"):
        to_tf(torch.eye(3).to_sparse())
    with pytest.raises(BridgeError, match="CPU and CUDA"):
        to_tf(torch.empty(3, device="meta"))


def test_rejected_torch_dtype_names_the_reason():
    with pytest.raises(BridgeError, match="float8"):
        to_tf(torch.zeros(4).to(torch.float8_e4m3fn))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ZERO_COPY)
def test_cpu_tf_tensor_to_cuda_is_one_copy_and_back(dtype):
    x = tf.cast(tf.constant(_sample(dtype, (64, 32))), dtype)
    assert plan_to_torch(x, "cuda").steps == ("device_mismatch",)
    t = to_torch(x, device="cuda")
    assert t.device.type == "cuda"
    np.testing.assert_array_equal(_torch_values(t.cpu()), _tf_values(x))
    plan = plan_to_tf(t)
    back = to_tf(t)
    if not tf.config.list_logical_devices("GPU"):  # a CPU build of TF beside CUDA torch
        assert plan.steps == ("cuda_without_tf_gpu",) and "CPU" in back.device
    np.testing.assert_array_equal(_tf_values(back), _tf_values(x))


@pytest.mark.gpu
def test_unaligned_cuda_tensor_reaches_tf_usable():
    base = torch.arange(257, dtype=torch.float32, device="cuda")
    x = to_tf(base[1:].reshape(16, 16))
    expected = base[1:].reshape(16, 16).double().cpu().numpy()
    tol = tolerance_for("float32")
    np.testing.assert_allclose(tf.matmul(x, x).numpy(), expected @ expected, rtol=tol.rtol)


def test_directions_are_named_in_errors():
    # Only dtypes whose raw export raises (not aborts) here; the aborting ones run in
    # test_dlpack_traps.py, each in a child process.
    quantized = tf.constant(np.array([1, 2], np.int8), dtype=tf.qint8)
    with pytest.raises(BridgeError, match="TF -> Torch: a qint8 tensor .* quantized"):
        to_torch(quantized)
    with pytest.raises(BridgeError, match="Torch -> TF: a float8_e5m2 tensor"):
        to_tf(torch.zeros(2).to(torch.float8_e5m2))


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float32", "float16", "int64", "int8", "bool", "complex64"]),
       shape=st.lists(st.integers(0, 5), min_size=1, max_size=3),
       offset=st.integers(0, 3), step=st.integers(1, 2), transpose=st.booleans())
def test_any_strided_view_reaches_tf_with_its_values_and_aligned(dtype, shape, offset, step,
                                                                 transpose):
    """Property: whatever view torch hands over, TF sees the view's values in aligned memory."""
    numel = int(np.prod(shape)) * step + offset
    base = torch.from_numpy(_sample(dtype, (numel,))).to(getattr(torch, dtype)).clone()
    view = base[offset:][::step][:int(np.prod(shape))].reshape(shape)
    if transpose and view.dim() >= 2:
        view = view.transpose(0, -1)
    x = to_tf(view)
    np.testing.assert_array_equal(x.numpy(), view.numpy())
    if view.numel():  # empty tensors have no buffer to share or align
        assert tf_data_pointer(x) % 64 == 0
        shared = tf_data_pointer(x) == view.data_ptr()
        assert shared == (plan_to_tf(view).mode is Mode.ZERO_COPY)


def test_the_hand_off_is_at_the_top_of_bridge():
    import bridge
    import bridge.dlpack

    assert bridge.to_torch is bridge.dlpack.to_torch and bridge.to_tf is bridge.dlpack.to_tf
    back = bridge.to_tf(bridge.to_torch(tf.constant([1.5, -2.0])))
    np.testing.assert_array_equal(back.numpy(), [1.5, -2.0])


def test_without_the_ownership_swap_to_tf_copies_what_a_resize_could_free(monkeypatch):
    """A torch that cannot move a storage's allocation (before 2.13) gets one copy, so a
    resize of the torch tensor afterwards cannot free what TF reads."""
    import bridge.dlpack as dlpack

    monkeypatch.setattr(dlpack, "can_pin", lambda: False)
    source = torch.arange(1024, dtype=torch.float32)
    assert "unpinnable" in dlpack.plan_to_tf(source).steps
    view = dlpack.to_tf(source)
    assert dlpack.tf_data_pointer(view) != source.data_ptr()
    source.resize_(1 << 22).fill_(-1.0)          # reallocates torch's buffer
    np.testing.assert_array_equal(view.numpy(), np.arange(1024, dtype=np.float32))
