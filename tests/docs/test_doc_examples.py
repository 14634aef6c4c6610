"""Every example in the docs and the README runs: a page that is wrong fails here.

A page's ```python blocks run in order in one namespace in a temporary directory, with
each run's budget capped by the test (``Model.learn`` and ``train`` patched), never by
the examples. Each ``rlloop`` line of its ```bash / ```console blocks runs through the
CLI's ``main`` in that directory, with ``--total-env-steps`` capped and MLflow and video
off; a ```console block's output lines must be what the command prints. Run directories a
line only names (``rlloop eval runs/X``) are a small trained run copied there.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from doc_blocks import ROOT, Command, file_blocks, pages, python_blocks, shell_commands

from rlloop import api
from rlloop.cli.main import main
from rlloop.runs import collect, start

CAP = 512  # env steps: an iteration or two, enough to leave a checkpoint
OFF_POLICY_CAP = 256  # off-policy runs optimise on every step: their steps cost more
OFFLINE_CAP = 16  # gradient updates of an offline run (bc, cql, iql), and its one eval
COLLECT_CAP = 2  # episodes `rlloop collect` records
QUIET_RUN = ["--set", "mlflow=false", "--set", "save_video=false", "--quiet"]
# Lines that cannot run on a test machine, and why (the rest of the page still runs).
NOT_HERE = {
    "--ray-address": "needs a running Ray cluster",
    "num_env_runners": "starts Ray: tested in tests/runners",
    "num_learners": "starts learner processes: tested in tests/learners",
    "LunarLander": "needs Box2D",
}

PY_PAGES = [p for p in pages() if python_blocks(p)]
SHELL_PAGES = [p for p in pages() if shell_commands(p)]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def capped_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run a page's Python starts trains at most CAP env steps (an offline model's
    OFFLINE_CAP gradient updates), with no MLflow store and no video, and records at most
    COLLECT_CAP episodes (the examples keep the budgets a user would write)."""
    real_train, real_learn = start.train, api.Model.learn
    real_offline_learn, real_collect = api.OfflineModel.learn, collect.collect

    def train(config: Any, run_dir: Any = None, **kwargs: Any) -> Any:
        config = dataclasses.replace(config, total_env_steps=min(config.total_env_steps, CAP),
                                     mlflow=False, save_video=False, progress=False)
        return real_train(config, run_dir, **kwargs)

    def learn(self: api.Model, total_env_steps: Any = None, *args: Any, **kwargs: Any) -> Any:
        return real_learn(self, min(int(total_env_steps), CAP), *args, **kwargs)

    def offline_learn(self: api.OfflineModel, total_gradient_steps: Any = None, *args: Any,
                      **kwargs: Any) -> Any:
        hparams = dataclasses.replace(self.config.hparams, eval_interval=OFFLINE_CAP)
        self.config = dataclasses.replace(self.config, hparams=hparams, eval_episodes=2)
        return real_offline_learn(self, min(int(total_gradient_steps), OFFLINE_CAP), *args,
                                  **kwargs)

    def capped_collect(run_dir: Any, episodes: int, *args: Any, **kwargs: Any) -> Any:
        return real_collect(run_dir, min(episodes, COLLECT_CAP), *args, **kwargs)

    monkeypatch.setattr(start, "train", train)
    monkeypatch.setattr(api, "train", train)
    monkeypatch.setattr(api.Model, "learn", learn)
    monkeypatch.setattr(api.OfflineModel, "learn", offline_learn)
    monkeypatch.setattr(collect, "collect", capped_collect)


def test_the_docs_have_examples() -> None:
    """The collector finds the pages' examples (a renamed label would silently drop them)."""
    n_python = sum(len(python_blocks(p)) for p in PY_PAGES)
    n_shell = sum(len(shell_commands(p)) for p in SHELL_PAGES)
    assert n_python >= 5 and n_shell >= 20, (n_python, n_shell)


