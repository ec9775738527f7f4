"""``xgr SUBCOMMAND [--flags]``: dispatches to one entry-point module per subcommand.

Each subcommand module defines its own absl flags at import and a ``main(argv)``; only the
chosen module is imported, so flags of different subcommands never collide and ``xgr demo``
does not pay for importing the server.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help). Modules are imported only when chosen.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("xgr_cli.demo", "TF feature graph -> bridge -> engine on the embedded default"),
    "export": ("xgr_cli.export", "export the pipeline as one TF SavedModel with the Torch call"),
    "serve": ("xgr_cli.serve", "serve a SavedModel over TF Serving's REST and gRPC APIs"),
    "migrate": ("xgr_cli.migrate", "show or change a migration plan (init, status, swap, "
                "auto, revert, assemble, export)"),
    "parity": ("xgr_cli.parity", "run TF and the migrated plan side by side; report parity"),
    "batch": ("xgr_cli.batch", "recommend for every user of a Parquet file through a "
              "SavedModel on a Ray cluster, resumable"),
    "catalog": ("xgr_cli.catalog", "check a catalog file (Parquet, .npz) and print its "
                "summary; `catalog build`: make one from item embeddings"),
    "evaluate": ("xgr_cli.evaluate", "recall@K, NDCG@K on a log beside popularity, co-occurrence"),
    "extend_vocab": ("xgr_cli.extend_vocab", "add the token layout after a Qwen2/Qwen3 "
                     "checkpoint's text vocabulary; write xgr_model.json"),
    "stand_in": ("xgr_cli.stand_in", "write a random-weight Qwen2/Qwen3 checkpoint and "
                 "tokenizer to try the others on"),
    "train": ("xgr_cli.train", "fine-tune a checkpoint and its profile tower on a behaviour "
              "log (Parquet) for xgr export"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items())
    return f"usage: xgr SUBCOMMAND [--flags]\n\nsubcommands:\n{rows}\n\n" \
           "`xgr SUBCOMMAND --help` lists a subcommand's flags."


def run(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if len(argv) >= 2 else 2)
    name = argv[1]
    if name not in SUBCOMMANDS:
        print(f"xgr: unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    from absl import app, flags

    if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in argv[2:]):
        # absl's --help describes the main module, which is this dispatcher, not the
        # subcommand: print the subcommand's own flags instead.
        print(f"usage: xgr {name} [--flags]\n\n{SUBCOMMANDS[name][1]}\n\n"
              f"{flags.FLAGS.module_help(module)}\n\n"
              f"`xgr {name} --helpfull` adds the flags of the libraries it uses.")
        sys.exit(0)
    app.run(_reporting(name, module.main), argv=[f"xgr {name}", *argv[2:]])


def _reporting(name: str, main):
    """``main`` with our errors (bad files, flags, inputs) printed as one message and exit
    code 1 instead of a traceback; anything else is a fault and keeps its traceback."""
    from xgr_common.errors import XgrError

    def run_main(argv):
        try:
            return main(argv)
        except XgrError as error:
            print(f"xgr {name}: {type(error).__name__}: {error}", file=sys.stderr)
            return 1

    return run_main


if __name__ == "__main__":
    run()
