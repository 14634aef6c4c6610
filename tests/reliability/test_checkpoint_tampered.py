"""Deliberately tampered checkpoints: values changed and every hash recomputed, so the
integrity checks pass. Each value is checked against the built run as it is restored (a
counter's type and range, the RNG states' exact form, weight shapes, finite weights); a
checkpoint that fails is damaged: one warning, and resume, eval and export take the next
older intact one. With nothing intact left, one error line (exit 2)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch

from rlloop.checkpoint import MANIFEST, CheckpointManager, load_checkpoint
from rlloop.checkpoint.format import _manifest_checksum
from rlloop.cli.export import export_run
from rlloop.errors import RunDirError
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import resume, train

from ._algos import small_config
from ._cli import run

Tensors = dict[str, torch.Tensor]
WEIGHT = "learner.module.default_policy.actor.0.weight"


def tamper(ckpt: Path, component: str, *, manifest: Callable[[dict[str, Any]], None] | None = None,
           tensors: Callable[[Tensors, dict[str, Any]], None] | None = None) -> None:
    """Edit one component's skeleton and/or tensors, then recompute its file's size and
    sha256 and the manifest's checksum, as a careful attacker would."""
    body = json.loads((ckpt / MANIFEST).read_text())
    del body["manifest_sha256"]
    entry = body["components"][component]
    if tensors is not None:
        file = ckpt / f"{component}.safetensors"
        data = safetensors.torch.load(file.read_bytes())
        tensors(data, entry["skeleton"])
        raw = safetensors.torch.save(data, metadata={"format": "pt"})
        file.write_bytes(raw)
        entry["file"].update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    if manifest is not None:
        manifest(entry["skeleton"])
    body["manifest_sha256"] = _manifest_checksum(body)
    (ckpt / MANIFEST).write_text(json.dumps(body))


def _weight_node(skeleton: dict[str, Any]) -> dict[str, Any]:
    return skeleton["learner"]["module"]["default_policy"]


def _transposed(data: Tensors, skeleton: dict[str, Any]) -> None:
    data[WEIGHT] = data[WEIGHT].t().contiguous()
    _weight_node(skeleton)["actor.0.weight"]["shape"] = list(data[WEIGHT].shape)


def _nan(data: Tensors, skeleton: dict[str, Any]) -> None:
    data[WEIGHT] = data[WEIGHT].clone()
    data[WEIGHT][0, 0] = math.nan


def _inf(data: Tensors, skeleton: dict[str, Any]) -> None:
    data[WEIGHT] = data[WEIGHT].clone()
    data[WEIGHT][-1, -1] = -math.inf


def _missing_weight(data: Tensors, skeleton: dict[str, Any]) -> None:
    del data[WEIGHT], _weight_node(skeleton)["actor.0.weight"]


def _missing_tensor(data: Tensors, skeleton: dict[str, Any]) -> None:
    del data[WEIGHT]  # the manifest still lists it


def _short_torch_rng(data: Tensors, skeleton: dict[str, Any]) -> None:
    data["torch"] = torch.zeros(10, dtype=torch.uint8)
    skeleton["torch"]["shape"] = [10]


def _env_steps(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda skeleton: skeleton["counters"].update({"env/steps": value})


def _short_python_rng(skeleton: dict[str, Any]) -> None:
    skeleton["python"]["state"] = skeleton["python"]["state"][:-1]


def _numpy_generator(skeleton: dict[str, Any]) -> None:
    skeleton["numpy"]["bit_generator"] = "PCG64"


#: name -> (component, edit of its skeleton, edit of its tensors)
TAMPERED: dict[str, tuple[str, Any, Any]] = {
    "python RNG state of the wrong size": ("rng", _short_python_rng, None),
    "transposed weight": ("algorithm", None, _transposed),
    "env/steps -1e12": ("trainer", _env_steps(-1e12), None),
    "env/steps 'lots'": ("trainer", _env_steps("lots"), None),
    "env/steps 1e40": ("trainer", _env_steps(1e40), None),
    "another numpy bit generator": ("rng", _numpy_generator, None),
    "10-byte torch RNG state": ("rng", None, _short_torch_rng),
    "NaN weight": ("algorithm", None, _nan),
    "infinite weight": ("algorithm", None, _inf),
}
#: What a policy load (eval, export) reads: the weights.
TAMPERED_WEIGHTS: dict[str, Any] = {
    "transposed weight": _transposed,
    "NaN weight": _nan,
    "missing weight": _missing_weight,
    "missing tensor": _missing_tensor,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two PPO iterations of 64 env steps: checkpoints at 64 and 128, best/ from the eval
    at 128."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    config = small_config("ppo", seed=5, extra=(
        "checkpoint_every=1", "eval_every=2", "keep_checkpoints=5", "eval_episodes=2",
        "stop_on_solve=false", "save_video=false", "total_env_steps=128"))
    train(config, run_dir)
    return run_dir


