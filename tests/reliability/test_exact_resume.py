"""Exact resume from the CLI: N steps straight == N/2, stop, new process, resume to N.

Every value of the final checkpoints must be identical: parameters, optimiser moments,
RNG states (the global NumPy and Python ones too, which a user's env may draw from),
env state, runner state, normaliser statistics and the eval counters. Native envs save
their full state, so the cut may fall anywhere inside an episode.

The straight run is quiet; the cut run and its resume keep the defaults a user keeps on
(progress line, MLflow, the end-of-run video and evaluation), so nothing those do may
touch the state a resume continues from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import leaves, rlloop_cmd, same_leaf

from rlloop.algorithms import base
from rlloop.algorithms.base import AlgorithmBase
from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.algorithms.ppo import PPO
from rlloop.checkpoint import CheckpointManager, load_checkpoint, save_replacing
from rlloop.config.loading import build_config
from rlloop.config.run_config import RunConfig
from rlloop.runs import session as run_module
from rlloop.runs.saved import saved_best_return
from rlloop.runs.start import resume, train
from rlloop.system import signals
from rlloop.system.signals import StopInterrupted
from rlloop.trainers.callbacks import Callback

CASES = {
    "ppo": ["CartPole-v1", "4096"],
    # The preset's 8 envs x 5 steps: 100 updates, the RMSprop averages in the checkpoint.
    "a2c": ["CartPole-v1", "4000", "--set", "eval_every=25"],
    # Off-policy: the replay buffer, target networks, optimisers (SAC's alpha too), the
    # epsilon position and the cadence counters are all in the checkpoint. Gymnasium's
    # Pendulum saves its physics (unwrapped.state), so the cut may fall mid-episode.
    "dqn": ["CartPole-v1", "4096"],
    # QR-DQN: DQN's machinery with a quantile head; small, as DQN's case covers the rest.
    "qrdqn": ["CartPole-v1", "2048", "--set", "qrdqn.n_quantiles=25", "--set",
              "qrdqn.hidden=[64,64]"],
    "sac": ["Pendulum-v1", "800", "--set", "sac.hidden=[64,64]"],
    # TQC: SAC's machinery with quantile critics, small as SAC's case.
    "tqc": ["Pendulum-v1", "400", "--set", "tqc.hidden=[64,64]", "--set",
            "tqc.n_quantiles=8", "--set", "tqc.batch_size=64"],
    # CrossQ: the running statistics of every batch renormalisation; the actor's switch to
    # renormalisation (pass 31, an update count the learner derives) falls after the cut.
    "crossq": ["Pendulum-v1", "200", "--set", "crossq.hidden=[32,32]", "--set",
               "crossq.critic_hidden=[32,32]", "--set", "crossq.batch_size=64", "--set",
               "crossq.learning_starts=50", "--set", "crossq.renorm_warmup_steps=30"],
    "td3": ["Pendulum-v1", "800", "--set", "td3.learning_starts=100", "--set",
            "td3.hidden=[64,64]", "--set", "td3.eval_interval=200"],
}
QUIET = ["--quiet", "--set", "mlflow=false", "--set", "save_video=false"]


def _train(args, cwd, env):
    out = subprocess.run(rlloop_cmd("train", *args), cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def _evals(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/return_mean"] for r in rows if "eval/return_mean" in r}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_resume_is_bit_exact(tmp_path, cli_env, cli_in_process, algo):
    env_id, steps, *extra = CASES[algo]
    half = str(int(steps) // 2)
    common = [algo, "--env", env_id, "--seed", "7", "--set", "stop_on_solve=false", *extra]
    # The straight run in this process (its torch threads are the run's setting, as in a
    # new one); the cut run and its resume each in a process of their own.
    straight = cli_in_process(["train", *common, *QUIET, "--total-env-steps", steps,
                               "--run-dir", str(tmp_path / "a")])
    assert straight.returncode == 0, straight.stderr
    _train([*common, "--total-env-steps", half, "--run-dir", "b"], tmp_path, cli_env)
    _train([algo, "--resume", "b", "--total-env-steps", steps], tmp_path, cli_env)

    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert a.components["trainer"]["counters"] == b.components["trainer"]["counters"]
    assert a.components["trainer"]["counters"]["env/steps"] == int(steps)
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys()
    assert sum(isinstance(v, torch.Tensor) for v in la.values()) > 10
    different = [k for k in la if not same_leaf(la[k], lb[k])]
    assert not different, different
    # Evaluations after the cut see the same policy with the same eval seeds.
    ea, eb = _evals(tmp_path / "a"), _evals(tmp_path / "b")
    assert ea and all(eb[step] == value for step, value in ea.items()), (ea, eb)


def _crashed_copy(run, dest, last_step):
    """``run`` as a crash right after its checkpoint at ``last_step`` would have left it:
    later checkpoints gone, ``best/`` and the metrics rows logged since still there."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(".lock"))
    for path in CheckpointManager(dest / "checkpoints").all():
        if int(path.name) > last_step:
            shutil.rmtree(path)
    return dest


