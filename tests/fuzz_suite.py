"""The fuzz suite's child process: ``python tests/fuzz_suite.py CHECK...`` runs, in order,
the server's decoder surfaces (``grpc``, ``rest``: ``tests/serving/fuzz_decoders.py``),
TorchCall with a real exported engine package (``torch_call:PACKAGE:SIGNATURE_FILE``:
``tests/torch_call/fuzz_torch_call.py``) and the DLPack bridge's checks (``dlpack``,
``resize:CASE:SIZE``, ``raw:CASE:SIZE``: ``tests/bridge/fuzz_dlpack.py``), printing one report
line each.

One process for all of them, because each TensorFlow start costs seconds of ``make test``;
an abort in one check kills the ones after it, and faulthandler prints where it happened.
"""

import faulthandler
import sys
import traceback
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from xgr_common.import_order import preload_triton  # noqa: E402

preload_triton()   # torch (and so triton) before TensorFlow: see xgr_common/import_order.py

from tests.bridge import fuzz_dlpack  # noqa: E402
from tests.serving import fuzz_decoders  # noqa: E402
from tests.torch_call import fuzz_torch_call  # noqa: E402

if __name__ == "__main__":
    faulthandler.enable()
    sys.setrecursionlimit(3000)
    failed = False
    for check in sys.argv[1:]:
        try:   # a failed check (not an abort) leaves the ones after it to run
            if check in fuzz_decoders.SURFACES:
                fuzz_decoders.SURFACES[check]()
            elif check.startswith("torch_call:"):
                fuzz_torch_call.run(*check.split(":", 2)[1:])
            else:
                fuzz_dlpack.run("fuzz" if check == "dlpack" else check)
        except Exception:
            traceback.print_exc()
            failed = True
    sys.exit(1 if failed else 0)
