"""What an error body may say: the rule a request broke, never the server's insides.

TensorFlow's messages carry graph node names (``[[{{node engine}}]]``, ``Detected at node
...``, ``(GatherV2:0)``), traced function names (``[Op:__inference_signature_wrapper_12]``)
and absolute file paths (a package's ``/models/recs/2/assets/engine.pt2``). ``public_text``
keeps the part a caller can act on (``assertion failed: [history_items must be >= 0]``) and
drops the rest; the server log keeps the full text under the request's id.
"""

from __future__ import annotations

import re

_TF_NOISE = (
    re.compile(r"Graph execution error:\s*"),
    # "Detected at node X defined at (most recent call last):" and the stack lines under it.
    re.compile(r"Detected at node .*? defined at \(most recent call last\):\n"
               r"(?:<stack traces unavailable>\n|  File [^\n]*\n(?:    [^\n]*\n)?)*"),
    re.compile(r"Detected at node [^\n]*\n?"),
    re.compile(r"[ \t]*\[\[\{\{node [^}]*\}\}\]\]"),
    re.compile(r"[ \t]*\[\[node [^\]]*\]\]"),
    re.compile(r"\s*\[Op:[^\]]*\]"),
    re.compile(r"\s*\((?:[\w./-]+):\d+\)"),          # tensor names: "x (GatherV2:0) = "
    re.compile(r"\s*Node: '[^']*'"),
    re.compile(r"__inference_\w+"),
    re.compile(r"Function call stack:.*", re.S),
)
# An absolute path of two or more components, not one of the REST API's own routes (a
# caller's URL is echoed back to it). It becomes its last component: "engine.pt2".
_ABSOLUTE_PATH = re.compile(
    r"(?<![\w.:/])/(?!v1/|monitoring/|healthz)(?:[^\s'\"`:,;()\[\]{}<>/]+/)+"
    r"([^\s'\"`:,;()\[\]{}<>/]*)")
_BLANK_LINES = re.compile(r"\n\s*\n+")
MAX_CHARS = 2000   # a message longer than this is cut: the log has all of it


def public_text(text: str) -> str:
    """``text`` without graph internals or absolute paths, at most ``MAX_CHARS`` long."""
    for pattern in _TF_NOISE:
        text = pattern.sub("", text)
    text = _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "<path>", text)
    text = _BLANK_LINES.sub("\n", text).strip()
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + " ..."


def full_detail(error: BaseException) -> str:
    """An error and the chain of errors that caused it, for the log."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return " <- ".join(parts)
