"""The end of a sitting: the video filmed in a thread while the report's figures are drawn,
the report, and the files the run's MLflow run keeps as artifacts."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlloop.config.run_config import RunConfig
from rlloop.logging import ProcessSink
from rlloop.runs.report import read_metrics, write_figures, write_report
from rlloop.runs.sinks import RunSinks
from rlloop.runs.timing import PhaseTimes
from rlloop.system.signals import signal_in_words
from rlloop.trainers.result import RunResult

_log = logging.getLogger(__name__)


def end_sitting(result: RunResult, sinks: RunSinks, phases: PhaseTimes,
                figure_writer: ProcessSink | None, *, config: RunConfig, film: bool,
                stale_video: bool) -> RunResult:
    """Everything after training: the video (``film``; else a ``stale_video`` goes), the
    figures, the phases' times, the report and the MLflow artifacts; ``result`` gets the
    sitting's wall time, start-up included, and is returned."""
    # Training is over: the progress display ends here, not after the video and report
    # (the phase rows below go to the records only).
    sinks.console.close("FINISHED")
    sinks.console.enabled = False
    run_dir, steps = result.run_dir, result.env_steps
    # The video (its frames, then ffmpeg encoding in its own process) is made in a thread
    # while this one draws the report's figures: the two overlap.
    filming = in_thread(lambda: _film(run_dir, phases)) if film else None
    if not film and stale_video:
        drop_stale_video(run_dir)
    with phases.timed("report"):
        figures = draw_figures(run_dir, figure_writer)
    video = filming() if filming is not None else None
    _log_phases(sinks, phases.stats(), steps)  # before the report, which shows it
    # The console summary's clock is the same, read once the report is written too.
    result.wall_time_s = phases.elapsed()
    with phases.timed("report"):
        write_report(run_dir, result, config, figures=figures, phases_logged=not sinks.closed)
    _log_phases(sinks, {"time/report_s": phases.seconds["report"]}, steps)
    if sinks.mlflow is not None and not sinks.closed:
        sinks.mlflow.log_artifacts(run_artifacts(run_dir, video))
    return result


def _film(run_dir: Path, phases: PhaseTimes) -> Path | None:
    from rlloop.runs.video import save_run_video

    with phases.timed("video"):
        return save_run_video(run_dir)


def _log_phases(sinks: RunSinks, times: dict[str, float], steps: int) -> None:
    if not sinks.closed:  # closed already when a signal stopped the run
        sinks.sink.log_metrics(times, steps)


def in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``work`` in a thread; the function returned waits for it and returns its
    result (or raises its exception)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # handed to the waiting thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="rlloop-end-of-run", daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return wait


def draw_figures(run_dir: Path, figure_writer: ProcessSink | None) -> list[str]:
    """Draw the report's figures (in the figure child when there is one); their names."""
    if figure_writer is not None:
        try:
            figure_writer.close("FINISHED")  # it draws them now, on another core
            names = figure_writer.info.get("figures")
            if isinstance(names, list):
                return [str(name) for name in names]
        except RuntimeError as e:  # e.g. it could not import matplotlib's backend
            _log.warning("report figures: %s; drawing them in this process", e)
    return write_figures(run_dir, read_metrics(run_dir / "metrics.jsonl"))


def drop_stale_video(run_dir: Path) -> None:
    """A stop skipped filming after this sitting saved a new best policy: an earlier
    sitting's video.mp4 shows an older one, so it goes."""
    video = run_dir / "video.mp4"
    if video.is_file() and not video.is_symlink():
        video.unlink()
        _log.warning("removed video.mp4 (it showed an earlier best policy; the stop "
                     "skipped filming): `rlloop eval %s --video %s` films the new one",
                     run_dir, video)


def run_artifacts(run_dir: Path, video: Path | None) -> dict[str, str]:
    """The run's files for its MLflow run (``{path: artifact folder}``): the model
    (``config.yaml`` + ``best/``, what `rlloop.load` reads), the video, the report, its
    figures and data."""
    files = {str(run_dir / n): "report" for n in
             ("report.md", "report.html", "summary.json", "metrics.jsonl")}
    files.update({str(p): "report" for p in sorted(run_dir.glob("*.png"))
                  if not p.is_symlink()})  # a planted link would upload its target
    if video is not None:
        files[str(video)] = ""
    if (run_dir / "best").is_dir():
        files[str(run_dir / "config.yaml")] = "model"
        files[str(run_dir / "best")] = "model/best"
    return files


def stopped_notice(signal_name: str, algo: str, run_dir: Path, checkpoint: Path | None) -> str:
    """What a run stopped by a signal tells its user, in place of MLflow's ``KILLED`` (which
    reads as a crash): what stopped it, and how to continue from the checkpoint it kept."""
    words = f"run stopped by {signal_in_words(signal_name)}"
    if checkpoint is None:
        return f"{words}; no checkpoint was written (nothing trained yet)"
    return (f"{words}; checkpoint saved ({checkpoint.name}): resume with "
            f"`rlloop train {algo} --resume {run_dir}`")
