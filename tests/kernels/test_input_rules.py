"""The input-rules kernel (flags and sanitised copy of ``Engine.recommend``'s inputs in one
launch) against its plain-torch reference: equal flags and bit-equal outputs on valid batches,
on each rule broken alone, on rows of many blocks and ragged lengths; the launcher's rejections;
the kernel compiled for sm_90.

On the CPU the kernel runs under Triton's interpreter (the root conftest sets it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.sm90_compile import assert_no_spills, compiled_lines
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.checks import Verdict, check_arguments
from torch_engine.config import EngineConfig, preset
from torch_engine.engine import Engine
from torch_engine.kernels.input_rules import input_rules
from torch_engine.model import Model
from torch_engine.reference.input_rules import input_rules as reference
from torch_engine.reference.input_rules import unpack_extent
from torch_engine.runner import rules_for
from xgr_common.buckets import EXTENT_LIMIT, pack_extent
from xgr_common.errors import InvalidInputError
from xgr_common.value_rules import FLAG_COUNT, FLAG_INDEX, VALUE_RULES

SHORT, LONG, TOKENS, SEGMENTS, EXCLUDE, LONGEST = (
    FLAG_INDEX[name] for name in ("lengths_positive", "lengths_fit", "token_range",
                                  "segment_order", "exclusion_ids", "positions"))
ANY_RULES = [rule.name for rule in VALUE_RULES if rule.reduction == "any"]
VOCAB = 50


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator with a fresh seed each run (printed, so a failure can be replayed):
    batches are drawn on the CPU, then moved to the device under test."""
    seed = torch.seed() % 2**31
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def valid_batch(gen: torch.Generator, rows: int, width: int, excluded: int, device):
    """Tokens in range, ragged lengths in [1, L] (row 0 full), non-decreasing segments,
    exclusion ids >= -1."""
    tokens = torch.randint(0, VOCAB, (rows, width), generator=gen)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[0] = width
    segments = torch.cumsum((torch.rand(rows, width, generator=gen) < 0.2).int(), 1).int()
    exclude = torch.randint(-1, 10_000, (rows, excluded), generator=gen)
    return [t.to(device) for t in (tokens, lengths, segments, exclude)]


def noisy_batch(gen: torch.Generator, rows: int, width: int, excluded: int, device):
    """Every rule broken somewhere, at random: ids just outside the vocabulary, lengths
    outside [1, L], segments with negative values and drops, exclusion ids < -1."""
    tokens = torch.randint(-3, VOCAB + 3, (rows, width), generator=gen)
    lengths = torch.randint(-2, width + 4, (rows,), generator=gen)
    segments = torch.cumsum((torch.rand(rows, width, generator=gen) < 0.2).int(), 1).int()
    drops = torch.rand(rows, width, generator=gen) < 0.05
    segments = torch.where(drops, segments - torch.randint(1, 6, (rows, width), generator=gen)
                           .int(), segments)
    exclude = torch.randint(-3, 100, (rows, excluded), generator=gen)
    return [t.to(device) for t in (tokens, lengths, segments, exclude)]


OUTPUTS = ("flags", "tokens_out", "total_lengths", "segments_out", "exclude_out")


def run_both(tokens, lengths, segments, exclude, prefix=3, causal=False, extent=None,
             **blocks):
    segments = None if causal else segments
    got = input_rules(tokens, lengths, segments, exclude, VOCAB, prefix, causal, extent,
                      **blocks)
    want = reference(tokens, lengths, segments, exclude, VOCAB, prefix, causal, extent)
    assert len(got) == len(want) == len(OUTPUTS)
    for name, g, w in zip(OUTPUTS, got, want):
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != {w.dtype}"
        assert g.device == w.device, f"{name}: device {g.device} != {w.device}"
        assert torch.equal(g, w), f"{name} differs\nkernel    {g.tolist()}\nreference {w.tolist()}"
    return want


