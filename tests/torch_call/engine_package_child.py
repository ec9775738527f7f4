"""The engine package without TensorFlow, in child processes (torch only):

    python engine_package_child.py export OUT DEVICE ATTENTION   # package + inputs + eager answer
    python engine_package_child.py run OUT                        # the package, freshly loaded

``export`` builds the tiny engine over a small synthetic world on DEVICE, exports
``Engine.recommend`` with ``xgr_export.engine_package.export_engine`` (AOTInductor), writes
full-length prompts built from the world's histories (the feature graph's layout) and the eager
``Engine.recommend`` answer on them. ``run`` loads the package in a process that never compiled
anything and runs it on the same inputs. ``test_gpu_engine_package.py`` compares the two.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ITEMS, USERS, EVENTS, KEEP, BEAMS, TOP_K, SEED = 2000, 8, 60, 40, 32, 24, 0


def prompts(world, spec, users: np.ndarray) -> tuple[torch.Tensor, ...]:
    """token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L], profile_embeds
    float32 [B, S, hidden] (zeros), exclude_items int64 [B, KEEP]: each user's last KEEP
    history items in the prompt layout of ``xgr_common.prompt_spec``."""
    layout = spec.layout
    row_of = {int(item): row for row, item in enumerate(world.item_ids)}
    tokens, segments, exclude = [], [], []
    for user in users:
        start, end = world.history_splits[user], world.history_splits[user + 1]
        items = world.history_items[start:end][-KEEP:]
        row, seg = [layout.bos_id, layout.profile_start_id, spec.context_token(0)], [0, 0, 0]
        for k, item in enumerate(items):
            codes = world.item_codes[row_of[int(item)]]
            row += [layout.item_start_id] + [layout.code_token(level, int(code))
                                             for level, code in enumerate(codes)]
            seg += [k + 1] * (1 + len(codes))
        row.append(layout.item_start_id)
        seg.append(len(items) + 1)
        tokens.append(row)
        segments.append(seg)
        exclude.append(items)
    return (torch.tensor(tokens, dtype=torch.int32),
            torch.full((len(users),), len(tokens[0]), dtype=torch.int32),
            torch.tensor(segments, dtype=torch.int32),
            torch.zeros(len(users), spec.profile_tokens, spec.model_hidden),
            torch.tensor(np.asarray(exclude), dtype=torch.int64))


def export(out: Path, device: str, attention: str) -> None:
    from xgr_export.engine_package import EngineExportConfig, export_engine  # before TF
    from torch_engine.catalog import Catalog
    from torch_engine.config import EngineConfig
    from torch_engine.engine import Engine
    from torch_engine.model import Model
    from xgr_common.prompt_spec import PromptSpec
    from xgr_world.synthetic import WorldConfig, make_world

    out.mkdir(parents=True, exist_ok=True)
    world = make_world(WorldConfig(num_items=ITEMS, num_users=USERS, history_events=EVENTS,
                                   seed=SEED))
    model = Model.from_preset("tiny", seed=SEED, device=device)
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes),
                    EngineConfig(attention_backend=attention, selection_backend="torch"))
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=KEEP,
                      window_seconds=3650 * 86400)
    started = time.perf_counter()
    package = export_engine(engine, spec, out / "engine.pt2",
                            EngineExportConfig(BEAMS, TOP_K, max_batch=64, device=device))
    seconds = time.perf_counter() - started
    inputs = prompts(world, spec, np.arange(USERS))
    with torch.no_grad():
        items, scores = engine.recommend(
            *(t.to(device) for t in inputs[:3]), beam_width=BEAMS, top_k=TOP_K,
            prefix_embeds=inputs[3].to(device), exclude_items=inputs[4].to(device))
    torch.save({"inputs": inputs, "items": items.cpu(), "scores": scores.float().cpu()},
               out / "eager.pt")
    (out / "export.json").write_text(json.dumps(
        {"package": package.to_json(), "seconds": seconds, "device": device,
         "attention": attention, "torch": torch.__version__}))


def run(out: Path) -> None:
    data = torch.load(out / "eager.pt")
    device = json.loads((out / "export.json").read_text())["device"]
    from torch_engine.aoti_loading import load_package  # torch only: no kernels, no TF
    runner = load_package(out / "engine.pt2")
    inputs = [t.to(device) for t in data["inputs"]]  # compiled code trusts its inputs' device
    items, scores = runner(*inputs)
    started = time.perf_counter()
    for _ in range(5):
        runner(*inputs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / 5
    torch.save({"items": items.cpu(), "scores": scores.cpu(), "seconds": seconds,
                "modules": sorted(sys.modules)}, out / "package.pt")


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        run(Path(sys.argv[2]))
