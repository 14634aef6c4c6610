"""Round trips: every supported value type, optimiser state, RNG state, strict loading."""

from __future__ import annotations

import copy
import json
import math
import random
from collections import OrderedDict, namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rlloop.checkpoint import (
    FORMAT_VERSION,
    CheckpointMismatchError,
    capture_rng_state,
    is_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from rlloop.errors import SavedStateError


def assert_identical(a: Any, b: Any, where: str = "root") -> None:
    """Same types all the way down, same dtypes and shapes, bit-identical payloads."""
    if isinstance(a, OrderedDict):  # documented: Mapping subclasses come back as dict
        assert type(b) is dict, where
    else:
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert b.is_contiguous()
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert np.ascontiguousarray(a).tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert type(key) is type(next(k for k in b if k == key)), f"{where} key {key!r}"
            assert_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        same_sign = math.copysign(1, a) == math.copysign(1, b)
        assert (math.isnan(a) and math.isnan(b)) or (a == b and same_sign), where
    else:
        assert a == b, where


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def roundtrip(tmp_path: Path, components: dict[str, Any], **kw: Any) -> Any:
    path = save_checkpoint(tmp_path / "ckpt", components, **kw)
    assert is_checkpoint(path)
    return load_checkpoint(path)


def test_scalars_and_containers(tmp_path: Path) -> None:
    value = {
        "ints": [0, -1, 2**53 - 1, 2**53, -(2**63), 2**64 + 7, 10**40, -(10**40)],
        "floats": [0.1, -0.0, 1e-310, 1.7976931348623157e308, math.nan, math.inf, -math.inf],
        "other": ["", "ünïcødé \u0000 \"quoted\"", True, False, None],
        "tuple": (1, (2.5, "x"), [None], ()),
        "int_keys": {0: "a", 7: "b", -3: "c"},
        "mixed_keys": {2: 1, "2": 2, 1.5: 3, None: 4, True: 5, (1, "t"): 6},
        "tag_collision": {"__rlloop__": "tensor", "key": "nope"},
        "empty": {"list": [], "dict": {}, "tuple": ()},
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "np_scalars": [np.float32(1.5), np.float64(-0.0), np.int64(-7), np.uint64(2**64 - 1),
                       np.bool_(True), np.float16(np.nan), np.int8(-128)],
    }
    loaded = roundtrip(tmp_path, {"trainer": value}, metadata={"config": {"lr": 3e-4}})
    assert_identical(value, loaded.components["trainer"])
    assert loaded.metadata == {"config": {"lr": 3e-4}}
    assert loaded.format_version == FORMAT_VERSION
    # JSON-only components need no data file.
    assert sorted(p.name for p in loaded.path.iterdir()) == ["manifest.json"]


def test_tensors_and_arrays(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    value: dict[str, Any] = {
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 3),
        "bool": torch.tensor([True, False, True]),
        "uint8": torch.arange(256, dtype=torch.uint8),
        "int64": torch.tensor([-(2**63), 2**63 - 1]),
        "float64": torch.tensor([math.pi, math.nan, -math.inf], dtype=torch.float64),
        "bfloat16": torch.randn(5, 3).to(torch.bfloat16),
        "float16": torch.randn(2, 2).half(),
        "transposed": base.t(),
        "strided": base[:, ::2],
        "param": nn.Parameter(torch.ones(2)),
        "np": [np.arange(6, dtype=np.int32).reshape(2, 3), np.zeros((0,), np.float64),
               np.array(2.5, dtype=np.float32), np.array([True, False]),
               np.arange(5, dtype=np.uint16), np.arange(4, dtype=">f8"),
               np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(10)[::3]],
    }
    loaded = roundtrip(tmp_path, {"replay_buffer": value}).components["replay_buffer"]
    value["param"] = value["param"].detach()  # documented: Parameter comes back as Tensor
    value["np"][5] = value["np"][5].astype("=f8")  # documented: native byte order
    assert_identical(value, loaded)
    assert not loaded["param"].requires_grad


def test_shared_storage_saved_as_independent_copies(tmp_path: Path) -> None:
    x = torch.arange(10.0)
    arr = np.arange(4)
    loaded = roundtrip(tmp_path, {"c": {"a": x, "view": x[2:5], "again": x, "arr": [arr, arr]}})
    c = loaded.components["c"]
    c["a"].add_(100)
    c["arr"][0] += 1
    assert torch.equal(c["view"], torch.tensor([2.0, 3.0, 4.0]))
    assert torch.equal(c["again"], x)
    assert np.array_equal(c["arr"][1], arr)


def test_module_state_dict_is_plain_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    path = save_checkpoint(tmp_path / "ckpt", {"module": net.state_dict()})
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    other.load_state_dict(load_file(path / "module.safetensors"))  # any safetensors reader
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), other.parameters(),
                                                  strict=True))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["components"]["module"]["file"]["name"] == "module.safetensors"