@pytest.mark.parametrize("rows,width,excluded,token_dtype,length_dtype,causal", [
    (1, 1, 1, torch.int64, torch.int64, False),
    (1, 37, 5, torch.int32, torch.int64, False),
    (4, 64, 1, torch.int64, torch.int32, True),
    (3, 90, 33, torch.int32, torch.int32, False),
    (5, 20, 7, torch.int16, torch.uint8, False),
    (2, 10, 0, torch.int64, torch.int64, False),
])
def test_valid_batches_match_the_reference(device, gen, rows, width, excluded, token_dtype,
                                           length_dtype, causal):
    tokens, lengths, segments, exclude = valid_batch(gen, rows, width, excluded, device)
    flags = run_both(tokens.to(token_dtype), lengths.to(length_dtype), segments, exclude,
                     causal=causal)[0]
    assert flags.tolist() == expected_flags([], width)


def expected_flags(broken: list[int], longest: int) -> list[int]:
    """The flags of a batch breaking the rules at indices ``broken``, its longest length
    ``longest``: one entry per rule of the table."""
    flags = [int(index in broken) for index in range(FLAG_COUNT)]
    flags[LONGEST] = longest
    return flags


def test_the_flags_follow_the_table():
    """One flag per rule, in the table's order: every ``any`` rule has a case below that
    breaks it alone, and the one ``max`` rule is the longest length."""
    assert len({SHORT, LONG, TOKENS, SEGMENTS, EXCLUDE, LONGEST}) == FLAG_COUNT
    broken = {FLAG_INDEX[name] for name in ANY_RULES}
    assert broken == {i for flags in BREAKS.values() for i in flags}
    assert [rule.name for rule in VALUE_RULES if rule.reduction == "max"] == ["positions"]


# (what to break, the flags it raises). Slots are of a 50-wide row whose length is 30.
BREAKS = {
    "length_zero": [SHORT],
    "length_negative": [SHORT],
    "length_zero_over_bad_slot_0": [SHORT],
    "length_past_width": [LONG],
    "token_negative_inside": [TOKENS],
    "token_vocab_inside": [TOKENS],
    "token_negative_outside": [],
    "token_vocab_outside": [],
    "segment_negative_inside": [SEGMENTS],
    "segment_falls_inside": [SEGMENTS],
    "segment_falls_at_block_edge": [SEGMENTS],
    "segment_falls_at_last_slot": [SEGMENTS],
    "segment_falls_just_outside": [],
    "segment_negative_outside": [],
    "exclusion_below_minus_one": [EXCLUDE],
    "causal_ignores_segments": [],
}