def copy_of(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def newest(run_dir: Path) -> Path:
    return CheckpointManager(run_dir / "checkpoints").all()[-1]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("case", TAMPERED)
def test_resume_falls_back_from_a_tampered_checkpoint(trained, tmp_path, caplog, case):
    run_dir = copy_of(trained, tmp_path)
    damaged = newest(run_dir)
    assert damaged.name == "000000128"
    component, manifest, tensors = TAMPERED[case]
    tamper(damaged, component, manifest=manifest, tensors=tensors)
    load_checkpoint(damaged)  # its files are intact: only its values are wrong

    with caplog.at_level(logging.WARNING):
        result = resume(run_dir, total_env_steps=128)
    lines = warnings_of(caplog)
    assert len(lines) == 1 and str(damaged) in lines[0] and "damaged" in lines[0], lines
    # From 64 again: the resumed run trained to 128 and saved it over the tampered one.
    assert result.env_steps == 128
    counters = load_checkpoint(damaged).components["trainer"]["counters"]
    assert counters["env/steps"] == 128 and counters["algorithm/steps"] == 2


def test_resume_with_every_checkpoint_tampered_names_them(trained, tmp_path, caplog):
    run_dir = copy_of(trained, tmp_path)
    for ckpt in CheckpointManager(run_dir / "checkpoints").all():
        tamper(ckpt, "algorithm", tensors=_nan)
    with caplog.at_level(logging.WARNING), pytest.raises(RunDirError) as info:
        resume(run_dir, total_env_steps=256)
    assert len(warnings_of(caplog)) == 2
    assert "checkpoints (2 in" in str(info.value) and "all damaged" in str(info.value)


def test_resume_with_all_manifests_removed_says_so(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    for step in ("000000064", "000000128"):
        (run_dir / "checkpoints" / step / MANIFEST).unlink()
    with pytest.raises(RunDirError) as info:
        resume(run_dir, total_env_steps=256)
    message = str(info.value)
    assert "stopped before its first save" not in message
    assert "damaged or incomplete" in message and "no manifest.json" in message
    assert "backup" in message and "start over" in message


@pytest.mark.parametrize("case", TAMPERED_WEIGHTS)
def test_eval_falls_back_from_a_tampered_best(trained, tmp_path, case):
    run_dir = copy_of(trained, tmp_path)
    tamper(run_dir / "best", "algorithm", tensors=TAMPERED_WEIGHTS[case])
    lines: list[str] = []
    stats = evaluate_run(run_dir, episodes=1, notify=lines.append)
    assert len(lines) == 1, lines
    assert f"{run_dir / 'best'} is damaged" in lines[0] and str(newest(run_dir)) in lines[0]
    assert stats["episodes"] == 1 and math.isfinite(stats["return_mean"])


def test_eval_passes_over_a_tampered_newest_checkpoint_too(trained, tmp_path, caplog):
    run_dir = copy_of(trained, tmp_path)
    tamper(run_dir / "best", "algorithm", tensors=_nan)
    tamper(newest(run_dir), "algorithm", tensors=_transposed)
    lines: list[str] = []
    with caplog.at_level(logging.WARNING):
        evaluate_run(run_dir, episodes=1, notify=lines.append)
    assert len(lines) == 1 and str(run_dir / "checkpoints" / "000000064") in lines[0]
    skipped = warnings_of(caplog)
    assert len(skipped) == 1 and str(newest(run_dir)) in skipped[0]


def test_export_of_a_nan_best_exports_the_intact_checkpoint(trained, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    run_dir = copy_of(trained, tmp_path)
    tamper(run_dir / "best", "algorithm", tensors=_nan)
    lines: list[str] = []
    path = export_run(run_dir, "onnx", notify=lines.append)
    assert len(lines) == 1 and "non-finite weights" in lines[0], lines
    weights = [numpy_helper.to_array(w) for w in onnx.load(path).graph.initializer]
    assert weights and all(np.isfinite(w).all() for w in weights if w.dtype.kind == "f")


def test_nan_everywhere_is_refused_with_one_line(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    for ckpt in [run_dir / "best", *CheckpointManager(run_dir / "checkpoints").all()]:
        tamper(ckpt, "algorithm", tensors=_nan)
    with pytest.raises(RunDirError, match="no intact checkpoint"):
        export_run(run_dir, "torchscript")
    assert not (run_dir / "policy.pt").exists()
    out = run(["eval", str(run_dir), "--episodes", "1"], tmp_path)
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip().splitlines()[-1]  # after a warning per skipped checkpoint
    assert line.startswith("rlloop: error:") and "non-finite weights" in line
    assert "no intact checkpoint" in line and "Traceback" not in out.stderr
