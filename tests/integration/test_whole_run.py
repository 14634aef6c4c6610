"""The whole command as a user waits for it: what it imports, and what its MLflow run holds
once it has returned (a real CLI process, a real store read back with MlflowClient)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import rlloop_cmd
from torch.optim.optimizer import register_optimizer_step_pre_hook

from rlloop.learners.adam import Adam

HEAVY = ("torch", "mlflow", "matplotlib")


def test_help_algos_and_bad_input_import_no_torch(tmp_path: Path, cli_env: dict[str, str]) -> None:
    code = f"""
import sys
from rlloop.cli.main import main
codes = [main(["algos"]), main(["train", "nope"]), main(["train", "ppo", "--bogus"]),
         main(["eval", "not-a-run"]), main(["train", "ppo", "--resume", "not-a-run"])]
try:
    main(["--help"])
except SystemExit:
    pass
print(codes, sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[0, 2, 2, 2, 2] []"
    assert "unknown algorithm 'nope'" in out.stderr


def test_training_and_evaluation_import_no_dynamo_and_act_on_one_thread(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    """torch.optim's wrappers import torch._dynamo (~1 s) on first use; rlloop's Adam not."""
    code = """
import sys
from rlloop.config.loading import build_config
from rlloop.runs.start import train
config = build_config("ppo", "CartPole-v1", flags={"total_env_steps": 1024},
                      sets=["mlflow=false", "save_video=false", "progress=false",
                            "stop_on_solve=false"])
train(config, "run")
import torch
from rlloop.runs.saved import evaluate_run
torch.set_num_threads(2)  # torch's default on a 2-core machine
evaluate_run("run", 2)
print(torch.get_num_threads(), "torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # ... and acting uses the run's one thread, as training does (not torch's default)
    assert out.stdout.strip().splitlines()[-1] == "1 False"


def _adam_steps(cls: type[torch.optim.Adam]) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]
    opt = cls(params, lr=1e-2, eps=1e-6, fused=True)
    for _ in range(5):
        opt.zero_grad()
        loss = (params[0].sin().sum() + params[1].pow(2).sum()) ** 2
        loss.backward()
        opt.step()
    state = opt.state_dict()
    again = cls([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-2, eps=1e-6,
                fused=True)
    again.load_state_dict(state)
    return [p.detach() for p in params], again.state_dict()


def test_adam_matches_torch_adam() -> None:
    ours, our_state = _adam_steps(Adam)
    theirs, their_state = _adam_steps(torch.optim.Adam)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    for key in their_state["state"]:
        for name, value in their_state["state"][key].items():
            assert torch.equal(our_state["state"][key][name], value)


def test_adam_runs_its_own_and_global_step_hooks() -> None:
    """Without hooks rlloop's Adam skips torch's step wrapper; with one, the wrapper runs."""
    param = torch.nn.Parameter(torch.ones(3))
    opt = Adam([param], lr=0.1, fused=True)
    calls: list[str] = []
    param.grad = torch.ones(3)
    opt.step()  # no hook registered: nothing to call
    pre = opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    post = opt.register_step_post_hook(lambda *_: calls.append("post"))
    opt.step()
    assert calls == ["pre", "post"]
    pre.remove()
    post.remove()
    handle = register_optimizer_step_pre_hook(lambda *_: calls.append("global"))
    try:
        opt.step()
    finally:
        handle.remove()
    opt.step()
    assert calls == ["pre", "post", "global"]
    assert int(opt.state[param]["step"]) == 4


def test_adam_takes_torch_s_wrapper_where_torch_keeps_its_hooks_elsewhere(monkeypatch) -> None:
    import torch.optim.optimizer as torch_optimizer

    from rlloop.learners import adam

    opt = Adam([torch.nn.Parameter(torch.ones(1))], lr=0.1, fused=True)
    assert not adam._step_hooks(opt)
    monkeypatch.delattr(torch_optimizer, "_global_optimizer_pre_hooks")
    assert adam._step_hooks(opt)


def _in_git_repo(directory: Path) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(directory)], check=True)
    (directory / "train.txt").write_text("rlloop train ppo\n")
    subprocess.run([*git, "-C", str(directory), "add", "."], check=True)
    subprocess.run([*git, "-C", str(directory), "commit", "-qm", "x"], check=True)
    return subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_default_run_mlflow_store_is_complete_when_the_command_returns(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    from mlflow.tracking import MlflowClient

    commit = _in_git_repo(tmp_path)
    run = tmp_path / "run"
    out = subprocess.run(rlloop_cmd("train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run),
                                    "--seed", "5", "--total-env-steps", "2048", "--set",
                                    "stop_on_solve=false"),
                         env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED"

    # Every metric row, at its step; the phase times among them.
    keys = {k for r in rows for k in r if k != "step"}
    assert {"time/startup_s", "time/evals_s", "time/checkpoints_s", "time/logging_s",
            "time/video_s", "time/report_s", "time/run_s"} <= keys
    for key in keys:
        logged = {(m.step, m.value) for m in client.get_metric_history(run_id, key)}
        wanted = {(r["step"], float(r[key])) for r in rows
                  if key in r and math.isfinite(float(r[key]))}
        assert wanted <= logged, key
    # Params and tags.
    params = json.loads((run / "metrics.params.json").read_text())
    assert {k: str(v) for k, v in params.items()}.items() <= mlrun.data.params.items()
    tags = mlrun.data.tags
    assert (tags["algo"], tags["env"], tags["seed"]) == ("ppo", "CartPole-v1", "5")
    assert tags["rlloop_version"] and tags["mlflow.source.git.commit"] == commit

    # Artifacts: video, report and figures, and a model rlloop.load reads.
    def listing(path: str = "") -> set[str]:
        found = set()
        for info in client.list_artifacts(run_id, path):
            found |= listing(info.path) if info.is_dir else {info.path}
        return found

    names = listing()
    assert {"video.mp4", "report/report.md", "report/report.html", "report/learning_curves.png",
            "model/config.yaml", "model/best/manifest.json"} <= names
    # Every artifact location of the store lies inside the run's own directory.
    for exp in client.search_experiments():
        assert exp.artifact_location.startswith(run.resolve().as_uri()), exp
    assert mlrun.info.artifact_uri.startswith(run.resolve().as_uri())

    from rlloop import load

    model_dir = client.download_artifacts(run_id, "model", str(tmp_path / "download"))
    action = load(model_dir).predict(np.zeros(4, np.float32))
    assert int(action) in (0, 1)
    assert "| startup |" in (run / "report.md").read_text()


def test_cli_wall_benchmark_quick_mode_runs(tmp_path: Path, cli_env: dict[str, str]) -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cli_wall.py"
    out = subprocess.run([sys.executable, str(script), "--quick", "--workdir", str(tmp_path)],
                         env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "import torch" in out.stdout and "rlloop train" in out.stdout
