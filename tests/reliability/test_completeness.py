"""Every stateful part of a built algorithm is in its checkpoint, and a strict load is strict.

The parts are discovered by walking the algorithm's attributes, not listed by hand: a new
module, optimiser, generator, buffer or normaliser added to an algorithm is covered
automatically. A second algorithm built with another seed and trained differently must
equal the first in every part after loading the first's checkpoint.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from rlloop.checkpoint import CheckpointMismatchError, load_checkpoint, save_checkpoint
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.runs.session import Session
from rlloop.trainers.loop import Trainer

from ._algos import ALGOS, small_config

#: Attributes that hold no training state, with the reason. Classes also declare their
#: scratch storage (rewritten before it is read) in a ``transient_attrs`` class attribute.
STATELESS = {
    "_eval_envs",  # eval envs are reset with a fresh seed at every evaluation
    "settings",  # static settings from the config, which the manifest stores
    "config",
    "loss_cfg",
}


def _snapshot(obj, path, seen, out):
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        out[path] = {k: v.clone() for k, v in obj.state_dict().items()}
    elif isinstance(obj, torch.optim.Optimizer):
        out[path] = obj.state_dict()
    elif isinstance(obj, torch.Generator):
        out[path] = obj.get_state()
    elif isinstance(obj, torch.Tensor | np.ndarray):
        out[path] = obj.copy() if isinstance(obj, np.ndarray) else obj.clone()
    elif callable(getattr(obj, "get_state", None)) and not isinstance(obj, type):
        out[path] = obj.get_state()
    if isinstance(obj, dict):
        for k, v in obj.items():
            _snapshot(v, f"{path}[{k}]", seen, out)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _snapshot(v, f"{path}[{i}]", seen, out)
    elif type(obj).__module__.startswith("rlloop") and hasattr(obj, "__dict__"):
        transient = getattr(type(obj), "transient_attrs", frozenset())
        for k, v in vars(obj).items():
            if k not in STATELESS and k not in transient:
                _snapshot(v, f"{path}.{k}", seen, out)


def stateful_parts(algo):
    out: dict = {}
    _snapshot(algo, "algo", set(), out)
    return out


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN == NaN here


@pytest.mark.parametrize("algo", ALGOS)
def test_every_stateful_part_round_trips(tmp_path, algo):
    first = build_algorithm(small_config(algo, seed=1))
    initial = copy.deepcopy(first.learner.get_state(components=["module", "optimizer"]))
    trainer = Trainer(first)
    trainer.step()
    trainer.step()
    # Past warm-up: the checkpoint holds trained weights and optimiser moments, so the
    # round trip below cannot pass by comparing two sets of initial values.
    trained = first.learner.get_state(components=["module", "optimizer"])
    assert not _equal(trained["module"], initial["module"])
    assert not _equal(trained["optimizer"], initial["optimizer"])
    save_checkpoint(tmp_path / "ckpt", {"algorithm": first.get_state()})
    second = build_algorithm(small_config(algo, seed=2))
    Trainer(second).step()
    loaded = load_checkpoint(tmp_path / "ckpt", expected_components=["algorithm"])
    second.set_state(loaded.components["algorithm"])
    a, b = stateful_parts(first), stateful_parts(second)
    # The walk found the parts every algorithm has (so it did not silently stop early).
    for part in ("algo.generator", "algo.runner.obs", "algo.learner.modules"):
        assert part in a, sorted(a)
    assert any(".optimizer" in k for k in a), sorted(a)
    assert a.keys() == b.keys()
    missing = [k for k in a if not _equal(a[k], b[k])]
    assert not missing, f"not restored from the checkpoint: {missing}"
    first.close()
    second.close()


def test_strict_resume_reports_missing_and_unexpected(tmp_path):
    config = small_config("ppo")
    algo = build_algorithm(config)
    save_checkpoint(tmp_path / "run" / "checkpoints" / "000000064",
                    {"algorithm": algo.get_state(), "surprise": {"x": 1}})
    algo.close()
    session_dir = tmp_path / "run"
    with pytest.raises(CheckpointMismatchError) as err:
        Session(config, session_dir, resume=True)
    message = str(err.value)
    assert "rng" in message and "trainer" in message and "surprise" in message
    assert set(COMPONENTS) == {"algorithm", "trainer", "rng"}
