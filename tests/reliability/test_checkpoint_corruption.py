"""Damaged checkpoints raise a specific typed error naming the file; they never load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlloop.checkpoint import (
    FORMAT_VERSION,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointVersionError,
    is_checkpoint,
    load_checkpoint,
    verify_checkpoint,
)
from rlloop.checkpoint.format import _manifest_checksum

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    components = {
        "module": {"w": torch.randn(64, 8), "b": torch.zeros(8)},
        "replay_buffer": {"obs": np.arange(100, dtype=np.float32), "size": 100},
        "trainer": {"step": 12, "lr": 3e-4},
    }
    return CheckpointManager(tmp_path).save(12, components, metadata={"run": "corrupt-me"})


def flip_byte(file: Path, index: int, mask: int = 0xFF) -> None:
    data = bytearray(file.read_bytes())
    data[index] ^= mask
    file.write_bytes(bytes(data))


def rewrite_manifest(path: Path, edit: Edit, reseal: bool = True) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    edit(manifest)
    if reseal:
        manifest["manifest_sha256"] = _manifest_checksum(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def expect(error: type[CheckpointError], path: Path, file_name: str) -> None:
    for check in (load_checkpoint, verify_checkpoint):
        with pytest.raises(error) as info:
            check(path)
        assert type(info.value) is error
        assert file_name in str(info.value)


def test_truncated_safetensors(ckpt: Path) -> None:
    file = ckpt / "module.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    expect(CheckpointCorruptError, ckpt, "module.safetensors")


@pytest.mark.parametrize("where", [0, 9, -1])  # header length, header JSON, tensor data
def test_flipped_byte_in_safetensors(ckpt: Path, where: int) -> None:
    flip_byte(ckpt / "replay_buffer.safetensors", where)
    expect(CheckpointCorruptError, ckpt, "replay_buffer.safetensors")


def test_flipped_byte_in_manifest_value(ckpt: Path) -> None:
    text = (ckpt / "manifest.json").read_bytes()
    flip_byte(ckpt / "manifest.json", text.index(b"corrupt-me"), 0x01)  # 'c' -> 'b': valid JSON
    expect(CheckpointCorruptError, ckpt, "manifest.json")


def test_every_single_bit_flip_in_manifest_is_caught(ckpt: Path) -> None:
    """Flip each byte in turn: the load either fails with a CheckpointError or is unchanged
    (whitespace that still parses the same); it never silently returns different data."""
    manifest = ckpt / "manifest.json"
    original = manifest.read_bytes()
    reference = load_checkpoint(ckpt)
    caught = 0
    for index in range(len(original)):
        for mask in (0x01, 0x80):
            damaged = bytearray(original)
            damaged[index] ^= mask
            manifest.write_bytes(bytes(damaged))
            try:
                loaded = load_checkpoint(ckpt)
            except CheckpointError:
                caught += 1
                continue
            assert loaded.metadata == reference.metadata, index
            assert loaded.components["trainer"] == reference.components["trainer"], index
            module, expected = loaded.components["module"], reference.components["module"]
            assert torch.equal(module["w"], expected["w"]), index
    assert caught >= len(original)


def test_broken_json(ckpt: Path) -> None:
    (ckpt / "manifest.json").write_text('{"format_version": 1, "components": {')
    expect(CheckpointCorruptError, ckpt, "manifest.json")
    (ckpt / "manifest.json").write_text('{"format_version": NaN}')
    expect(CheckpointCorruptError, ckpt, "manifest.json")
    (ckpt / "manifest.json").write_text("[" * 100_000)
    expect(CheckpointCorruptError, ckpt, "manifest.json")


def test_missing_member(ckpt: Path) -> None:
    (ckpt / "module.safetensors").unlink()
    expect(CheckpointCorruptError, ckpt, "module.safetensors")


def test_member_file_swapped_between_components(ckpt: Path) -> None:
    (ckpt / "module.safetensors").write_bytes((ckpt / "replay_buffer.safetensors").read_bytes())
    expect(CheckpointCorruptError, ckpt, "module.safetensors")


@pytest.mark.parametrize("reseal", [True, False])
def test_newer_format_version(ckpt: Path, reseal: bool) -> None:
    def bump(manifest: dict[str, Any]) -> None:
        manifest["format_version"] = FORMAT_VERSION + 1

    rewrite_manifest(ckpt, bump, reseal=reseal)
    expect(CheckpointVersionError, ckpt, "manifest.json")
    with pytest.raises(CheckpointVersionError, match="Upgrade rlloop"):
        load_checkpoint(ckpt)
    # A newer checkpoint is never silently skipped for an older one: that would lose data.
    with pytest.raises(CheckpointVersionError):
        CheckpointManager(ckpt.parent).latest()


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(format_version=0),
        lambda m: m.update(format_version="1"),
        lambda m: m.pop("components"),
        lambda m: m["components"]["module"]["file"].update(name="../../etc/passwd"),
        lambda m: m["components"]["module"]["file"].update(bytes="12"),
        lambda m: m["components"]["trainer"].update(skeleton={"__rlloop__": "pickle", "x": 1}),
        lambda m: m["components"]["trainer"].update(skeleton={"__rlloop__": "tuple"}),
        lambda m: m["components"]["module"]["skeleton"]["w"].update(dtype="float64"),
        lambda m: m["components"]["module"]["skeleton"]["w"].update(shape=[8, 64]),
        lambda m: m["components"]["module"]["skeleton"].update(b=1),  # tensor left unused
        lambda m: m["components"]["module"]["skeleton"].update(
            b=m["components"]["module"]["skeleton"]["w"]),  # one tensor used twice
        lambda m: m["components"].update({"../x": m["components"]["trainer"]}),
    ],
)
def test_resealed_but_inconsistent_manifest(ckpt: Path, edit: Edit) -> None:
    rewrite_manifest(ckpt, edit)
    with pytest.raises(CheckpointCorruptError) as info:
        load_checkpoint(ckpt)
    assert ".json" in str(info.value) or ".safetensors" in str(info.value)


def test_not_found(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="nope"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "model.pt").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointNotFoundError, match="never loads pickled"):
        load_checkpoint(tmp_path / "model.pt")
    (tmp_path / "empty").mkdir()
    assert not is_checkpoint(tmp_path / "empty")
    with pytest.raises(CheckpointNotFoundError, match=r"manifest\.json"):
        load_checkpoint(tmp_path / "empty")


def test_latest_skips_damaged_checkpoints(ckpt: Path) -> None:
    manager = CheckpointManager(ckpt.parent)
    older = manager.save(11, {"trainer": {"step": 11}, "module": {"w": torch.ones(2)}})
    assert manager.latest() == ckpt
    flip_byte(ckpt / "module.safetensors", -1)
    assert manager.latest() == older
    loaded = manager.load_latest()
    assert loaded is not None and loaded.path == older
