"""Sinks write what they are given, read back through each backend's own reader."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, env_without, plain_console
from rich.console import Console

from rlloop.logging import (
    ConsoleSink,
    JsonlSink,
    MlflowSink,
    MultiSink,
    Sink,
    TensorBoardSink,
    format_number,
    print_summary,
    sqlite_tracking_uri,
)
from rlloop.logging.mlflow_sink import mlflow_name


class RecordingSink:
    def __init__(self) -> None:
        self.params: list[Mapping[str, Any]] = []
        self.metrics: list[tuple[dict[str, float], int]] = []
        self.closed_with: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.append(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.metrics.append((dict(metrics), step))

    def close(self, status: str = "FINISHED") -> None:
        self.closed_with = status


class BrokenSink(RecordingSink):
    calls = 0

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.calls += 1
        raise OSError("disk full")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- JSONL -------------------------------------------------------------------------------


def test_jsonl_lines_parse_and_append_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log_metrics({"losses/policy": 0.5, "env/steps": 100}, step=100)
    assert read_jsonl(path) == [{"step": 100, "losses/policy": 0.5, "env/steps": 100.0}]
    sink.log_metrics({"losses/policy": math.nan}, step=200)  # line-buffered: visible now
    sink.close()
    sink.close()  # idempotent

    resumed = JsonlSink(path)
    resumed.log_metrics({"losses/policy": 0.25}, step=300)
    resumed.close()
    rows = read_jsonl(path)
    assert [r["step"] for r in rows] == [100, 200, 300]
    assert math.isnan(rows[1]["losses/policy"])
    assert rows[2]["losses/policy"] == 0.25


def test_jsonl_resume_after_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')  # crashed mid-write
    sink = JsonlSink(path)
    sink.log_metrics({"x": 3.0}, step=3)
    sink.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"step": 3, "x": 3.0}
    assert len(lines) == 3


def test_jsonl_params_go_to_a_sidecar_and_merge(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.log_params({"algo": {"lr": 3e-4}, "env": "CartPole-v1"})
    sink.log_params({"algo": {"lr": 1e-3}, "seed": 1})
    sink.close()
    params = json.loads((tmp_path / "metrics.params.json").read_text())
    assert params == {"algo/lr": 1e-3, "env": "CartPole-v1", "seed": 1}
    assert (tmp_path / "metrics.jsonl").read_text() == ""


# --- MLflow ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One database for the module: creating an MLflow schema takes a few seconds.
    return sqlite_tracking_uri(tmp_path_factory.mktemp("mlflow") / "store" / "mlflow.db")


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key)]


def test_mlflow_sink_round_trip(tracking_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    params = {"algo": {"lr": 3e-4, "gamma": 0.99}, "env": "CartPole-v1", "notes": "x" * 7000}
    sink = MlflowSink(tracking_uri, "round-trip", "ppo-cartpole", params=params)
    for step in (0, 100, 200):
        sink.log_metrics({"losses/policy": step / 100, "env/steps_per_s": 5.0}, step)
    sink.close()
    sink.close()  # idempotent

    run = MlflowClient(tracking_uri).get_run(sink.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "ppo-cartpole"
    assert run.data.params["algo/lr"] == "0.0003"
    assert run.data.params["algo/gamma"] == "0.99"
    assert run.data.params["env"] == "CartPole-v1"
    assert len(run.data.params["notes"]) == 6000  # MLflow's limit
    assert history(tracking_uri, sink.run_id, "losses/policy") == [(0, 0.0), (100, 1.0), (200, 2.0)]
    assert sink.ui_command == f"mlflow ui --backend-store-uri {tracking_uri}"
    # Artifacts live next to the database, not in ./mlruns of whatever the cwd was.
    experiment = MlflowClient(tracking_uri).get_experiment(sink.experiment_id)
    assert experiment.artifact_location.endswith("/store/artifacts")


def test_the_ui_hint_names_the_install_where_only_mlflow_skinny_is(tmp_path: Path) -> None:
    """rlloop depends on MLflow's client (mlflow-skinny), whose `mlflow ui` needs Flask:
    without it the hint installs the full mlflow first (a run's summary prints it)."""
    code = ("from rlloop.logging.mlflow_sink import ui_hint; "
            "print(ui_hint('sqlite:///runs/a/mlflow.db'))")
    out = subprocess.run([sys.executable, "-c", code], env=env_without("flask", tmp_path),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "pip install mlflow && mlflow ui --backend-store-uri sqlite:///runs/a/mlflow.db"


def test_mlflow_sink_buffers_until_the_flush_interval(tracking_uri: str) -> None:
    clock = FakeClock()
    sink = MlflowSink(tracking_uri, "buffering", "r", flush_interval_s=2.0, clock=clock)
    sink.log_metrics({"x": 1.0}, 1)
    clock.t = 1.0
    sink.log_metrics({"x": 2.0}, 2)
    assert history(tracking_uri, sink.run_id, "x") == []  # no write yet
    clock.t = 2.5
    sink.log_metrics({"x": 3.0}, 3)
    assert history(tracking_uri, sink.run_id, "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    sink.log_metrics({"x": 4.0}, 4)
    sink.close("KILLED")
    assert history(tracking_uri, sink.run_id, "x")[-1] == (4, 4.0)
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri).get_run(sink.run_id).info.status == "KILLED"


def test_mlflow_sink_resumes_the_same_run(tracking_uri: str, caplog: Any) -> None:
    from mlflow.tracking import MlflowClient

    first = MlflowSink(tracking_uri, "resume", "r", params={"lr": 0.1})
    first.log_metrics({"return": 1.0}, 10)
    first.close("KILLED")  # e.g. interrupted, then resumed from a checkpoint

    with caplog.at_level(logging.WARNING):
        resumed = MlflowSink(
            tracking_uri, "resume", "ignored", run_id=first.run_id, params={"lr": 0.2, "seed": 3}
        )
    assert "cannot change" in caplog.text  # lr stays 0.1
    assert MlflowClient(tracking_uri).get_run(first.run_id).info.status == "RUNNING"
    resumed.log_metrics({"return": 2.0}, 20)
    resumed.close()

    client = MlflowClient(tracking_uri)
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "seed": "3"}
    assert history(tracking_uri, first.run_id, "return") == [(10, 1.0), (20, 2.0)]
    assert len(client.search_runs([first.experiment_id])) == 1


def test_a_copied_run_directory_writes_its_artifacts_into_the_copy(tmp_path: Path) -> None:
    """MLflow stores absolute artifact paths: a run directory copied and resumed (as the
    refusal of --run-dir beside --resume advises) wrote its model, report and video into
    the original run's artifacts."""
    import shutil

    from mlflow.tracking import MlflowClient

    original, copy = tmp_path / "a", tmp_path / "b"
    first = MlflowSink(sqlite_tracking_uri(original / "mlflow.db"), "rlloop", "a")
    (tmp_path / "note.txt").write_text("first")
    first.log_artifacts({str(tmp_path / "note.txt"): "report"})
    first.close()
    shutil.copytree(original, copy)

    uri = sqlite_tracking_uri(copy / "mlflow.db")
    (tmp_path / "note.txt").write_text("second")
    # The resume in a process of its own, as `rlloop train --resume` (MLflow caches a
    # run's artifact location per process).
    script = (f"from rlloop.logging.mlflow_sink import MlflowSink\n"
              f"s = MlflowSink({uri!r}, 'rlloop', run_id={first.run_id!r})\n"
              f"s.log_artifacts({{{str(tmp_path / 'note.txt')!r}: 'report'}})\n"
              "s.close()\n"
              f"s = MlflowSink({uri!r}, 'rlloop', 'another run in the copy')\n"
              "print(s.run_id)\ns.close()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120)
    fresh_id = out.stdout.strip().splitlines()[-1]

    def note(root: Path) -> str:
        return (root / "artifacts" / first.run_id / "artifacts" / "report" / "note.txt"
                ).read_text()

    assert note(original) == "first" and note(copy) == "second"
    client = MlflowClient(uri)
    for run_id in (first.run_id, fresh_id):
        assert client.get_run(run_id).info.artifact_uri.startswith(
            (copy / "artifacts").resolve().as_uri())
    assert client.get_experiment("0").artifact_location == (
        (copy / "artifacts").resolve().as_uri() + "/0")


def test_mlflow_sink_unknown_run_id_is_a_clear_error(tracking_uri: str) -> None:
    with pytest.raises(ValueError, match="cannot resume MLflow run"):
        MlflowSink(tracking_uri, "resume", run_id="0" * 32)


def test_mlflow_names_are_sanitised() -> None:
    assert mlflow_name("losses/policy") == "losses/policy"
    assert mlflow_name("q(s,a)/mean") == "q_s_a_/mean"
    assert mlflow_name("/a//b/../c/") == "a/b/_/c"
    assert len(mlflow_name("k" * 300)) == 250


# --- TensorBoard -------------------------------------------------------------------------


def test_tensorboard_sink_scalars_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.log_params({"algo": {"lr": 3e-4, "hidden": [64, 64]}, "env": "CartPole-v1"})
    for step in (0, 10, 20):
        sink.log_metrics({"losses/policy": step / 10, "episode/return_mean": 2.0 * step}, step)
    sink.close()

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"losses/policy", "episode/return_mean"}
    policy = [(e.step, e.value) for e in acc.Scalars("losses/policy")]
    assert policy == [(0, 0.0), (10, 1.0), (20, 2.0)]
    assert [e.value for e in acc.Scalars("episode/return_mean")] == [0.0, 20.0, 40.0]
    assert "params/text_summary" in acc.Tags()["tensors"]


# --- Console -----------------------------------------------------------------------------


def test_console_sink_plain_lines_when_not_a_tty() -> None:
    console, out = plain_console()
    clock = FakeClock()
    sink = ConsoleSink(2000, console=console, print_interval_s=5.0, clock=clock)
    sink.log_metrics({"env/steps": 0}, 0)
    clock.t = 2.0
    sink.log_metrics({"env/steps": 200}, 200)  # within 5 s of the last line: not printed
    assert len(out.getvalue().splitlines()) == 1
    clock.t = 10.0
    sink.log_metrics({"env/steps": 1000, "episode/return_mean": 12.5}, 1000)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "steps 0/2,000" in lines[0]
    assert lines[1] == "steps 1,000/2,000 (50%) | 100 steps/s | return 12.5 | ETA 0:00:10"
    clock.t = 11.0
    sink.log_metrics({"env/steps": 1100, "eval/return_mean": 30.0}, 1100)
    sink.close()  # prints the last, not yet shown, state
    last = out.getvalue().splitlines()[-1]
    assert "steps 1,100/2,000" in last
    assert "steps/s" in last
    assert "eval 30" in last


def test_console_sink_live_bar_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    clock = FakeClock()
    sink = ConsoleSink(None, console=console, clock=clock)
    sink.log_metrics({}, 0)
    clock.t = 1.0
    sink.log_metrics({"episode/return_mean": 3.0}, 500)
    sink.close()
    assert "500 steps/s" in out.getvalue()


def test_console_sink_disabled_and_summary() -> None:
    console, out = plain_console()
    quiet = ConsoleSink(100, console=console, enabled=False)
    quiet.log_metrics({"env/steps": 1}, 1)
    quiet.print_summary({"env steps": "1"})
    quiet.close()
    assert out.getvalue() == ""
    print_summary({"env steps": "100,000", "final return": "500.0"}, console)
    text = out.getvalue()
    assert "Summary" in text
    assert "100,000" in text
    assert "final return" in text


def feed_a_run(sink: ConsoleSink, clock: FakeClock) -> None:
    """Two reports 10 s apart (1,280 steps/s), then an overshoot of the 40k budget."""
    sink.log_metrics({"env/steps": 0}, 0)
    clock.t = 10.0
    sink.log_metrics({"env/steps": 12_800, "episode/return_mean": 123.456,
                      "eval/return_mean": 499.5}, 12_800)


def test_console_live_line_fits_80_columns() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    clock = FakeClock()
    sink = ConsoleSink(40_000, console=console, clock=clock)
    feed_a_run(sink, clock)
    sink.close()
    # The last frame the live display drew, without its escape codes.
    last = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().split("\r")[-1]).strip()
    assert "…" not in last
    assert last.startswith("train ━")
    assert "12,800/40,000 (32%)" in last and "eval 499.5" in last and "ETA 0:00:21" in last
    assert len(last) <= 80
    clock = FakeClock()
    wide = ConsoleSink(40_000, console=Console(file=io.StringIO(), width=200), clock=clock)
    feed_a_run(wide, clock)
    assert wide.status_line(50) == "12,800/40,000 (32%) | eval 499.5 | ETA 0:00:21"


