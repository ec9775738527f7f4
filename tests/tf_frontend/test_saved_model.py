"""SavedModel export: reload in a fresh process with only TF + custom_ops, exact outputs, and a
clear error when the op library is not loaded."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.child_env import child_env
from tf_frontend.feature_graph import INPUTS, OUTPUTS, features_from_world
from tf_frontend.saved_model import (export_feature_graph, load_saved_model,
                                     op_library_of, serving_function)
from xgr_common.serving_names import SERVING_SIGNATURE
from xgr_common.tolerances import tolerance_for

# Heavy (SavedModels reloaded in fresh processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def exported(graph, world, tmp_path_factory):
    """The SavedModel, moved away from where it was written, and in-process outputs."""
    directory = tmp_path_factory.mktemp("saved")
    path = export_feature_graph(graph, directory / "written")
    moved = path.rename(directory / "moved")
    features = features_from_world(world, np.arange(9))
    # Fixed-width bytes for the string feature: object arrays would need pickle to reload.
    np.savez(directory / "features.npz",
             **{k: v.numpy().astype(np.bytes_ if v.dtype == tf.string else v.dtype.as_numpy_dtype)
                for k, v in features.items()})
    expected = {k: v.numpy() for k, v in serving_function(graph)(features).items()}
    return moved, directory / "features.npz", expected, graph(features)


def test_signature_names_every_input_and_output(exported):
    model = load_saved_model(exported[0])  # custom_ops is loaded in this process
    signature = model.signatures[SERVING_SIGNATURE]
    inputs = signature.structured_input_signature[1]
    assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == \
        {k: (dtype, [None]) for k, dtype in INPUTS.items()}
    assert sorted(signature.structured_outputs) == sorted(OUTPUTS)


def test_catalog_travels_as_an_asset(exported):
    assert (exported[0] / "assets" / "catalog.xgrsid").is_file()


def test_fresh_process_with_only_tf_and_custom_ops_reproduces_outputs_exactly(exported, tmp_path):
    path, features_file, expected, _ = exported
    result = _run(f"""
        import sys
        import numpy as np, tensorflow as tf
        import custom_ops
        model = tf.saved_model.load({str(path)!r})
        loaded = sorted({{m.split('.')[0] for m in sys.modules}} & {{'tf_frontend', 'bridge',
                                                                   'torch'}})
        features = {{k: tf.constant(v) for k, v in np.load({str(features_file)!r}).items()}}
        out = model.signatures[{SERVING_SIGNATURE!r}](**features)
        np.savez({str(tmp_path / 'out.npz')!r}, **{{k: v.numpy() for k, v in out.items()}})
        print('python modules of the project loaded:', loaded)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "python modules of the project loaded: []" in result.stdout
    got = np.load(tmp_path / "out.npz")
    assert sorted(got.files) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_traced_function_agrees_with_eager_call(exported):
    """Graph mode may fuse the tower's kernels: ids exact, floats within the table."""
    _, _, traced, eager = exported
    for name in OUTPUTS:
        tol = tolerance_for(traced[name].dtype)
        if tol.exact:
            np.testing.assert_array_equal(traced[name], eager[name].numpy(), err_msg=name)
        else:
            np.testing.assert_allclose(traced[name], eager[name].numpy(), atol=tol.atol,
                                       rtol=tol.rtol, err_msg=name)


def test_missing_op_library_gives_a_clear_error(exported):
    result = _run(f"""
        import sys
        from tf_frontend.saved_model import load_saved_model
        from xgr_common.errors import OpLibraryError
        assert 'custom_ops' not in sys.modules
        try:
            load_saved_model({str(exported[0])!r})
        except OpLibraryError as error:
            print('OpLibraryError:', error)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    message = result.stdout
    assert "OpLibraryError:" in message
    assert "uses op 'Xgr" in message
    assert "custom_ops._feature_ops" in message and "_feature_ops" in message.split("(")[1]
    assert "`import custom_ops`" in message
    assert "Op type not registered" not in message


def test_op_library_of_reads_the_registrations():
    assert op_library_of("XgrAssemblePrompt") == "feature_ops"
    assert op_library_of("XgrSemanticIdTableHandle") == "feature_ops"
    assert op_library_of("NoSuchOp") is None


def test_loading_a_non_savedmodel_keeps_tf_error(tmp_path):
    with pytest.raises(OSError):
        load_saved_model(tmp_path / "nothing-here")