def test_resume_after_a_crash_past_a_periodic_checkpoint(tmp_path):
    """A periodic checkpoint on an eval iteration used to be taken before that eval, so a
    resume from it evaluated on other episodes from then on; the resumed run also took its
    best return from the checkpoint, not from ``best/``, and replaced a better policy
    found after the checkpoint; and metrics.jsonl got the re-run steps twice."""
    sets = ["mlflow=false", "progress=false", "save_video=false", "num_envs=4",
            "ppo.rollout_steps=32", "ppo.minibatch_size=64", "eval_every=2",
            "checkpoint_every=2", "eval_episodes=3",
            "stop_on_solve=false", "keep_checkpoints=10"]
    config = build_config("ppo", "CartPole-v1", flags={"seed": 3, "total_env_steps": 1280},
                          sets=sets)
    train(config, tmp_path / "a")
    cut = 512  # iteration 4 of 10: checkpointed and evaluated

    b = _crashed_copy(tmp_path / "a", tmp_path / "b", cut)
    resume(b)
    ea, eb = _evals(tmp_path / "a"), _evals(b)
    assert any(step > cut for step in ea) and eb == ea
    steps = [json.loads(line)["step"] for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # no step logged twice over

    # best/ holds a policy better than any evaluation the resumed run will make.
    c = _crashed_copy(tmp_path / "a", tmp_path / "c", cut)
    best = load_checkpoint(c / "best")
    best.components["trainer"]["best_eval_return"] = 1e9
    save_replacing(c / "best", best.components, metadata=best.metadata)
    assert resume(c).best_eval_return == 1e9
    assert saved_best_return(c / "best") == 1e9


# A cut where an eval is due: (the method a second stop signal strikes in, its call that
# makes the evaluated update, sets, steps). PPO evaluates every 2nd update (the 4th: 512
# env steps); DQN every 40th optimisation step (the 80th), its record every 20th, a save
# every 40th. Either way the cut iteration's eval is the run's 2nd; the "-end" cases cut
# the budget's last iteration (the resume trains nothing, but owes the eval). Each cut
# below returns how the cut run ends (a context) and the callbacks it trains with.
PPO_SETS = ["num_envs=4", "ppo.rollout_steps=32", "ppo.minibatch_size=64", "eval_every=2",
            "eval_episodes=3"]
DQN_SETS = ["num_envs=4", "dqn.learning_starts=200", "dqn.opt_interval=4",
            "dqn.gradient_steps=1", "dqn.hidden=[64,64]", "dqn.eval_interval=40",
            "dqn.record_interval=20", "dqn.save_interval=40", "eval_episodes=3"]
CUTS = {
    "ppo": (PPO, "update", 4, PPO_SETS, 1280),
    "ppo-end": (PPO, "update", 4, PPO_SETS, 512),
    "dqn": (OffPolicyAlgorithmBase, "optimize", 80, DQN_SETS, 1600),
    "dqn-end": (OffPolicyAlgorithmBase, "optimize", 80, [*DQN_SETS, "dqn.max_opts=80"], 1600),
}


#: A solve stops the run once 5 fresh episodes confirm it (threshold 175 unless overridden).
SOLVE_SETS = ["stop_on_solve=true", "solve_threshold=175", "solve_episodes=5"]


def _two_sigterms():
    """The first SIGTERM asks for a stop at the next boundary; the second interrupts at
    once, or where the update in progress ends (an ``atomic`` block)."""
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)