def test_console_plain_lines_never_wrap_and_cap_at_100_percent() -> None:
    out = io.StringIO()
    clock = FakeClock()
    sink = ConsoleSink(40_000, console=Console(file=out, width=80), clock=clock,
                       print_interval_s=0.0)
    feed_a_run(sink, clock)
    clock.t = 11.0
    sink.log_metrics({"env/steps": 40_800}, 40_800)  # the last iteration overshoots
    sink.close()
    lines = out.getvalue().splitlines()
    assert lines[1] == ("steps 12,800/40,000 (32%) | 1,280 steps/s | return 123.5 | "
                        "eval 499.5 | ETA 0:00:21")
    assert lines[2].startswith("steps 40,800/40,000 (100%) | ")
    assert len(lines) == 3


@pytest.mark.parametrize(("value", "text"), [
    (-0.0, "0"), (0.0, "0"), (0.955, "0.955"), (-3e-05, "-3e-05"), (322.94, "322.9"),
    (500.0, "500"), (-1234.5, "-1,234"), (math.nan, "nan")])
def test_format_number_keeps_small_values_and_never_prints_minus_zero(value, text) -> None:
    assert format_number(value) == text


# --- MultiSink and the protocol ----------------------------------------------------------


def test_multisink_survives_a_raising_sink(caplog: Any) -> None:
    broken, good = BrokenSink(), RecordingSink()
    sink = MultiSink([broken, good])
    with caplog.at_level(logging.WARNING):
        sink.log_params({"a": 1})
        sink.log_metrics({"x": 1.0}, 1)
        sink.log_metrics({"x": 2.0}, 2)
        sink.close("FAILED")
    assert broken.calls == 1  # disabled after the first failure
    assert good.metrics == [({"x": 1.0}, 1), ({"x": 2.0}, 2)]
    assert good.params == [{"a": 1}]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "BrokenSink.log_metrics failed" in warnings[0].getMessage()
    assert broken.closed_with == good.closed_with == "FAILED"  # failed sinks still get closed
    assert sink.active == (good,)


