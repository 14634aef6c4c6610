"""The end-of-run report (matplotlib figures, report.md/html) and ``rlloop plot``, from
real short training runs."""

from __future__ import annotations

import json
import re

import pytest
from matplotlib.image import imread
from small_runs import train_ppo, train_sac

FIGURES = ("learning_curves.png", "losses.png", "diagnostics.png", "throughput.png")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    return {"ppo": train_ppo(base / "ppo"), "ppo_seed1": train_ppo(base / "ppo1", seed=1),
            "sac": train_sac(base / "sac")}


def _assert_png(path, min_bytes=5_000):
    assert path.is_file(), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert path.stat().st_size > min_bytes, path
    image = imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0.01, f"{path} is blank"  # something was drawn on the white


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_report_figures_are_real_images_and_report_md_links_them(runs, algo):
    run = runs[algo]
    for name in FIGURES:
        _assert_png(run / name)
    report = (run / "report.md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert sorted(linked) == sorted(FIGURES)
    html = (run / "report.html").read_text()
    assert all(f"src='{name}'" in html for name in FIGURES)
    assert not (run / "learning_curve.svg").exists()


def test_report_lists_changed_settings_with_defaults_and_rounds_numbers(runs):
    report = (runs["ppo"] / "report.md").read_text()
    section = report.split("## Settings that differ from the defaults")[1].split("##")[0]
    assert "| ppo.lr | 0.003 | 0.001 |" in section
    assert "| ppo.normalize_obs | False | True |" in section
    assert "| total_env_steps | 200000 | 1024 |" in section
    assert "ppo.gamma" not in section and "clip_coef" not in section  # left at defaults
    # The defaults column holds the preset's values: the report says so.
    assert "## Settings that differ from the defaults (the ppo preset for CartPole-v1 " \
           "included)" in report and "| setting | preset / default | this run |" in section
    wall = re.search(r"\| wall_time_s \| ([0-9.e+-]+) \|", report)
    assert wall is not None and len(wall.group(1).replace(".", "").lstrip("0")) <= 4
    phases = report.split("## Env steps per second, by phase")[1]
    assert "| env |" in phases and "| learn |" in phases


def test_sac_diagnostics_come_from_q_statistics(runs):
    from rlloop.runs.report import DIAGNOSTICS, read_metrics

    keys = {k for row in read_metrics(runs["sac"] / "metrics.jsonl") for k in row}
    assert {"q/mean", "alpha/value"} <= keys & set(DIAGNOSTICS)
    # Off-policy runs end on an evaluation: their throughput was left out (null).
    summary = json.loads((runs["sac"] / "summary.json").read_text())
    assert summary["env_steps_per_s"] > 0


def test_plot_outputs_that_would_destroy_a_run_are_refused(runs, tmp_path, cli_in_process):
    """``-o <run>/metrics.jsonl`` wrote a PNG over the run's metrics; a run named twice
    counted as two seeds; an output in a missing directory was a raw FileNotFoundError."""
    before = (runs["ppo"] / "metrics.jsonl").read_bytes()
    for out, match in ((runs["ppo"] / "metrics.jsonl", "would overwrite"),
                       (tmp_path / "nowhere" / "f.png", "does not exist")):
        res = cli_in_process(["plot", str(runs["ppo"]), "-o", str(out)])
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and match in res.stderr
    assert (runs["ppo"] / "metrics.jsonl").read_bytes() == before
    res = cli_in_process(["plot", str(runs["ppo"]), str(runs["ppo"]), "-o",
                          str(tmp_path / "f.png")])
    assert res.returncode == 0 and "1 runs in 1 curves" in res.stdout, res.stderr


def test_plot_overlays_runs_and_groups_seeds(runs, tmp_path, cli_in_process):
    out = tmp_path / "fig.png"
    res = cli_in_process(["plot", str(runs["ppo"]), str(runs["ppo_seed1"]), str(runs["sac"]),
                          "-o", str(out)])
    assert res.returncode == 0, res.stderr
    assert "3 runs in 2 curves" in res.stdout  # the two PPO seeds are one mean curve
    _assert_png(out)
    wall = tmp_path / "wall.png"
    res = cli_in_process(["plot", str(runs["ppo"]), "-o", str(wall), "--x", "wall", "--metric",
                          "episode/return_mean"])
    assert res.returncode == 0, res.stderr
    _assert_png(wall)


def test_plot_of_a_misspelt_metric_names_the_close_ones(runs, tmp_path):
    """``--metric losses/polcy`` said the runs had not logged it *yet*: train them first."""
    from rlloop.cli.plot import plot_runs
    from rlloop.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^the runs never log 'losses/polcy'; did you mean "
                                          r"losses/policy"):
        plot_runs([runs["ppo"]], tmp_path / "f.png", metric="losses/polcy")
    assert not (tmp_path / "f.png").exists()