def _config(algo="ppo", *, steps=None, seed=5, sets=()):
    """A quiet CartPole run of ``algo`` with its cut-test settings (``CUTS``'s), no stop
    on solve unless ``sets`` say otherwise; ``steps`` defaults to the ``CUTS`` budget."""
    own_steps, own_sets = (1280, PPO_SETS) if algo == "ppo" else (1600, DQN_SETS)
    return build_config(algo, "CartPole-v1",
                        flags={"seed": seed, "total_env_steps": steps or own_steps},
                        sets=["mlflow=false", "progress=false", "save_video=false",
                              "stop_on_solve=false", *own_sets, *sets])


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """``straight_run(config)``: the run dir of an uncut run of ``config``, trained once per
    module (per test worker) and only read after: a run's evaluations, rows and final
    state depend on its config alone, which is what the cut runs are compared with."""
    runs: dict[str, Path] = {}

    def run(config: RunConfig) -> Path:
        key = repr(config)
        if key not in runs:
            runs[key] = tmp_path_factory.mktemp("straight") / "a"
            train(config, runs[key])
        return runs[key]

    return run


def _two_signals_in_update(monkeypatch, owner, method, cut):
    """A second SIGTERM inside the update that an eval follows: it interrupts where the
    update ends (KeyboardInterrupt), after the counters moved and before the eval."""
    original, made = getattr(owner, method), []

    def update_then_two_signals(self, env_steps):
        out = original(self, env_steps)
        made.append(out is not None)  # (a skipped optimisation step returns None)
        if sum(made) == cut and out is not None:
            _two_sigterms()  # the second interrupts where the update ends
        return out

    monkeypatch.setattr(owner, method, update_then_two_signals)
    return pytest.raises(KeyboardInterrupt), []


def _stop_while_eval_workers_start(monkeypatch, owner, method, cut):
    """A SIGTERM while the 2nd eval's env workers start: the wait gives up
    (``StopInterrupted``, as the gymnasium-async backend raises it) and the run stops as
    at a boundary."""
    evaluations = []

    def eval_gives_up(self, episodes, env_config=None, deterministic=True):
        evaluations.append(episodes)
        if len(evaluations) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            raise StopInterrupted("CartPole-v1: gave up waiting for reset (test)")
        return original(self, episodes, env_config, deterministic)

    original = AlgorithmBase.evaluate
    monkeypatch.setattr(AlgorithmBase, "evaluate", eval_gives_up)
    return contextlib.nullcontext(), []


def _second_signal_during_eval(monkeypatch, owner, method, cut):
    """A second SIGTERM while the 2nd eval plays its episodes: it interrupts at once. The
    eval count (it seeds the eval's episodes) was advanced before the episodes, so the
    resumed run's eval used the next seed."""
    evaluations = []

    def interrupted_episodes(*args, **kwargs):
        evaluations.append(kwargs["seed"])
        if len(evaluations) == 2:
            _two_sigterms()
        return original(*args, **kwargs)

    original = base.evaluate
    monkeypatch.setattr(base, "evaluate", interrupted_episodes)
    return pytest.raises(KeyboardInterrupt), []