def test_unsupported_values_raise_before_writing(tmp_path: Path) -> None:
    point = namedtuple("point", "x y")
    for bad in [object(), {1, 2}, point(1, 2), np.array(["a"]), lambda: 0]:
        with pytest.raises(TypeError, match=r"c\.bad"):
            save_checkpoint(tmp_path / "ckpt", {"c": {"bad": bad}})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(TypeError, match="contains itself"):
        save_checkpoint(tmp_path / "ckpt", {"c": cyclic})
    with pytest.raises(TypeError, match="metadata"):
        save_checkpoint(tmp_path / "ckpt", {}, metadata={"t": torch.zeros(1)})
    with pytest.raises(ValueError, match="component name"):
        save_checkpoint(tmp_path / "ckpt", {"../evil": 1})
    assert list(tmp_path.iterdir()) == []


def test_existing_path_is_not_overwritten(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "ckpt", {"c": 1})
    with pytest.raises(FileExistsError, match="save_replacing"):
        save_checkpoint(path, {"c": 2})
    assert load_checkpoint(path).components == {"c": 1}


def _train(model: nn.Module, opt: torch.optim.Optimizer, sched: Any, steps: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _make(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.8, 0.99), weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def test_adam_resume_is_bit_identical(tmp_path: Path) -> None:
    model, opt, sched = _make(0)
    _train(model, opt, sched, 3)
    state = {"module": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict()}
    path = save_checkpoint(tmp_path / "ckpt", state)
    state = copy.deepcopy(state)  # state_dict() aliases the live optimizer tensors
    _train(model, opt, sched, 1)  # the uninterrupted run

    loaded = load_checkpoint(path).components
    assert_identical(state["optimizer"], loaded["optimizer"])
    assert all(type(k) is int for k in loaded["optimizer"]["state"])
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.99)  # tuples stay tuples
    assert_identical(state["scheduler"], loaded["scheduler"])

    resumed, ropt, rsched = _make(123)  # different init: everything must come from the file
    resumed.load_state_dict(loaded["module"])
    ropt.load_state_dict(loaded["optimizer"])
    rsched.load_state_dict(loaded["scheduler"])
    _train(resumed, ropt, rsched, 1)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert_identical(opt.state_dict(), ropt.state_dict())


def _draws() -> tuple[list[float], list[float], list[float]]:
    return (torch.rand(5).tolist(), np.random.standard_normal(5).tolist(),
            [random.random() for _ in range(3)] + [random.gauss(0, 1)])


def test_rng_state_roundtrip(tmp_path: Path) -> None:
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.standard_normal()  # and in numpy's
    path = save_checkpoint(tmp_path / "ckpt", {"rng": capture_rng_state()})
    expected = _draws()
    _draws()
    restore_rng_state(load_checkpoint(path).components["rng"])
    assert _draws() == expected
    rng = load_checkpoint(path).components["rng"]
    assert rng["torch"].dtype == torch.uint8
    assert isinstance(rng["numpy"]["state"]["key"], np.ndarray)
    assert isinstance(rng["python"]["state"], list)


def test_restore_rng_state_rejects_incomplete_state() -> None:
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match="python"):
        restore_rng_state({"torch": torch.get_rng_state(), "numpy": {}})
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("part, edit", [
    ("python", lambda s: s["python"].update(state=s["python"]["state"][:-1])),
    ("python", lambda s: s["python"].update(version=2)),
    ("numpy", lambda s: s["numpy"].update(bit_generator="PCG64")),
    ("numpy", lambda s: s["numpy"]["state"].update(key=s["numpy"]["state"]["key"][:-1])),
    ("torch", lambda s: s.update(torch=s["torch"][:10])),
])
def test_restore_rng_state_checks_every_part_before_setting_any(part, edit) -> None:
    """A state of another form than the library's is refused before any generator is set
    (Python's random refused a short state only after torch's and NumPy's were set)."""
    state = capture_rng_state()
    edit(state)
    torch.rand(3)  # the generators move on: a restore would move them back
    np.random.random(3)
    random.random()
    before = (torch.get_rng_state(), np.random.get_state(legacy=False)["state"]["pos"],
              random.getstate())
    with pytest.raises(SavedStateError, match=f"rng.{part}"):
        restore_rng_state(state)
    assert torch.equal(before[0], torch.get_rng_state())
    assert before[1:] == (np.random.get_state(legacy=False)["state"]["pos"], random.getstate())


def test_strict_load_lists_missing_and_unexpected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "ckpt", {"module": {"w": torch.ones(1)}, "extra": 1})
    with pytest.raises(CheckpointMismatchError) as info:
        load_checkpoint(path, expected_components=["module", "optimizer"])
    message = str(info.value)
    assert "missing ['optimizer']" in message and "unexpected ['extra']" in message
    assert "manifest.json" in message
    loaded = load_checkpoint(path, expected_components={"module", "extra"})
    assert set(loaded.components) == {"module", "extra"}
