"""The support table drives the bridge, its plans, and the committed Markdown page."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch

from bridge import dlpack
from bridge.dlpack import plan_tf_to_torch, plan_torch_to_tf, to_tf, to_torch
from bridge.dtypes import CONDITIONS, DTYPES, TO_TF, TO_TORCH, Mode, dtype_rule, render_markdown
from xgr_common.errors import BridgeError

ROOT = Path(__file__).resolve().parents[2]
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)

# Rejected rows that can be driven in this process (the aborting ones: test_dlpack_traps.py).
TF_REJECTED = {
    "qint8": lambda: tf.constant(np.array([1, 2], np.int8), dtype=tf.qint8),
    "quint8": lambda: tf.constant(np.array([1, 2], np.uint8), dtype=tf.quint8),
    "qint32": lambda: tf.constant(np.array([1, 2], np.int32), dtype=tf.qint32),
    "float8_e4m3fn": lambda: tf.cast([1.0], tf.dtypes.experimental.float8_e4m3fn),
    "float8_e5m2": lambda: tf.cast([1.0], tf.dtypes.experimental.float8_e5m2),
}
ABORTING_IN_RAW_DLPACK = {"string", "resource", "variant"}
TORCH_REJECTED = {
    "qint8": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
    "quint8": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
    "qint32": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint32),
    "float8_e4m3fn": lambda: torch.zeros(3).to(torch.float8_e4m3fn),
    "float8_e5m2": lambda: torch.zeros(3).to(torch.float8_e5m2),
}


def test_committed_markdown_equals_the_generated_table():
    committed = (ROOT / "migration_guide" / "bridge_dtypes.md").read_text()
    assert committed == render_markdown(), \
        "regenerate: python -m bridge.dlpack --markdown > migration_guide/bridge_dtypes.md"


def test_cli_prints_the_table(capsys):
    dlpack.main(["--markdown"])
    assert capsys.readouterr().out == render_markdown()


def test_every_rejected_row_is_driven_by_a_test():
    rejected_to_torch = {r.name for r in DTYPES if r.to_torch.mode is Mode.REJECTED}
    assert rejected_to_torch == set(TF_REJECTED) | ABORTING_IN_RAW_DLPACK
    torch_names = {r.name for r in DTYPES if hasattr(torch, r.name)}
    rejected_to_tf = {r.name for r in DTYPES if r.to_tf.mode is Mode.REJECTED} & torch_names
    assert rejected_to_tf == set(TORCH_REJECTED)


@pytest.mark.parametrize("name", TF_REJECTED)
def test_rejected_tf_dtype_raises_with_the_table_reason(name):
    reason = dtype_rule(name, TO_TORCH).reason
    with pytest.raises(BridgeError) as error:
        to_torch(TF_REJECTED[name]())
    assert reason in str(error.value) and name in str(error.value)


@pytest.mark.parametrize("name", TORCH_REJECTED)
def test_rejected_torch_dtype_raises_with_the_table_reason(name):
    with pytest.raises(BridgeError) as error:
        to_tf(TORCH_REJECTED[name]())
    assert dtype_rule(name, TO_TF).reason in str(error.value)


def test_unknown_dtypes_are_rejected_not_guessed():
    rule = dtype_rule("int4", TO_TORCH)
    assert rule.mode is Mode.REJECTED and "support table" in rule.reason


@pytest.mark.parametrize("entry", CONDITIONS,
                         ids=[f"{entry.key}-{entry.direction}" for entry in CONDITIONS])
def test_every_condition_has_a_reason_and_a_known_direction(entry):
    assert entry.direction in (TO_TORCH, TO_TF) and len(entry.reason) > 20, entry


# Plans for devices this CPU machine lacks: pure functions of the tensor's properties.

def test_plan_cpu_tf_tensor_to_cuda_is_one_copy():
    plan = plan_tf_to_torch("float32", CPU, CUDA)
    assert plan.mode is Mode.COPY and plan.steps == ("device_mismatch",)


def test_plan_gpu_tf_tensor_to_same_cuda_device_is_zero_copy():
    assert plan_tf_to_torch("bfloat16", CUDA, torch.device("cuda")).mode is Mode.ZERO_COPY


def test_plan_int32_on_a_tf_gpu_is_staged_through_the_host():
    plan = plan_tf_to_torch("int32", CUDA, CUDA)
    assert plan.mode is Mode.COPY and plan.steps == ("host_staging",)
    assert "host memory" in plan.reasons[0]
    assert plan_tf_to_torch("int64", CUDA, CUDA).mode is Mode.ZERO_COPY


def test_plan_cuda_torch_tensor_to_tf_with_and_without_a_tf_gpu():
    with_gpu = plan_torch_to_tf("float32", "cuda", tf_has_gpu=True)
    assert with_gpu.mode is Mode.ZERO_COPY and with_gpu.target_device.type == "cuda"
    without = plan_torch_to_tf("float32", "cuda", tf_has_gpu=False)
    assert without.mode is Mode.COPY and without.steps == ("cuda_without_tf_gpu",)
    assert without.target_device == CPU


def test_plan_cuda_int32_to_a_tf_gpu_goes_to_host_memory():
    plan = plan_torch_to_tf("int32", "cuda", tf_has_gpu=True)
    assert plan.mode is Mode.COPY and plan.steps == ("host_staging",)
    assert plan.target_device == CPU


def test_plan_gathers_every_reason_for_one_copy():
    plan = plan_torch_to_tf("complex64", "cpu", contiguous=False, lazy_bits=True,
                            requires_grad=True)
    assert plan.mode is Mode.COPY
    assert plan.steps == ("requires_grad", "lazy_conj_or_neg", "non_contiguous")
    assert len(plan.reasons) == 3


def test_plan_rejects_unsupported_layouts_and_devices():
    with pytest.raises(BridgeError, match="non-strided|to_dense"):
        plan_torch_to_tf("float32", "cpu", strided=False)
    with pytest.raises(BridgeError, match="CPU and CUDA"):
        plan_torch_to_tf("float32", "mps")