def test_sinks_satisfy_the_protocol(tmp_path: Path) -> None:
    jsonl = JsonlSink(tmp_path / "m.jsonl")
    console = ConsoleSink(None, console=plain_console()[0])
    for sink in (jsonl, console, MultiSink([]), RecordingSink()):
        assert isinstance(sink, Sink)
    jsonl.close()


def test_import_does_not_load_mlflow_or_tensorboard() -> None:
    code = (
        "import sys, rlloop.logging; "
        "assert 'mlflow' not in sys.modules; "
        "assert 'torch.utils.tensorboard' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_process_sink_writes_real_mlflow_from_a_child_and_leaves_no_process(tmp_path):
    import psutil
    from mlflow.tracking import MlflowClient

    from rlloop.logging import MlflowSink, ProcessSink, ThrottledSink, sqlite_tracking_uri

    uri = sqlite_tracking_uri(tmp_path / "mlflow.db")
    sink = ProcessSink(MlflowSink, tracking_uri=uri, experiment_name="e", run_name="r")
    throttled = ThrottledSink(sink, min_interval_s=3600)
    throttled.log_params({"algo": "ppo"})
    for step in range(1, 6):
        throttled.log_metrics({"loss": float(step)}, step)  # only the first and last pass
    throttled.log_metrics({"eval/return_mean": 9.0}, 6)  # evals always pass
    child = psutil.Process(sink._proc.pid)
    throttled.close("FINISHED")
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    run_id = sink.info["run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 5]
    assert client.get_metric_history(run_id, "eval/return_mean")[0].value == 9.0
    assert client.get_run(run_id).data.params["algo"] == "ppo"


def _broken_sink(**kwargs):
    raise ValueError("cannot open store")


def test_process_sink_reports_a_failed_child_at_close():
    from rlloop.logging import ProcessSink

    sink = ProcessSink(_broken_sink)
    sink.log_metrics({"a": 1.0}, 1)
    with pytest.raises(RuntimeError, match="cannot open store"):
        sink.close()


class HangingSink(RecordingSink):
    """Blocks in its first write, as MLflow does on a tracking server that never answers."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        time.sleep(3600)


def test_process_sink_never_blocks_on_a_hung_child_and_warns_once(caplog):
    import psutil

    from rlloop.logging import ProcessSink

    sink = ProcessSink(HangingSink, close_timeout_s=1.0, max_queued=500, label="hung store")
    child = psutil.Process(sink.pid)
    start = time.monotonic()
    for step in range(20_000):  # far more than a pipe and the queue hold
        sink.log_metrics({"losses/policy": 0.5, "time/learn_s": 0.01}, step)
    assert time.monotonic() - start < 5
    with caplog.at_level(logging.WARNING):
        start = time.monotonic()
        sink.close()
        # Bounded, not instant: the wait counts from the child's last sign of work, and a
        # child still importing on a loaded 2-core machine works for several seconds.
        assert time.monotonic() - start < 1.0 + 30
    assert sink.unlogged == 20_000
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("hung store did not answer for 1 s")
    assert "20000 of 20000 metric rows were not logged" in warning
    assert "dropped while it was behind" in warning
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_process_sink_refuses_a_factory_the_child_cannot_import():
    from rlloop.logging import ProcessSink

    def local_factory() -> Sink:
        return RecordingSink()

    with pytest.raises(ValueError, match="importable"):
        ProcessSink(local_factory)


NO_MAIN_GUARD = """
from rlloop.config.loading import build_config
from rlloop.runs.start import train

# No `if __name__ == "__main__":` guard: the sink's child must not run this again.
result = train(build_config("ppo", "CartPole-v1",
                            flags={"total_env_steps": 7680, "save_video": False,
                                   "stop_on_solve": False, "progress": False}),
               "runs/demo")
print("trained", result.env_steps)
"""


def test_a_script_without_main_guard_logs_every_row_to_mlflow(tmp_path, cli_env):
    from mlflow.tracking import MlflowClient

    script = tmp_path / "train_demo.py"
    script.write_text(NO_MAIN_GUARD)
    done = subprocess.run([sys.executable, str(script)], env=cli_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "trained 7680" in done.stdout
    assert "already holds a run" not in done.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["demo"]  # no stray run dir

    run = tmp_path / "runs" / "demo"
    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=sqlite_tracking_uri(run / "mlflow.db"))
    assert client.get_run(run_id).info.status == "FINISHED"
    # Every metrics.jsonl row is in MLflow too, at its step: nothing throttled away.
    steps: dict[str, list[int]] = {}
    for row in read_jsonl(run / "metrics.jsonl"):
        for key in row.keys() - {"step"}:
            steps.setdefault(key, []).append(row["step"])
    assert len(steps["losses/policy"]) == 15  # one row per iteration
    for key, expected in steps.items():
        logged = [m.step for m in client.get_metric_history(run_id, mlflow_name(key))]
        assert sorted(logged) == sorted(expected), key