def test_plot_refuses_a_directory_that_is_not_a_run(tmp_path, cli_in_process):
    res = cli_in_process(["plot", str(tmp_path), "-o", str(tmp_path / "f.png")])
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "not an rlloop run directory" in res.stderr
    assert not (tmp_path / "f.png").exists()


def test_mean_and_band_interpolates_seeds_onto_the_shared_range():
    from rlloop.cli.plot import mean_and_band

    grid, mean, low, high = mean_and_band([[(0, 0.0), (10, 10.0)], [(2, 4.0), (8, 4.0)]],
                                          points=4)
    assert grid.tolist() == [2.0, 4.0, 6.0, 8.0]
    assert mean.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert low.tolist() == [2.0, 4.0, 4.0, 4.0] and high.tolist() == [4.0, 4.0, 6.0, 8.0]


def test_throughput_of_a_resumed_run_counts_every_sitting(tmp_path):
    """A resumed run's clock (time/total_s) starts at 0 again while its steps go on: the
    summary paired the whole run's steps with the last sitting's seconds (2000 / 5 = 400
    env/s here, where the run trained 2000 steps in 15 s). Its phase table, empty when a
    signal stopped the sitting, says why."""
    from rlloop.config.loading import build_config
    from rlloop.runs.report import write_report
    from rlloop.trainers.result import RunResult

    first = [{"step": s, "env/steps": s, "time/total_s": s / 100} for s in range(100, 1001, 100)]
    second = [{"step": s, "env/steps": s, "time/total_s": (s - 1000) / 200}
              for s in range(1200, 2001, 200)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [*first, *second]))
    result = RunResult(tmp_path, 2000, 6.0, None, stopped_by="signal SIGTERM")
    write_report(tmp_path, result, build_config("ppo", "CartPole-v1"), figures=[])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps_per_s"] == pytest.approx(2000 / 15)
    report = (tmp_path / "report.md").read_text()
    assert "## Seconds per phase of the last sitting" in report
    assert "Not recorded: a signal stopped this sitting" in report


def test_figures_of_a_run_with_several_modules_show_each_modules_series():
    """ma_ppo with one module per agent logs ``player_1/losses/policy``, ``episode/
    player_1/return_mean``...: its report had no losses or diagnostics figure and no
    training-return line."""
    from rlloop.runs.report import _module_keys, report_figures

    rows = [{"step": s, "env/steps": s, "player_1/losses/policy": 1.0 / s,
             "player_2/losses/policy": 2.0 / s, "player_1/ppo/approx_kl": 0.01,
             "episode/player_1/return_mean": s / 100, "eval/return_mean": 0.5}
            for s in range(100, 1100, 100)]
    figures = report_figures(rows)
    assert {"losses.png", "diagnostics.png", "learning_curves.png"} <= set(figures)
    assert _module_keys(rows, ("losses/",), prefix=True) == [
        "player_1/losses/policy", "player_2/losses/policy"]


def test_a_one_point_curve_is_drawn_as_a_dot():
    """`rlloop plot` of a run with one evaluation drew a legend entry and no curve."""
    from rlloop.cli.plot import point_marker

    assert point_marker(1) == "o" and point_marker(2) == "" and point_marker(50) == ""


def test_throughput_bars_are_on_a_linear_axis_from_zero():
    """On a log axis that did not start at zero, learn at 11.5k/s looked 25x shorter than
    env at 52k/s (really 4.5x): bar lengths must be proportional to the rates."""
    from rlloop.runs.report import throughput_figure

    rows = [{"step": 1, "env/steps": 52_000.0, "time/env_s": 1.0, "time/learn_s": 52 / 11.5}]
    fig = throughput_figure(rows)
    assert fig is not None
    bars = fig.axes[0]
    assert bars.get_yscale() == "linear"
    assert bars.get_ylim()[0] == 0
    heights = sorted(p.get_height() for p in bars.patches)
    assert heights == pytest.approx([11_500, 52_000])
