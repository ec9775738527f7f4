"""``experiments.generated_kernels`` on sources written as Inductor writes them: a generated
pointwise kernel and a user kernel with its launch configs and argument attributes, and the
C++ wrapper's comment lines above a launch."""

from __future__ import annotations

from experiments.generated_kernels import (generated_origins, jit_specializations,
                                           kernel_launches, wrapper_context)

GENERATED = '''
import triton


@triton_heuristics.pointwise(
    size_hints={'x': 134217728},
    inductor_meta={'kernel_name': 'triton_poi_fused_34', 'mutated_arg_names': ['in_out_ptr0']},
)
@triton.jit
def triton_poi_fused_34(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 117440512
    xoffset = tl.program_id(0) * XBLOCK


@triton_heuristics.user_autotune(
    configs=[{'num_warps': 8, 'num_stages': 3}],
    inductor_meta={'kernel_name': '_silu_mul_kernel_0', 'mutated_arg_names': ['out_ptr']},
    triton_meta={'signature': {'gu_ptr': '*bf16', 'eps': 'fp64'}, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]]}]},
)
@triton.jit
def _silu_mul_kernel(gu_ptr, x_ptr, out_ptr, size, BLOCK: tl.constexpr):
    row = tl.program_id(0)
'''

WRAPPER = '''
void launch() {
    // Topologically Sorted Source Nodes: [copy_1, cat], Original ATen: [aten.copy, aten.cat]
    triton_poi_fused_34(buf1, 117440512);
}
'''


def test_sources_name_what_each_kernel_is(tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "kernels.py").write_text(GENERATED)
    (tmp_path / "wrapper.cpp").write_text(WRAPPER)
    found = generated_origins(tmp_path, ["triton_poi_fused_34", "_silu_mul_kernel", "absent"])
    assert set(found) == {"triton_poi_fused_34", "_silu_mul_kernel"}
    copy = found["triton_poi_fused_34"]
    assert copy["xnumel"] == "117440512" and copy["mutated"] == "['in_out_ptr0']"
    assert copy["size_hints"] == "{'x': 134217728}" and copy["file"] == "ab/kernels.py"
    user = found["_silu_mul_kernel"]
    assert user["launch_configs"] == "[{'num_warps': 8, 'num_stages': 3}]"
    assert user["arg_attributes"] == ("[{(0,): [['tt.divisibility', 16]], "
                                      "(1,): [['tt.divisibility', 16]]}]")
    assert user["signature"] == "{'gu_ptr': '*bf16', 'eps': 'fp64'}"
    assert copy["signature"] is None
    context = wrapper_context(tmp_path, ["triton_poi_fused_34"])["triton_poi_fused_34"]
    assert "Original ATen: [aten.copy, aten.cat]" in context[0]
    assert context[-1].startswith("triton_poi_fused_34(buf1")


def test_without_a_gpu_there_is_nothing_to_read():
    class Kernel:        # a @jit function's cache: device -> (compiled kernels by key, ...)
        device_caches = {0: ({"key-a": object()}, None)}

    class Wrapped:
        fn = Kernel()

    assert jit_specializations({"k": Wrapped()}) == {"k": ["key-a"]}
    assert kernel_launches(lambda: None) == {}