def broken_batch(case: str, device):
    """Two valid rows of width 50 (lengths 30 and 50, segments rising by one every 4 slots),
    one rule broken in row 1 (in row 0 for slots past the length)."""
    tokens = (torch.arange(100).reshape(2, 50) % VOCAB).to(device)
    lengths = torch.tensor([30, 50], device=device)
    segments = (torch.arange(50, device=device) // 4).int().repeat(2, 1)
    exclude = torch.tensor([[3, 9, -1], [7, -1, -1]], device=device)
    if case == "length_zero":
        lengths[1] = 0
    if case == "length_zero_over_bad_slot_0":
        lengths[1] = 0                           # slot 0 is kept (id 0) but not checked
        tokens[1, 0] = -1
        segments[1, 0] = -1
    if case == "length_negative":
        lengths[1] = -4
    if case == "length_past_width":
        lengths[1] = 51
    if case == "token_negative_inside":
        tokens[1, 17] = -1
    if case == "token_vocab_inside":
        tokens[1, 49] = VOCAB
    if case == "token_negative_outside":
        tokens[0, 30] = -8
    if case == "token_vocab_outside":
        tokens[0, 49] = VOCAB + 5
    if case == "segment_negative_inside":
        segments[1, 0] = -1
    if case == "segment_falls_inside":
        segments[1, 21] = 2
    if case == "segment_falls_at_block_edge":
        segments[1, 16] = 0                      # slot 16 starts the second block of 16
    if case == "segment_falls_at_last_slot":
        segments[0, 29] = 0
    if case == "segment_falls_just_outside":
        segments[0, 30] = 0
    if case == "segment_negative_outside":
        segments[0, 35:] = -3
    if case == "exclusion_below_minus_one":
        exclude[1, 2] = -2
    if case == "causal_ignores_segments":
        segments[:, :] = -7
    return tokens, lengths, segments, exclude


@pytest.mark.parametrize("block", [None, 16])
@pytest.mark.parametrize("case", sorted(BREAKS))
def test_each_rule_broken_alone(device, case, block):
    tokens, lengths, segments, exclude = broken_batch(case, device)
    flags = run_both(tokens, lengths, segments, exclude, causal=case.startswith("causal"),
                     block=block)[0]
    assert flags.shape == (FLAG_COUNT,)
    assert flags.tolist() == expected_flags(BREAKS[case], int(lengths.max()))


@pytest.mark.parametrize("length,kept", [(4, [5, 0, 0, 7, 0, 0]), (0, [5, 0, 0, 0, 0, 0]),
                                         (9, [5, 0, 0, 7, 9, 0])])
def test_sanitised_copy_by_hand(device, length, kept):
    """The sanitised copy spelled out on one small row: what the search runs on."""
    tokens = torch.tensor([[5, -2, VOCAB, 7, 9, -1]], dtype=torch.int32, device=device)
    segments = torch.tensor([[1, 0, 3, -5, 2, 6]], dtype=torch.int32, device=device)
    exclude = torch.tensor([[-1]], device=device)
    lengths = torch.tensor([length], device=device)
    _, out, total, segs, excl = run_both(tokens, lengths, segments, exclude, prefix=2,
                                         block=16)
    assert excl.tolist() == [[-1]]
    assert out.tolist() == [kept]
    assert total.tolist() == [min(max(length, 1), 6) + 2]
    assert segs.tolist() == [[1, 1, 3, 3, 3, 6]]


def test_longest_length_is_exact_when_every_length_is_negative(device):
    tokens, _, segments, exclude = valid_batch(torch.Generator().manual_seed(0), 3, 8, 2,
                                               device)
    flags = run_both(tokens, torch.tensor([-9, -4, -30], device=device), segments, exclude)[0]
    assert flags.tolist() == expected_flags([SHORT], -4)


@pytest.mark.parametrize("make", [noisy_batch, valid_batch])
@pytest.mark.parametrize("rows,width,excluded", [(3, 200, 70), (6, 129, 16), (2, 1000, 300)])
def test_rows_of_many_blocks_match_the_reference(device, gen, rows, width, excluded, make):
    """Small blocks force many loop steps per row: the carried running maximum of the segment
    ids and the left neighbour across block edges; noisy and valid batches alike."""
    tokens, lengths, segments, exclude = make(gen, rows, width, excluded, device)
    run_both(tokens, lengths, segments, exclude, causal=False, block=16, exclude_block=16)
    run_both(tokens, lengths, segments, exclude, causal=True, block=16, exclude_block=16)
    run_both(tokens, lengths, segments, exclude, block=64, exclude_block=32)


@pytest.mark.parametrize("trial", range(6))
def test_random_noisy_batches_match_the_reference(device, gen, trial):
    rows, width, excluded = (int(v) for v in torch.randint(1, 60, (3,), generator=gen))
    tokens, lengths, segments, exclude = noisy_batch(gen, rows, width, excluded, device)
    run_both(tokens, lengths, segments, exclude, prefix=int(rows))


def _extent(rows: int, width: int, excluded: int, device) -> torch.Tensor:
    return torch.tensor([pack_extent(rows, width, excluded)], device=device)


def test_extent_packs_three_fields_and_refuses_what_does_not_fit():
    packed = _extent(5, 1024, 3, "cpu")
    assert [int(v) for v in unpack_extent(packed)] == [5, 1024, 3]
    top = EXTENT_LIMIT - 1
    assert [int(v) for v in unpack_extent(_extent(top, top, top, "cpu"))] == [top] * 3
    with pytest.raises(ValueError, match="extent width must lie in"):
        pack_extent(1, EXTENT_LIMIT, 0)


@pytest.mark.parametrize("make", [valid_batch, noisy_batch])
@pytest.mark.parametrize("causal", [False, True])
def test_an_extent_of_the_whole_shape_equals_the_plain_call(device, gen, causal, make):
    tokens, lengths, segments, exclude = make(gen, 3, 40, 5, device)
    plain = run_both(tokens, lengths, segments, exclude, causal=causal)
    padded = run_both(tokens, lengths, segments, exclude, causal=causal,
                      extent=_extent(3, 40, 5, device))
    for name, p, q in zip(OUTPUTS, plain, padded):
        assert torch.equal(p, q), name


def _stale(gen, rows: int, width: int, excluded: int, device):
    """Buffers full of what an earlier call may leave: every rule broken at random."""
    return noisy_batch(gen, rows, width, excluded, device)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("make", [valid_batch, noisy_batch])
def test_padded_buffers_read_only_the_request_in_their_corner(device, gen, causal, make):
    """A request of [3, 37] with 5 exclusion columns in the corner of [8, 64] buffers holding
    stale, rule-breaking values (as a captured search's buffers do): the flags and the corner
    equal the plain call on the request alone; padding rows are one-token requests (id 0,
    segment 0, total 1 + prefix, no exclusion), slots past the width empty, exclusion columns
    past the count -1."""
    rows, width, excluded, prefix = 3, 37, 5, 4
    tokens, lengths, segments, exclude = make(gen, rows, width, excluded, device)
    buffers = _stale(gen, 8, 64, 16, device)
    buffers[0][:rows, :width] = tokens
    buffers[1][:rows] = lengths
    buffers[2][:rows, :width] = segments
    buffers[3][:rows, :excluded] = exclude
    flags, out, total, segs, excl = run_both(*buffers, prefix=prefix, causal=causal,
                                             extent=_extent(rows, width, excluded, device),
                                             block=16, exclude_block=16)
    want = run_both(tokens, lengths, segments, exclude, prefix=prefix, causal=causal)
    assert torch.equal(flags, want[0])
    assert torch.equal(out[:rows, :width], want[1]) and not out[:, width:].any()
    assert not out[rows:].any()
    assert torch.equal(total[:rows], want[2]) and total[rows:].tolist() == [prefix + 1] * 5
    assert torch.equal(segs[:rows, :width], want[3]) and not segs[:, width:].any()
    assert not segs[rows:].any()
    assert torch.equal(excl[:rows, :excluded], want[4])
    assert bool((excl[:, excluded:] == -1).all()) and bool((excl[rows:] == -1).all())


def test_padded_buffers_flag_a_length_past_the_request_width(device):
    """A length within the buffer's width but past the request's is still too long."""
    tokens = torch.zeros(2, 16, dtype=torch.int64, device=device)
    lengths = torch.tensor([9, 1], device=device)
    segments = torch.zeros(2, 16, dtype=torch.int32, device=device)
    exclude = torch.full((2, 1), -1, device=device)
    flags = run_both(tokens, lengths, segments, exclude, extent=_extent(1, 8, 0, device))[0]
    assert flags.tolist() == expected_flags([LONG], 9)
    flags = run_both(tokens, lengths, segments, exclude, extent=_extent(1, 9, 0, device))[0]
    assert flags.tolist() == expected_flags([], 9)


def _meta(*shape, dtype=torch.int64):
    return torch.empty(shape, dtype=dtype, device="meta")


def _good(device="cpu"):
    return dict(tokens=torch.zeros(2, 8, dtype=torch.int64, device=device),
                lengths=torch.ones(2, dtype=torch.int64, device=device),
                segments=torch.zeros(2, 8, dtype=torch.int32, device=device),
                exclude=torch.full((2, 3), -1, dtype=torch.int64, device=device),
                vocab_size=VOCAB, prefix=0, causal=False)


@pytest.mark.parametrize("change,match", [
    (dict(tokens=torch.zeros(2, 8)), "tokens must have an integer dtype"),
    (dict(tokens=torch.zeros(2, 8, dtype=torch.bool)), "tokens must have an integer dtype"),
    (dict(tokens=[[1, 2]]), "tokens must be a torch.Tensor"),
    (dict(tokens=torch.zeros(16, dtype=torch.int64)), r"tokens must have shape \[B, L\]"),
    (dict(tokens=torch.zeros(2, 0, dtype=torch.int64)), "tokens must hold at least one row"),
    (dict(tokens=torch.zeros(8, 2, dtype=torch.int64).t()), "tokens must be contiguous"),
    (dict(lengths=torch.ones(2, 1, dtype=torch.int64)), r"lengths must have shape \[B\]"),
    (dict(lengths=torch.ones(3, dtype=torch.int64)), r"lengths.shape\[0\] .* must be 2"),
    (dict(lengths=torch.ones(2)), "lengths must have an integer dtype"),
    (dict(segments=torch.zeros(2, 8, dtype=torch.int64)), "segments.dtype must be one of"),
    (dict(segments=torch.zeros(2, 7, dtype=torch.int32)), "segments must have tokens's shape"),
    (dict(segments=None), "segments .* are required unless causal"),
    (dict(causal=True), "segments must be None when causal"),
    (dict(causal=1), "causal must be a bool"),
    (dict(exclude=torch.full((2, 3), -1, dtype=torch.int32)), "exclude.dtype must be one of"),
    (dict(exclude=torch.full((3, 3), -1, dtype=torch.int64)), r"exclude.shape\[0\]"),
    (dict(exclude=torch.full((2,), -1, dtype=torch.int64)), r"exclude must have shape \[B, X\]"),
    (dict(vocab_size=0), "vocab_size must be an int"),
    (dict(vocab_size=50.0), "vocab_size must be an int"),
    (dict(prefix=-1), "prefix must be an int"),
    (dict(extent=torch.zeros(2, dtype=torch.int64)), r"extent.shape\[0\] .* must be 1"),
    (dict(extent=torch.zeros(1, dtype=torch.int32)), "extent.dtype must be one of"),
    (dict(extent=_meta(1)), "extent is on meta but tokens is on"),
    (dict(lengths=_meta(2)), "lengths is on meta but tokens is on"),
    (dict(segments=_meta(2, 8, dtype=torch.int32)), "segments is on meta but tokens is on"),
])
def test_launcher_rejects_bad_arguments(device, change, match):
    args = {**_good(device), **{k: v.to(device) if isinstance(v, torch.Tensor)
                                and v.device.type != "meta" else v for k, v in change.items()}}
    with pytest.raises(InvalidInputError, match=f"input_rules: {match}"):
        input_rules(**args)


@pytest.mark.parametrize("block", [8, 24, 16.0])
def test_launcher_rejects_bad_blocks(device, block):
    with pytest.raises(InvalidInputError, match="block must be a power of two >= 16"):
        input_rules(**_good(device), block=block)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """Without the interpreter, CPU tensors are refused (``torch_engine.reference`` serves them)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(InvalidInputError, match="needs CUDA tensors"):
        input_rules(**_good())


# The kernel compiled for sm_90 without a GPU (``tests.sm90_compile``).
_COMPILE = """
from torch_engine.kernels.input_rules import _input_rules_kernel, _warps
# (token and length pointers, causal, BLOCK, EXCLUDE_BLOCK): the dtypes the launcher passes,
# both loops at the largest block and at unequal blocks.
for tokens, lengths, causal, block, exclude_block in (
        ("*i32", "*i64", False, 1024, 1024), ("*i64", "*i32", False, 128, 16),
        ("*i32", "*i32", True, 16, 1024), ("*i64", "*i64", True, 1024, 1024)):
    signature = dict(tokens_ptr=tokens, lengths_ptr=lengths, segments_ptr="*i32",
                     exclude_ptr="*i64", flags_ptr="*i64", tokens_out_ptr="*i64",
                     total_ptr="*i64", segments_out_ptr="*i32", exclude_out_ptr="*i64",
                     extent_ptr="*i64", width="i32", excluded="i32", vocab_size="i32",
                     prefix="i32", CAUSAL="constexpr", EXTENT="constexpr",
                     EXTENT_BITS="constexpr", BLOCK="constexpr", EXCLUDE_BLOCK="constexpr")
    # The padded form (a captured search's) with the segmented layouts, the plain one with the
    # causal layouts.
    source = ASTSource(fn=_input_rules_kernel, signature=signature, constexprs=dict(
        CAUSAL=causal, EXTENT=not causal, EXTENT_BITS=21, BLOCK=block,
        EXCLUDE_BLOCK=exclude_block))
    kernel = triton.compile(source, target=TARGET,
                            options=dict(num_warps=_warps(block, exclude_block)))
    print("COMPILED", tokens, lengths, "causal" if causal else "segmented", block,
          exclude_block, usage(kernel))
# A one-token row and one exclusion column: Triton passes int arguments equal to 1 as
# constants, which the plain form must accept.
signature.update(width="constexpr", excluded="constexpr")
triton.compile(ASTSource(fn=_input_rules_kernel, signature=signature, constexprs=dict(
    width=1, excluded=1, CAUSAL=False, EXTENT=False, EXTENT_BITS=21, BLOCK=16,
    EXCLUDE_BLOCK=16)), target=TARGET, options=dict(num_warps=4))
print("COMPILED width 1, one exclusion column")
"""


@pytest.mark.heavy
def test_kernel_compiles_for_sm90():
    lines = compiled_lines(_COMPILE, 5)
    assert_no_spills(lines[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("make", [valid_batch, noisy_batch])
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("width,excluded", [(1024, 256), (4096, 4096)])
def test_cuda_kernel_matches_the_reference_at_serving_sizes(rows, width, excluded, make,
                                                            causal):
    gen = torch.Generator().manual_seed(rows * width + excluded)
    tokens, lengths, segments, exclude = make(gen, rows, width, excluded, "cuda")
    run_both(tokens.int(), lengths, segments, exclude, prefix=16, causal=causal)
    run_both(tokens, lengths.int(), segments, exclude, prefix=0, causal=causal)
    # As a captured search's padded buffers: a smaller request in the corner.
    run_both(tokens, lengths, segments, exclude, prefix=16, causal=causal,
             extent=_extent(max(rows // 2, 1), width - 5, excluded // 3, "cuda"))


@pytest.fixture(scope="module")
def engine():
    """A tiny engine (on the GPU where there is one) over a 200-item catalog."""
    rng = np.random.default_rng(3)
    ids = rng.choice(np.arange(10_000), size=200, replace=False)
    model = Model.from_preset("tiny", seed=0)
    if torch.cuda.is_available():
        model = model.cuda()
    return Engine(model, Catalog.from_arrays(ids, rng.integers(0, 8, (200, 3))),
                  EngineConfig(max_beam_width=64, max_exclude=64))


def request_cases(vocab: int):
    """Requests as a user passes them to ``recommend``: int32 and int64 ids, int16 lengths,
    causal or segmented, exclusion tables or lists, a soft prefix; each valid or breaking one
    rule (cycling through them) in a random row."""
    gen = torch.Generator().manual_seed(11)
    for trial in range(18):
        rows = 1 + trial % 4
        width = int(torch.randint(2, 40, (1,), generator=gen))
        tokens = torch.randint(0, vocab, (rows, width), generator=gen)
        lengths = torch.randint(2, width + 1, (rows,), generator=gen)
        segments = torch.cumsum((torch.rand(rows, width, generator=gen) < 0.3).int(), 1)
        exclude = torch.randint(-1, 100, (rows, 4), generator=gen)
        row = int(torch.randint(0, rows, (1,), generator=gen))
        slot = int(torch.randint(1, int(lengths[row]), (1,), generator=gen))
        rule, variant = trial % 6, trial // 6
        if rule == 1:
            lengths[row] = 0 if variant == 1 else -1
        if rule == 2:
            lengths[row] = width + 1
        if rule == 3:
            tokens[row, slot] = -1 if variant == 1 else vocab
        if rule == 4 and variant == 0:
            segments[row, slot] = -1
        if rule == 4 and variant > 0:
            segments[row, slot] -= 3          # the request of variant 1 is causal: ignored
        if rule == 5:
            exclude[row, 1] = -2
        tokens[:, -1] = torch.where(lengths < width, -5, tokens[:, -1])  # past the length
        yield (tokens.int() if trial % 3 == 0 else tokens,
               lengths.to(torch.int16) if trial % 7 == 0 else lengths,
               None if trial % 5 == 0 else segments,
               list(exclude) if trial % 8 == 0 else exclude,
               torch.zeros(rows, 2, 64) if trial % 3 == 1 else None)


TINY_VOCAB = preset("tiny").vocab_size
REQUESTS = list(request_cases(TINY_VOCAB))


def _prepared(engine, device, rules, tokens, lengths, segments, exclude, prefix):
    """The engine's checks on inputs placed on ``device`` with the value rules ``rules``:
    the sanitised batch, the flags and the message of the rule broken (None when valid)."""
    def put(t):
        return t if t is None else t.to(device)
    exclude = [put(row) for row in exclude] if isinstance(exclude, list) else put(exclude)
    args = check_arguments(engine.limits, put(tokens), put(lengths), put(segments), 8, 10,
                           put(prefix), exclude)
    cfg = engine.model.config
    batch, flags = search.sanitise(args.token_ids, args.lengths, args.segment_ids,
                                   args.prefix_embeds, args.exclude_items, cfg.vocab_size,
                                   rules)
    try:
        Verdict.of(args, flags, cfg.vocab_size, engine.catalog.levels,
                   cfg.max_position).raise_if_invalid()
        message = None
    except InvalidInputError as error:
        message = str(error)
    return batch, flags.cpu(), message


def _same_batch(got, want) -> None:
    for name in ("token_ids", "total_lengths", "segment_ids", "exclude_items"):
        g, w = getattr(got, name).cpu(), getattr(want, name)
        assert g.dtype == w.dtype, name
        assert torch.equal(g, w), f"{name}\n{g.tolist()}\n{w.tolist()}"
    assert got.causal == want.causal


def test_the_requests_hold_valid_and_invalid_ones(engine):
    assert engine.model.config.vocab_size == TINY_VOCAB  # what REQUESTS were drawn for
    messages = [_prepared(engine, "cpu", reference, *case)[2] for case in REQUESTS]
    assert 10 <= sum(m is not None for m in messages) < len(REQUESTS)


@pytest.mark.parametrize("case", range(len(REQUESTS)))
def test_the_checks_through_the_kernel_equal_the_torch_path(engine, device, case):
    """The engine's checks with the kernel in place of the torch ops: the same sanitised
    batch, flags and error message for every request."""
    assert rules_for(torch.device("cpu")) is reference
    want_batch, want_flags, want_message = _prepared(engine, "cpu", reference,
                                                     *REQUESTS[case])
    batch, flags, message = _prepared(engine, device, input_rules, *REQUESTS[case])
    _same_batch(batch, want_batch)
    assert torch.equal(flags, want_flags)
    assert message == want_message


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(REQUESTS)))
def test_cuda_checks_run_the_kernel_and_equal_the_cpu_path(engine, case):
    assert rules_for(torch.device("cuda")) is input_rules
    got = _prepared(engine, "cuda", rules_for(torch.device("cuda")), *REQUESTS[case])
    want = _prepared(engine, "cpu", reference, *REQUESTS[case])
    _same_batch(got[0], want[0])
    assert torch.equal(got[1], want[1]) and got[2] == want[2]
