"""The one tolerance table: how close two implementations must agree, keyed by dtype.

Used by kernel tests (kernel vs float64 reference), the parity harness (TF vs Torch) and the
HF parity tests. Integer and boolean dtypes (ids, tokens, masks) must match exactly.

The metric for floating point is the relative Frobenius error ``||out - ref|| / ||ref||``
(robust to individual tiny reference values), plus an elementwise check with ``atol``/``rtol``
for small outputs where a norm hides a single wrong element.

Ranked lists (the engine's items and scores) of a 16-bit search follow ``RANKED_LIST_RULE``:
16-bit rounding can reorder items whose scores are within the dtype's tolerance of each other,
and such a tie at the cut-off can swap which of them is returned, so items are compared
exactly everywhere except inside such ties. A tie between two beams' partial scores at an
earlier code can also keep a prefix the reference's beam dropped, so an item the reference
never scored may be returned; a search with a wider beam, which keeps both prefixes, then
shows the item and its score are real. ``scores_tied`` is the one test of a tie.

Two 16-bit programs (an exported package and the in-process engine it came from) each round
apart from the exact answer, so correct programs can differ by the sum of their errors, past
one tie. Where they break ``RANKED_LIST_RULE`` against each other, ``PRECISION_RULE`` lets the
exact answer decide: a float32 search of the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """How close two arrays of one dtype must be. ``exact`` means bitwise-equal values."""

    rel_norm: float
    atol: float
    rtol: float
    exact: bool = False


EXACT = Tolerance(rel_norm=0.0, atol=0.0, rtol=0.0, exact=True)

# dtype name (numpy/torch/TF spelling without prefix) -> tolerance.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rel_norm=1e-12, atol=1e-12, rtol=1e-10),
    "float32": Tolerance(rel_norm=1e-5, atol=1e-5, rtol=1e-4),
    "float16": Tolerance(rel_norm=2e-3, atol=2e-3, rtol=2e-3),
    "bfloat16": Tolerance(rel_norm=1e-2, atol=1e-2, rtol=1e-2),
    "complex64": Tolerance(rel_norm=1e-5, atol=1e-5, rtol=1e-4),
    **{name: EXACT for name in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                "uint32", "uint64", "bool", "string")},
}


def dtype_name(dtype: object) -> str:
    """Normalise a numpy, torch or TF dtype, a NumPy scalar type (``np.float32``) or a dtype
    string to this table's key."""
    if isinstance(dtype, type):  # a scalar type class: its ``name`` is a descriptor, not a str
        dtype = getattr(dtype, "__name__", str(dtype))
    name = getattr(dtype, "name", None)
    name = name if isinstance(name, str) else str(dtype)
    name = name.replace("torch.", "").replace("tf.", "")
    aliases = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
               "int": "int32", "bool_": "bool", "object": "string", "bytes": "string"}
    return aliases.get(name, name)


def tolerance_for(dtype: object) -> Tolerance:
    """The tolerance for ``dtype``; raises KeyError naming the dtype if the table lacks it."""
    key = dtype_name(dtype)
    if key not in TOLERANCES:
        raise KeyError(f"no tolerance for dtype {key!r}; known: {sorted(TOLERANCES)}")
    return TOLERANCES[key]


# The dtypes whose ranked lists are compared by RANKED_LIST_RULE (float32 and float64: exact).
TIE_DTYPES = ("bfloat16", "float16")
RANKED_LIST_RULE = (
    "each item returned carries its reference score within the dtype's atol + rtol x "
    "|reference| (the reference list's score; for an item the reference's beam dropped at an "
    "earlier code, a reference search with a wider beam must return it at a tied score; an "
    "item the reference cut with top_k must score no higher than the reference list's last "
    "score, within the tie); the list is in score order within the tie; a reference item left "
    "out must be tied with the list's last score or trade places with a returned item the "
    "reference lacks at a tied score; -1 padding must match exactly")


PRECISION_RULE = (
    "against a float32 search of the same weights and requests, the program's lists follow "
    "RANKED_LIST_RULE with each tie widened by the in-process engine's own largest score "
    "error against that search: the program is no further from the exact answer than the "
    "engine it was exported from, plus one tie")


def scores_tied(a: float, b: float, dtype: object, slack: float = 0.0) -> bool:
    """Whether scores ``a`` and ``b`` are within ``dtype``'s tolerance of each other (atol +
    rtol x the larger magnitude, plus ``slack``): the tie test of ``RANKED_LIST_RULE``
    (``slack`` 0) and of ``PRECISION_RULE`` (the engine's own error)."""
    tol = tolerance_for(dtype)
    return abs(a - b) <= tol.atol + tol.rtol * max(abs(a), abs(b)) + slack