@pytest.mark.parametrize("page", PY_PAGES, ids=_id)
def test_python_examples_run(page: Path, in_tmp: Path, capped_api: None) -> None:
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for block in python_blocks(page):
        code = compile(block.text, block.where, "exec")
        exec(code, namespace)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained run for the lines that only name one (``rlloop eval runs/X``)."""
    run = tmp_path_factory.mktemp("docs-run") / "run"
    code = main(["train", "ppo", "--env", "CartPole-v1", "--total-env-steps", str(CAP),
                 "--run-dir", str(run), *QUIET_RUN])
    assert code == 0
    return run


@pytest.fixture(scope="module")
def small_pendulum_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """A small trained Pendulum-v1 run (continuous actions) for the lines that name one
    (``rlloop collect runs/pendulum-sac``), made when the first such line runs."""
    made: list[Path] = []

    def run() -> Path:
        if not made:
            made.append(tmp_path_factory.mktemp("docs-run") / "run")
            assert main(["train", "ppo", "--env", "Pendulum-v1", "--total-env-steps",
                         str(CAP), "--run-dir", str(made[0]), *QUIET_RUN]) == 0
        return made[0]

    return run


@pytest.mark.slow  # about two minutes over all pages on two cores
@pytest.mark.parametrize("page", SHELL_PAGES, ids=_id)
def test_shell_examples_run(page: Path, in_tmp: Path, small_run: Path,
                            small_pendulum_run: Callable[[], Path],
                            capsys: pytest.CaptureFixture[str]) -> None:
    for block in file_blocks(page):
        assert block.file_name is not None
        (in_tmp / block.file_name).write_text(block.text, encoding="utf-8")
    for command in shell_commands(page):
        argv = _runnable(command.argv)
        if argv is None:
            continue
        for run_dir in _named_runs(argv):
            if not run_dir.exists():
                pendulum = "pendulum" in run_dir.name.lower()
                shutil.copytree(small_pendulum_run() if pendulum else small_run, run_dir)
        argv, out_file = _redirect(argv)
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
        if out_file is not None:
            Path(out_file).write_text(out, encoding="utf-8")
        _check(command, code, out + err)


def _runnable(argv: list[str]) -> list[str] | None:
    """The line as the test runs it (budgets capped, no MLflow or video, the CPU when
    the device it names is absent), or None where it cannot run here."""
    line = " ".join(argv)
    if argv[0] in ("train", "tune") and any(key in line for key in NOT_HERE):
        return None
    argv = list(argv)
    if "--device" in argv:
        i = argv.index("--device") + 1
        if (argv[i].startswith("cuda") and not torch.cuda.is_available()) or argv[i] == "mps":
            argv[i] = "cpu"
    if argv[0] == "train":
        budget = OFF_POLICY_CAP if argv[1] in ("dqn", "sac", "td3") else CAP
        budget = 2 * CAP if "--resume" in argv else budget  # a resume's is the total
        argv = [*_capped(argv, "--total-env-steps", budget), *QUIET_RUN]
        if argv[1] in ("bc", "cql", "iql"):  # offline: a budget of gradient updates
            steps = 2 * OFFLINE_CAP if "--resume" in argv else OFFLINE_CAP
            argv += ["--set", f"{argv[1]}.total_gradient_steps={steps}",
                     "--set", f"{argv[1]}.eval_interval={OFFLINE_CAP}",
                     "--set", "eval_episodes=2"]
    elif argv[0] == "collect":
        argv = _capped(argv, "--episodes", COLLECT_CAP)
    elif argv[0] == "tune":
        more = "--resume" in argv and "--trials" in argv
        argv = _capped(argv, "--trials", 2 if more else 1, add="--resume" not in argv)
        argv = _capped(argv, "--jobs", 1, add=False)
        if "--resume" not in argv:
            argv = [*_capped(argv, "--total-env-steps", CAP), "--startup-trials", "1"]
    return argv


def _capped(argv: list[str], flag: str, cap: int, add: bool = True) -> list[str]:
    if flag in argv:
        i = argv.index(flag) + 1
        return [*argv[:i], str(min(int(float(argv[i])), cap)), *argv[i + 1:]]
    return [*argv, flag, str(cap)] if add else argv


def _named_runs(argv: list[str]) -> Iterator[Path]:
    """Run directories the line reads but no earlier line made."""
    if argv[0] in ("eval", "export", "collect"):
        yield Path(argv[1])
    elif argv[0] == "plot":
        for arg in argv[1:]:
            if arg.startswith("-"):
                break
            yield Path(arg)
    elif argv[0] == "train" and "--resume" in argv:
        yield Path(argv[argv.index("--resume") + 1])


def _redirect(argv: list[str]) -> tuple[list[str], str | None]:
    if ">" in argv:
        i = argv.index(">")
        return argv[:i], argv[i + 1]
    return argv, None


def _check(command: Command, code: int, output: str) -> None:
    if not command.expected:
        assert code == 0, f"{command.where}: rlloop {' '.join(command.argv)}\n{output}"
        return
    for line in command.expected:
        shown = line.split("...")[0].rstrip()  # "..." elides the rest of a long line
        assert shown in output, f"{command.where}: the page shows {shown!r}, rlloop " \
                                f"printed:\n{output}"
