"""What a crash (SIGKILL) or a stop leaves for the next sitting: the same MLflow run, no
row twice, a report and a video that describe the sitting and policy they claim to."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from rlloop.envs.gym import GymVecEnv
from rlloop.logging import JsonlSink
from rlloop.runs.video import drop_leftover_clips
from rlloop.runs.wrap_up import drop_stale_video

TESTS = Path(__file__).resolve().parents[1]
TINY = ["--set", "ppo.rollout_steps=32", "--set", "num_envs=4", "--set", "ppo.minibatch_size=64",
        "--set", "eval_every=4", "--set", "eval_episodes=2", "--set", "save_video=false",
        "--set", "stop_on_solve=false", "--set", "mlflow_interval_s=0.1", "--quiet"]


def _train(cli_env: dict[str, str], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlloop", "train", "ppo", *args],
                          env={**cli_env, **env}, cwd=TESTS, capture_output=True, text=True,
                          timeout=300)


def test_a_resume_after_a_crash_continues_the_same_mlflow_run(tmp_path, cli_env):
    """run.json learnt the MLflow run id only when the sinks closed, which a killed process
    never reaches: the resume opened a second MLflow run (no params, no early rows)."""
    run = tmp_path / "run"
    crashed = _train(cli_env, "--env", "CartPole-v1", "--run-dir", str(run),
                     "--total-env-steps", "4096", "--set", "checkpoint_every=1", *TINY,
                     "--callback", "run_killer:KillAfterTracked",
                     RLLOOP_TEST_RUN=str(run), RLLOOP_TEST_KILL_AT="1024")
    assert crashed.returncode == -9, crashed.stderr
    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    assert run_id is not None
    done = _train(cli_env, "--resume", str(run), "--total-env-steps", "1536", "--quiet")
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(run / "mlflow.db") as con:
        runs = con.execute("SELECT run_uuid, status FROM runs").fetchall()
        params = con.execute("SELECT count(*) FROM params").fetchone()[0]
    assert runs == [(run_id, "FINISHED")] and params > 0


def test_rows_logged_after_a_mid_step_checkpoint_are_dropped(tmp_path):
    """An off-policy save falls between the optimisation steps of one env step: rows of
    that env step logged after it survived the cut and were logged again."""
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    for opt in (1, 2, 3, 4):
        sink.log_metrics({"opt/steps": float(opt)}, step=100)
    sink.log_metrics({"opt/steps": 5.0}, step=104)
    assert sink.drop_rows_after(100, ("opt/steps", 2)) == 3
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["opt/steps"] for r in rows] == [1.0, 2.0]


def test_resuming_a_finished_run_logs_no_second_final_evaluation(tmp_path, cli_in_process):
    run = tmp_path / "run"  # both sittings through main() in this process
    first = cli_in_process(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run),
                            "--total-env-steps", "512", "--set", "mlflow=false", *TINY])
    assert first.returncode == 0, first.stderr
    before = (run / "metrics.jsonl").read_text()
    again = cli_in_process(["train", "ppo", "--resume", str(run), "--quiet"])
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in rows if "eval/return_mean" in r]
    assert len(evals) == len(set(evals)), evals
    assert sum("eval/return_mean" in json.loads(line) for line in before.splitlines()) \
        == len(evals)


def test_a_stopped_sittings_report_shows_no_earlier_sittings_phases(tmp_path):
    from rlloop.config.loading import build_config
    from rlloop.runs.report import _NO_CHANGES, _NO_PHASES, write_report
    from rlloop.trainers.result import RunResult

    config = build_config("ppo", "CartPole-v1")
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.log_metrics({"env/steps": 64.0, "time/run_s": 9.7, "time/video_s": 3.0}, step=64)
    sink.close()
    result = RunResult(tmp_path, 128, 2.5, None, {}, "SIGTERM")
    write_report(tmp_path, result, config, figures=[], phases_logged=False)
    report = (tmp_path / "report.md").read_text()
    assert _NO_PHASES in report and "| video | 3" not in report
    write_report(tmp_path, result, config, figures=[])
    report = (tmp_path / "report.md").read_text()
    assert "| video | 3" in report
    # A run at the defaults and the preset says so, not with an empty table.
    assert _NO_CHANGES in report and "| setting | default | this run |" not in report


def test_a_stale_video_goes_when_a_stop_skipped_filming_a_new_best(tmp_path):
    (tmp_path / "video.mp4").write_bytes(b"old best")
    drop_stale_video(tmp_path)
    assert not (tmp_path / "video.mp4").exists()


def test_the_clip_plays_at_the_envs_own_frame_rate():
    """Gymnasium envs were filmed at 30 fps whatever their render_fps (Acrobot: 15)."""
    env = GymVecEnv("Acrobot-v1", 1)
    try:
        assert env.metadata["render_fps"] == 15
    finally:
        env.close()


def test_clips_left_by_a_killed_process_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f".video.mp4.{dead}.abcd1234.tmp.mp4"
    mine = tmp_path / f".video.mp4.{os.getpid()}.abcd1234.tmp.mp4"
    other = tmp_path / ".video.mp4.notapid.tmp.mp4"
    for path in (left, mine, other):
        path.write_bytes(b"partial")
    drop_leftover_clips(tmp_path, "video.mp4")
    assert not left.exists() and mine.exists() and other.exists()


def test_a_render_failure_is_one_clear_error():
    """MuJoCo without a display failed with OpenGL's FatalError, reported as unexpected."""
    import pytest

    from rlloop.runs.video import RenderUnavailableError, _render_checked

    # A function whose frame reads as MuJoCo's renderer's.
    namespace: dict = {}
    exec(compile("def render():\n    raise RuntimeError('an OpenGL platform library has not "
                 "been loaded')\n", "site-packages/mujoco/gl_context.py", "exec"), namespace)

    with pytest.raises(RenderUnavailableError, match=r"Hopper-v5 could not render a frame "
                                                     r"\(RuntimeError: an OpenGL .*MUJOCO_GL=egl"):
        _render_checked(namespace["render"], "Hopper-v5")()

    def render() -> None:  # any other env's failure: no MuJoCo advice
        raise ValueError("no frame")

    with pytest.raises(RenderUnavailableError) as caught:
        _render_checked(render, "Custom-v0")()
    assert str(caught.value) == "Custom-v0 could not render a frame (ValueError: no frame)"


def test_mujoco_renders_offscreen_without_a_display(monkeypatch):
    from rlloop.runs.video import offscreen_rendering

    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL"):
        monkeypatch.delenv(name, raising=False)
    offscreen_rendering()
    assert os.environ["MUJOCO_GL"] == "egl"
    monkeypatch.setenv("MUJOCO_GL", "osmesa")  # the user's choice is kept
    offscreen_rendering()
    assert os.environ["MUJOCO_GL"] == "osmesa"