def _stop_outlasting_an_eval(monkeypatch, owner, method, cut):
    """One SIGTERM as the 2nd eval starts, which then goes on longer than the stop's grace
    (here 0 s): the eval is left (a long one would outlast a scheduler's grace period)
    and the run stops as at a boundary, owing it."""
    evaluations = []

    def signal_then_episodes(*args, **kwargs):
        evaluations.append(kwargs["seed"])
        if len(evaluations) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    original = base.evaluate
    monkeypatch.setattr(base, "evaluate", signal_then_episodes)
    monkeypatch.setattr(signals, "EVAL_STOP_GRACE_S", 0.0)
    return contextlib.nullcontext(), []


class _SecondSignalInOnEval(Callback):
    """A second SIGTERM while the 2nd eval's callbacks run (where best/ is written and a
    solve confirmed): the eval is made, its callbacks and its row are not."""

    def __init__(self) -> None:
        self.evals = 0

    def on_eval(self, stats):
        self.evals += 1
        if self.evals == 2:
            _two_sigterms()


def _second_signal_in_on_eval(monkeypatch, owner, method, cut):
    return pytest.raises(KeyboardInterrupt), [_SecondSignalInOnEval()]


@pytest.mark.parametrize("cut_by", [_two_signals_in_update, _stop_while_eval_workers_start,
                                    _second_signal_during_eval, _second_signal_in_on_eval,
                                    _stop_outlasting_an_eval],
                         ids=["second-signal", "eval-gives-up", "signal-in-eval",
                              "signal-in-on-eval", "stop-outlasts-eval"])
@pytest.mark.parametrize("case", sorted(CUTS))
def test_a_run_cut_before_its_due_evaluation_makes_it_when_resumed(
        tmp_path, straight_run, monkeypatch, case, cut_by):
    """A cut between an update and the eval due after it (off-policy: the eval, record and
    save) left a checkpoint holding the update without the eval; the resumed run skipped
    it, so every later eval ran on other episodes than a straight run's. The checkpoint
    now owes the eval and the resume makes it first: the same evaluations and the same
    final state as a straight run."""
    owner, method, cut, sets, steps = CUTS[case]
    algo = case.split("-")[0]
    config = _config(algo, steps=steps, sets=sets)
    a = straight_run(config)

    with monkeypatch.context() as patched:
        ends, callbacks = cut_by(patched, owner, method, cut)
        with ends:
            train(config, tmp_path / "b", callbacks=callbacks)
    cut_at = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert cut_at.components["trainer"]["counters"]["algorithm/steps"] == cut
    assert _eval_pending(cut_at)  # derived from the counters, not stored as a debt
    assert not set(cut_at.components["trainer"]) & {"eval_owed", "eval_unheard", "cadence_at",
                                                     "cadence_due"}
    resume(tmp_path / "b")

    _same_evaluations_and_state(a, tmp_path / "b")


def _eval_pending(checkpoint):
    """Whether ``checkpoint`` holds an update without the eval its cadence calls for after
    it (the trainer derives it so from the counters)."""
    trainer = checkpoint.components["trainer"]
    steps = trainer["counters"]["algorithm/steps"]
    every = trainer.get("steps_per_eval") or trainer["eval_interval"]
    return steps % every == 0 and trainer["evaluated_at"] != steps


