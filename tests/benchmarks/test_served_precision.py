"""The float32 search that settles served answers breaking the ranked-list rule: the
in-process 16-bit engine's own list passes ``PRECISION_RULE`` against the float32 search of
the same weights and request, a list whose scores are off by more than a widened tie does
not, and each side is counted apart."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import served_precision
from benchmarks.served_precision import in_process_references, precision_verdict, settle
from benchmarks.session_load import Answer, ExportSettings, SessionWorld
from xgr_common.errors import CapacityError
from benchmarks.team_files import write_team_files

USERS = [0, 2]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    world = SessionWorld(preset="tiny", items=400, paths=120, long_items=6, recent_items=3,
                         population=3, zipf=1.0)
    rng = np.random.default_rng(0)
    ids, codes = world.catalog(rng)
    files = write_team_files(tmp_path_factory.mktemp("team"), "tiny", world.prompt_spec(),
                             ids, codes)
    requests = world.user_requests(ids, rng)
    return in_process_references(files, ExportSettings("cpu", 16, 12, 1, 0, "bfloat16"),
                                 requests, USERS)


def _answer(outputs: dict, shift: float = 0.0) -> Answer:
    return Answer(outputs["item_ids"][0].copy(), outputs["scores"][0] + np.float32(shift))


def test_each_user_gets_the_engines_list_and_the_float32_list(references):
    assert sorted(references) == USERS
    for reference in references.values():
        for outputs in (reference.engine, reference.precise):
            assert outputs["item_ids"].shape == outputs["scores"].shape == (1, 12)
            assert (outputs["item_ids"] >= 0).all()
            assert np.all(np.diff(outputs["scores"][0]) <= 0)      # ranked
        assert reference.precise["scores"].dtype == np.float32


def test_the_engines_own_lists_pass_and_a_shifted_list_breaks(references):
    own = {user: _answer(references[user].engine) for user in USERS}
    verdict = precision_verdict([(user, own[user]) for user in USERS], own, references,
                                "bfloat16")
    assert verdict["users"] == verdict["answers"] == verdict["others_checked"] == 2
    assert verdict["answers_broken"] == verdict["others_broken"] == 0
    assert 0.0 <= verdict["engine_drift"] < 0.5
    # Every score a whole unit off: past any tie, even widened by the engine's error.
    shifted = [(USERS[0], _answer(references[USERS[0]].engine, shift=1.0)),
               (USERS[0], own[USERS[0]])]
    verdict = precision_verdict(shifted, own, references, "bfloat16")
    assert (verdict["users"], verdict["answers"]) == (1, 2)
    assert verdict["answers_broken"] == 1 and verdict["others_broken"] == 0
    # The other side is judged by the same rule: a shifted plain answer breaks there.
    verdict = precision_verdict([(USERS[1], own[USERS[1]])],
                                {USERS[1]: _answer(references[USERS[1]].engine, shift=-1.0)},
                                references, "bfloat16")
    assert verdict["answers_broken"] == 0 and verdict["others_broken"] == 1


def test_settling_runs_only_where_needed_and_a_failure_is_recorded(monkeypatch):
    """Nothing to settle at 32 bits, without a broken answer or when turned off; a settling
    that fails is recorded by its cause instead of raised, so the sweep's result is kept."""
    def no_memory(*args, **kwargs):
        raise CapacityError("no memory for a float32 copy of the model: 80 GiB in use")

    monkeypatch.setattr(served_precision, "in_process_references", no_memory)
    answer = Answer(np.array([7, 8]), np.array([-1.0, -2.0], np.float32))
    settings = ExportSettings("cpu", 16, 12, 1, 0)
    assert settle({}, settings, "float32", [], [(0, answer)], {0: answer}) is None
    assert settle({}, settings, "bfloat16", [], [], {0: answer}) is None
    assert settle({}, settings, "bfloat16", [], [(0, answer)], {0: answer}, False) is None
    got = settle({}, settings, "bfloat16", [], [(0, answer)], {0: answer})
    assert got == {"not_settled": "no memory: no memory for a float32 copy of the model: "
                                  "80 GiB in use"}
