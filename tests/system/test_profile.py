"""``--profile``: a torch.profiler trace of a few iterations with the loop's phases named."""

from __future__ import annotations

import json

import pytest

from rlloop.cli.main import main
from rlloop.config.loading import build_config

TINY = ["--env", "CartPole-v1", "--total-env-steps", "1024", "--quiet",
        "--set", "mlflow=false", "--set", "save_video=false", "--set", "num_envs=4",
        "--set", "ppo.rollout_steps=64", "--set", "ppo.minibatch_size=128",
        "--set", "ppo.num_epochs=1",
        "--set", "eval_every=1", "--set", "eval_episodes=2"]


def _phases(trace_file) -> set[str]:
    """The ``record_function`` ranges of a Chrome trace, read as Perfetto reads it."""
    trace = json.loads(trace_file.read_text())
    return {e["name"] for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "user_annotation"}


def test_profile_writes_a_trace_with_named_phases(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "ppo", *TINY, "--profile", "--set", "profile.wait=0",
                 "--set", "profile.active=2", "--run-dir", str(run)]) == 0
    traces = list((run / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1
    # Iterations 2 and 3 (1 is the warm-up): their collect and update, and the evaluation
    # after iteration 2.
    assert {"collect", "update", "eval"} <= _phases(traces[0])
    assert "update" in (run / "profile" / "summary.txt").read_text()


def test_profile_is_off_by_default_and_leaves_the_algorithm_as_it_is(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "ppo", *TINY, "--run-dir", str(run)]) == 0
    assert not (run / "profile").exists()
    assert "profile: null" in (run / "config.yaml").read_text()


def test_profile_section_in_a_config_file(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("profile: {wait: 2, active: 4}\n")
    config = build_config("ppo", "CartPole-v1", file=file)
    assert (config.profile.wait, config.profile.warmup, config.profile.active) == (2, 1, 4)
    assert build_config("ppo", sets=["profile=true"]).profile.active == 3
    assert build_config("ppo", file=file, sets=["profile=false"]).profile is None


@pytest.mark.parametrize(("sets", "expected"), [
    (["profile.active=0"], "profile.active must be an integer > 0"),
    (["profile.wiat=1"], "unknown config key 'profile.wiat'; did you mean profile.wait?"),
    (["profile=3"], "profile must be a mapping"),
    (["profile.wait=-1"], "profile.wait must be an integer >= 0"),
])
def test_bad_profile_section_is_one_line_exit_2(tmp_path, capsys, sets, expected):
    args = [item for s in sets for item in ("--set", s)]
    assert main(["train", "ppo", *TINY, *args, "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