def _rows(run, key):
    """``(step, keys)`` of the rows of metrics.jsonl that hold ``key``, in order (rates and
    times left out: they differ between any two runs)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    varying = ("time/", "env/fps", "opt/steps_per_sec")
    return [(r["step"], sorted(k for k in r if not k.startswith(varying)))
            for r in rows if key in r]


def _same_evaluations_and_state(a, b):
    """Run ``b`` (cut, resumed) has ``a``'s evaluations, each row once (off-policy records
    with the same stats), and its final algorithm state."""
    ea, eb = _evals(a), _evals(b)
    assert len(ea) >= 2 and eb == ea
    for key in ("eval/return_mean", "opt/steps"):
        assert _rows(b, key) == _rows(a, key)
    ca = load_checkpoint(CheckpointManager(a / "checkpoints").latest())
    cb = load_checkpoint(CheckpointManager(b / "checkpoints").latest())
    la, lb = dict(leaves(ca.components["algorithm"])), dict(leaves(cb.components["algorithm"]))
    assert [k for k in la if not same_leaf(la[k], lb[k])] == []


def test_a_second_signal_while_a_solve_is_confirmed_keeps_later_evaluations(
        tmp_path, monkeypatch):
    """The confirming evaluation of a solve (stop_on_solve) runs inside the evaluation's
    callbacks: a second signal in it left that evaluation made but not heard, and a
    resume replays its callbacks, confirming on the same episodes; its evaluations are a
    straight run's, and it stops solved as that one does."""
    config = _config(seed=1, sets=SOLVE_SETS)
    assert train(config, tmp_path / "a").stopped_by == "solved"

    def signals_in_confirmation(*args, **kwargs):
        if args[2] == 5:  # the confirming evaluation's 5 episodes
            _two_sigterms()
        return original(*args, **kwargs)

    original = base.evaluate
    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(base, "evaluate", signals_in_confirmation)
        train(config, tmp_path / "b")
    assert resume(tmp_path / "b").stopped_by == "solved"
    assert _evals(tmp_path / "b") == _evals(tmp_path / "a")


def test_an_update_that_fails_after_an_evaluation_owes_no_evaluation(tmp_path, monkeypatch):
    """An update that raises (out of memory, a custom network's error) moves the collect
    counters but not the update count, which the last evaluation was made at: the final
    checkpoint owes nothing, and the resumed run evaluates at its own cadence only."""
    config = _config(steps=768)
    original, updates = PPO.update, []

    def fails_third(self, env_steps):
        updates.append(env_steps)
        if len(updates) == 3:
            raise RuntimeError("out of memory (test)")
        return original(self, env_steps)

    with monkeypatch.context() as patched, pytest.raises(RuntimeError, match="test"):
        patched.setattr(PPO, "update", fails_third)
        train(config, tmp_path / "b")
    cut = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert cut.components["trainer"]["counters"]["algorithm/steps"] == 2
    assert not _eval_pending(cut)
    resume(tmp_path / "b")
    evaluated = sorted(_evals(tmp_path / "b"))
    assert evaluated[0] == 256 and 384 not in evaluated, evaluated


def test_a_second_signal_while_best_is_saved_leaves_the_save_to_the_resume(
        tmp_path, straight_run, monkeypatch):
    """The run's best return was raised before best/ was written: a second signal in the
    write left the old policy in best/ under a final checkpoint that counted the new best,
    so the resume's replay of the evaluation saw nothing better and never wrote it."""
    config = _config(steps=512)
    a = straight_run(config)  # evaluations 175.7 at 256, 262.0 at 512: each the best
    saves = []

    def signals_in_second_save(*args, **kwargs):
        saves.append(args[0])
        if len(saves) == 2:
            _two_sigterms()
        return original(*args, **kwargs)

    original = run_module.save_replacing
    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(run_module, "save_replacing", signals_in_second_save)
        train(config, tmp_path / "b")
    assert saves == [tmp_path / "b" / "best"] * 2
    resume(tmp_path / "b")
    assert saved_best_return(tmp_path / "b" / "best") == saved_best_return(a / "best")
    best_a, best_b = load_checkpoint(a / "best"), load_checkpoint(tmp_path / "b" / "best")
    la = dict(leaves(best_a.components["algorithm"]))
    lb = dict(leaves(best_b.components["algorithm"]))
    assert [k for k in la if not same_leaf(la[k], lb[k])] == []


