"""Makes ``toy_models`` importable, so plans can name ``toy_models:<factory>`` as users name
their own model factories."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
