"""Loading never runs code: planted pickle payloads are rejected or ignored, never executed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlloop.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from rlloop.checkpoint.format import _manifest_checksum


class Evil:
    """Unpickling this creates ``sentinel``: proof that code ran."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.sentinel),))


def payloads(sentinel: Path) -> dict[str, bytes]:
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(2), "evil": Evil(sentinel)}, buffer)  # a torch .pt zip
    return {"pickle": pickle.dumps(Evil(sentinel)), "torch_save": buffer.getvalue()}


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Belt and braces: any unpickling entry point used during the test fails it."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("checkpoint loading must never unpickle")

    for module, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"),
                         (torch, "load"), (np, "load")]:
        monkeypatch.setattr(module, name, forbidden)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", {
        "module": {"w": torch.ones(3)},
        "trainer": {"step": 3, "name": "x"},
    }, metadata={"note": "hi"})


def reseal(path: Path, edit: Any) -> None:
    """Edit the manifest and recompute its checksum, as a careful attacker would."""
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    edit(manifest)
    manifest["manifest_sha256"] = _manifest_checksum(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_payload_is_live(tmp_path: Path) -> None:
    """The payloads do execute when unpickled, so the tests below mean something."""
    sentinel = tmp_path / "ran"
    pickle.loads(payloads(sentinel)["pickle"])
    assert sentinel.exists()
    sentinel.rmdir()
    torch.load(io.BytesIO(payloads(sentinel)["torch_save"]), weights_only=False)
    assert sentinel.exists()


@pytest.mark.usefixtures("no_unpickling")
def test_pickle_files_in_dir_are_ignored(ckpt: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    for name, data in [("model.pt", "torch_save"), ("trainer.pkl", "pickle"),
                       ("optimizer.pt", "torch_save"), ("rng.pickle", "pickle")]:
        (ckpt / name).write_bytes(payloads(sentinel)[data])
    loaded = load_checkpoint(ckpt)
    assert set(loaded.components) == {"module", "trainer"}
    assert not sentinel.exists()


@pytest.mark.usefixtures("no_unpickling")
@pytest.mark.parametrize("kind", ["pickle", "torch_save"])
def test_pickle_as_member_with_matching_hash(ckpt: Path, tmp_path: Path, kind: str) -> None:
    sentinel = tmp_path / "sentinel"
    data = payloads(sentinel)[kind]
    (ckpt / "module.safetensors").write_bytes(data)

    def forge(manifest: dict[str, Any]) -> None:
        manifest["components"]["module"]["file"].update(
            bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    reseal(ckpt, forge)
    with pytest.raises(CheckpointCorruptError, match=r"module\.safetensors"):
        load_checkpoint(ckpt)
    assert not sentinel.exists()


@pytest.mark.usefixtures("no_unpickling")
def test_manifest_cannot_point_at_other_files(ckpt: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    data = payloads(sentinel)["torch_save"]
    (ckpt / "model.pt").write_bytes(data)

    def redirect(manifest: dict[str, Any]) -> None:
        manifest["components"]["module"]["file"].update(
            name="model.pt", bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    reseal(ckpt, redirect)
    with pytest.raises(CheckpointCorruptError, match=r"manifest\.json"):
        load_checkpoint(ckpt)
    assert not sentinel.exists()


@pytest.mark.usefixtures("no_unpickling")
def test_pickle_inside_manifest_strings_stays_a_string(ckpt: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    text = payloads(sentinel)["pickle"].decode("latin-1")

    def plant(manifest: dict[str, Any]) -> None:
        manifest["metadata"]["note"] = text
        manifest["components"]["trainer"]["skeleton"]["name"] = text
        manifest["components"]["trainer"]["skeleton"][text] = [text, {"__reduce__": text}]

    reseal(ckpt, plant)
    loaded = load_checkpoint(ckpt)
    assert loaded.metadata["note"] == text
    assert loaded.components["trainer"]["name"] == text
    assert loaded.components["trainer"][text] == [text, {"__reduce__": text}]
    assert not sentinel.exists()


@pytest.mark.usefixtures("no_unpickling")
@pytest.mark.parametrize(
    "node",
    [
        {"__rlloop__": "pickle", "data": "gASVAAAAAAAAAE4u"},
        {"__rlloop__": "npscalar", "dtype": "O", "value": "x"},
        {"__rlloop__": "npscalar", "dtype": "|O", "value": {"__rlloop__": "pickle"}},
        {"__rlloop__": "float", "value": "__import__('os').system('true')"},
        {"__rlloop__": "int", "hex": "__import__('os')"},
    ],
)
def test_unknown_or_hostile_nodes_are_rejected(ckpt: Path, node: dict[str, Any]) -> None:
    reseal(ckpt, lambda m: m["components"]["trainer"]["skeleton"].update(evil=node))
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)


def test_loader_source_has_no_code_execution_paths() -> None:
    import rlloop.checkpoint as module

    package = Path(module.__file__).parent
    source = "\n".join(f.read_text() for f in sorted(package.glob("*.py")))
    assert "def load_checkpoint" in source
    for banned in [r"(?<!safetensors\.)torch\.load\b", r"\bpickle\b", r"\b(marshal|dill|shelve)\b",
                   r"\beval\(", r"\bexec\(", r"yaml\.(unsafe_)?load\(", r"allow_pickle"]:
        assert not re.search(banned, source), banned