def test_a_cut_before_the_first_update_owes_no_evaluation(tmp_path, straight_run, monkeypatch):
    """The eval count of a new trainer stood at -1, so a checkpoint cut before the first
    update (a second signal in the first collect, an env worker failing there) owed an
    eval at step 0, which the resume made: every later eval on other episodes."""
    config = _config()
    a = straight_run(config)
    original = PPO.collect

    def interrupted(self):
        _two_sigterms()
        return original(self)

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(PPO, "collect", interrupted)
        train(config, tmp_path / "b")
    cut = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert not _eval_pending(cut)
    resume(tmp_path / "b")
    _same_evaluations_and_state(a, tmp_path / "b")


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_evaluation_made_again_is_checkpointed_when_the_resume_stops_there(
        tmp_path, straight_run, monkeypatch, algo):
    """A resume that made the cut eval and then stopped (one signal during that eval)
    wrote no checkpoint, as no env step was taken: the next resume made and logged the
    eval again. The final checkpoint now holds that eval made."""
    config = _config(algo)
    owner, method, cut, *_ = CUTS[algo]
    a = straight_run(config)
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(config, tmp_path / "b")

    def signal_once(*args, **kwargs):
        patched.setattr(base, "evaluate", original)
        os.kill(os.getpid(), signal.SIGTERM)  # one stop while the owed eval plays
        return original(*args, **kwargs)

    original = base.evaluate
    with monkeypatch.context() as patched:
        patched.setattr(base, "evaluate", signal_once)
        assert resume(tmp_path / "b").stopped_by == "signal SIGTERM"
    stopped = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert stopped.components["trainer"]["counters"]["algorithm/steps"] == cut
    assert not _eval_pending(stopped)
    resume(tmp_path / "b")
    _same_evaluations_and_state(a, tmp_path / "b")



class _Heard(Callback):
    """What a user's callback hears (``("step"|"eval", env steps)``); ``cut_at``: a second
    signal in its on_eval of that evaluation (counted from 1)."""

    def __init__(self, cut_at: int | None = None) -> None:
        self.heard: list[tuple[str, int]] = []
        self.evals, self.cut_at = 0, cut_at

    def on_step(self, stats):
        self.heard.append(("step", int(stats["env/steps"])))

    def on_eval(self, stats):
        self.evals += 1
        self.heard.append(("eval", int(stats.get("env/steps", -1))))
        if self.evals == self.cut_at:
            _two_sigterms()


def test_a_cut_in_a_callback_after_a_confirmed_solve_stops_solved_on_resume(tmp_path):
    """The solve was confirmed (an extra evaluation) in the run's own on_eval, then a
    second signal struck in a user's on_eval: the resume replayed every callback,
    confirmed again on other episodes (and failed, training on). It now makes the
    evaluation again on its episodes and stops solved, its rows each logged once."""
    config = _config(sets=[*SOLVE_SETS, "solve_threshold=170"])
    assert train(config, tmp_path / "a").stopped_by == "solved"
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "b", callbacks=[_Heard(cut_at=1)])
    assert resume(tmp_path / "b").stopped_by == "solved"
    for key in ("eval/return_mean", "eval/solve_return_mean"):
        assert _rows(tmp_path / "b", key) == _rows(tmp_path / "a", key)


def test_a_cut_off_policy_step_keeps_the_cut_run_s_cadence(tmp_path, monkeypatch):
    """Resumed with another eval_interval, the cut step's eval was judged by the new one
    (80 % 30): the eval cut from it was never made, and every later one moved."""
    owner, method, cut, *_ = CUTS["dqn"]
    clean = _config("dqn", sets=[f"dqn.max_opts={cut}"])
    train(clean, tmp_path / "a")  # stops cleanly after the cut step, its eval made
    resume(tmp_path / "a", sets=["dqn.max_opts=0", "dqn.eval_interval=30"])
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(_config("dqn"), tmp_path / "b")
    resume(tmp_path / "b", sets=["dqn.eval_interval=30"])
    _same_evaluations_and_state(tmp_path / "a", tmp_path / "b")


def test_an_evaluation_that_fails_is_made_again_on_the_next_episodes(tmp_path, monkeypatch):
    """An evaluation that raised (an env failing on its episodes) was left for the resume,
    which made it first on the same episodes, failing again before training a step. A
    failed evaluation is counted: the resume makes it again on the next episodes and goes
    on (an error is not forgone: a full disk in best/'s save must be redone)."""
    seeds = []
    original = base.evaluate

    def fails_on_the_second(*args, **kwargs):
        seeds.append(kwargs["seed"])
        if kwargs["seed"] == seeds[0] + 1:
            raise RuntimeError("env: simulation unstable (test)")
        return original(*args, **kwargs)

    monkeypatch.setattr(base, "evaluate", fails_on_the_second)
    with pytest.raises(RuntimeError, match="unstable"):
        train(_config(), tmp_path / "b")
    cut = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert _eval_pending(cut)
    assert resume(tmp_path / "b").env_steps == 1280
    assert seeds[2] == seeds[1] + 1 and 512 in _evals(tmp_path / "b")


def test_a_cut_iteration_at_the_budget_s_end_ends_for_the_callbacks(tmp_path, monkeypatch):
    """With the budget spent, the resume made the cut iteration's eval but called no
    on_step: a user's callback never heard that iteration end (with budget left, it did)."""
    owner, method, cut, _, steps = CUTS["ppo-end"]
    config = _config(steps=steps)
    straight, cut_run, resumed = _Heard(), _Heard(), _Heard()
    train(config, tmp_path / "a", callbacks=[straight])
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(config, tmp_path / "b", callbacks=[cut_run])
    resume(tmp_path / "b", callbacks=[resumed])
    assert cut_run.heard + resumed.heard == straight.heard


def test_an_error_after_a_stop_signal_is_taken_for_the_stop(tmp_path, straight_run, monkeypatch):
    """A stop signal that surfaces as an error (Box2D turns the interrupt into one of its
    own; workers killed with the trainer fail) is a stop: the evaluation it cut is not
    counted, and the resumed run makes it on the same episodes."""
    config = _config()
    a = straight_run(config)
    seeds = []
    original = base.evaluate

    def stopped_then_failed(*args, **kwargs):
        seeds.append(kwargs["seed"])
        if len(seeds) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("Box2D: interrupted (test)")
        return original(*args, **kwargs)

    with monkeypatch.context() as patched, pytest.raises(RuntimeError, match="Box2D"):
        patched.setattr(base, "evaluate", stopped_then_failed)
        train(config, tmp_path / "b")
    resume(tmp_path / "b")
    _same_evaluations_and_state(a, tmp_path / "b")



def test_a_user_callback_hears_an_evaluation_cut_in_the_callbacks_again(tmp_path):
    """At least once: a cut in the second callback's on_eval leaves the evaluation to be
    made again by the resume, on the same episodes, so the first callback hears it twice
    (the same stats) and every callback hears every evaluation."""
    config = _config()
    first, second = _Heard(), _Heard(cut_at=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "b", callbacks=[first, second])
    first_again, second_again = _Heard(), _Heard()
    resume(tmp_path / "b", callbacks=[first_again, second_again])
    evals = len(_evals(tmp_path / "b"))
    assert [h[0] for h in first.heard].count("eval") == 2 == second.evals
    for heard in (first.heard + first_again.heard, second.heard + second_again.heard):
        assert [h[0] for h in heard].count("eval") == evals + 1  # the cut one twice
    assert first_again.heard[0] == second_again.heard[0] == ("eval", -1)


def test_a_solve_is_not_restored_when_the_resume_turns_stop_on_solve_off(tmp_path):
    config = _config(steps=768, sets=[*SOLVE_SETS, "solve_threshold=170"])
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "b", callbacks=[_Heard(cut_at=1)])
    result = resume(tmp_path / "b", sets=["stop_on_solve=false"])
    assert (result.stopped_by, result.env_steps) == ("budget", 768)


class _Raises(_Heard):
    def on_eval(self, stats):
        super().on_eval(stats)
        raise ValueError("callback failed (test)")


def test_an_evaluation_a_resume_makes_first_is_saved_even_if_it_takes_no_step(
        tmp_path, monkeypatch):
    """A resume whose first evaluation (the one a cut left) failed again on the next
    episodes wrote no checkpoint, as it took no step: the next resume retried the same
    episodes. A callback failing in it leaves the evaluation to be made again whole."""
    seeds, bad = [], set()
    original = base.evaluate

    def fails_twice(*args, **kwargs):
        seeds.append(kwargs["seed"])
        if len(seeds) == 1:
            bad.update({kwargs["seed"] + 1, kwargs["seed"] + 2})
        if kwargs["seed"] in bad:
            raise RuntimeError("env: simulation unstable (test)")
        return original(*args, **kwargs)

    monkeypatch.setattr(base, "evaluate", fails_twice)
    with pytest.raises(RuntimeError, match="unstable"):
        train(_config(), tmp_path / "b")
    with pytest.raises(RuntimeError, match="unstable"):  # on the next episodes too
        resume(tmp_path / "b")
    assert resume(tmp_path / "b").env_steps == 1280
    assert seeds[:5] == [seeds[0] + i for i in range(5)]  # each failure moves on

    monkeypatch.undo()
    owner, method, cut, *_ = CUTS["ppo"]
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(_config(), tmp_path / "c")
    heard = _Heard()
    with pytest.raises(ValueError, match="callback failed"):
        resume(tmp_path / "c", callbacks=[heard, _Raises()])
    heard_again = _Heard()
    resume(tmp_path / "c", callbacks=[heard_again, _Heard()])
    # The cut evaluation twice (the failed resume's, the next one's), then 768, 1024, 1280.
    assert [h for h in heard.heard + heard_again.heard if h[0] == "eval"] == [("eval", -1)] * 5


def test_rows_a_crash_logged_after_a_resume_made_the_cut_evaluation_are_not_doubled(
        tmp_path, straight_run, monkeypatch):
    """The checkpoint of a cut holds the update without its eval until the next one is
    written: a resume that made the eval (its row logged) and crashed before that left
    the row for the next resume to log again, at the checkpoint's own step."""
    config = _config()
    a = straight_run(config)
    owner, method, cut, *_ = CUTS["ppo"]
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(config, tmp_path / "b")
    resume(tmp_path / "b")
    c = _crashed_copy(tmp_path / "b", tmp_path / "c", 512)  # the cut's checkpoint, all rows
    assert _eval_pending(load_checkpoint(CheckpointManager(c / "checkpoints").latest()))
    resume(c)
    _same_evaluations_and_state(a, c)


@pytest.mark.parametrize("cut_kind", ["owed", "unheard"])
def test_a_cut_checkpoint_of_an_older_rlloop_resumes_by_making_its_evaluation(
        tmp_path, straight_run, monkeypatch, cut_kind):
    """Checkpoints of rlloop 2cb7bfe and before say in their own keys what a cut left:
    an eval owed (not made; its resume is a straight run's), or one made whose callbacks
    and row were cut ("unheard"; made again, on the next episodes)."""
    config = _config()
    a = straight_run(config)
    owner, method, cut, *_ = CUTS["ppo"]
    with monkeypatch.context() as patched:
        ends, _ = _two_signals_in_update(patched, owner, method, cut)
        with ends:
            train(config, tmp_path / "b")
    path = CheckpointManager(tmp_path / "b" / "checkpoints").latest()
    old = load_checkpoint(path)
    trainer = old.components["trainer"]
    del trainer["steps_per_eval"]
    trainer.update(eval_owed=cut_kind == "owed", eval_unheard=None)
    if cut_kind == "unheard":  # made and counted, its callbacks cut from the second on
        trainer.update(evaluated_at=cut, eval_unheard=1)
        old.components["algorithm"]["evals"] += 1
    save_replacing(path, old.components, metadata=old.metadata)
    assert resume(tmp_path / "b").env_steps == 1280
    if cut_kind == "owed":
        _same_evaluations_and_state(a, tmp_path / "b")
    else:
        assert sorted(_evals(tmp_path / "b")) == sorted(_evals(a))
