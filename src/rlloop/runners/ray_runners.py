"""Env runners as Ray actors: K actors, each with M envs and a copy of the policy.

:func:`attach_env_runners` swaps an algorithm's in-process runner for a
:class:`RayEnvRunnerGroup` with the same interface (``collect``, ``obs``, ``episodes``,
``pop_times``, ``get_state``): PPO's collect concatenates K fragments into the rollout it
trains on; an off-policy algorithm's env step (:class:`RemoteOffPolicyLoop`) puts the
transitions of each fragment into its replay buffer.

Weights travel through Ray's object store: one ``ray.put`` per new ``weights_seq_no``,
handed by reference to every runner, which fetches it only when its copy is older.
With ``max_weight_lag >= 1`` runners sample ahead (each always has one fragment in
flight, started with the newest weights at hand), so sampling overlaps learning; a
fragment whose weights are more than ``max_weight_lag`` versions behind is dropped. With
0 every fragment is sampled with the newest weights (synchronous).

A runner that fails (its process dies, its env raises) is restarted by Ray up to
``max_restarts`` times; the fragment it was sampling is lost, ``env_runners/restarts``
counts it, and the others go on. ``restart_failed_env_runners=false`` raises
:class:`EnvRunnerError` instead.

This is the learner's side of the runners; one actor, and the config it builds its
algorithm from, is :mod:`rlloop.runners.ray_actor`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.exceptions import RayActorError, RayError, RayTaskError

from rlloop.algorithms.offpolicy_loop import OffPolicyLoop
from rlloop.config.ray import learner_actors
from rlloop.data.rollout import RolloutBuffer
from rlloop.errors import RlloopError
from rlloop.modules.custom import script_nets
from rlloop.runners.fragments import Fragment, FragmentEpisodes, RemoteEnvs, weights_lag
from rlloop.runners.ray_actor import BuildAlgorithm, EnvRunnerActor, envs_per_runner
from rlloop.runners.ray_cluster import connect, disconnect
from rlloop.system.devices import move_to
from rlloop.system.seeding import derive_seed
from rlloop.system.user_code import one_line

if TYPE_CHECKING:
    from rlloop.config.run_config import RunConfig


#: Seconds a failed runner may take to come back (a process start, imports, its envs).
RESTART_TIMEOUT_S = 300.0
_HOST = torch.device("cpu")


class EnvRunnerError(RlloopError, RuntimeError):
    """An env runner failed and may not (or can no longer) be restarted."""


def _raised(traceback_text: str) -> str | None:
    """The last ``SomeError: message`` line of a remote traceback, or None."""
    found = None
    for line in traceback_text.splitlines():
        match = re.match(r"\s*((?:\w+\.)*\w+(?:Error|Exception)): (.+)", line)
        if match:
            found = f"{match[1].rpartition('.')[2]}: {match[2].strip()}"
    return found


class RayEnvRunnerGroup:
    """K runner actors behind the in-process runner's interface (see the module doc).

    Args:
        config: The run config (``num_env_runners``, ``max_weight_lag``, restarts, ``ray``).
        algorithm: The learner's algorithm: its policy state is what runners act with.
    """

    def __init__(self, config: RunConfig, algorithm: Any,
                 build: BuildAlgorithm) -> None:
        self.config, self.algorithm = config, algorithm
        self.num_runners, self.envs = config.num_env_runners, envs_per_runner(config)
        self.device = algorithm.device
        self.asynchronous = config.max_weight_lag > 0
        self._closed = False
        self._started_ray = connect(config.ray, self.num_runners, learner_actors(config))
        actor_cls = ray.remote(EnvRunnerActor).options(  # type: ignore[attr-defined]
            max_restarts=config.max_restarts if config.restart_failed_env_runners else 0,
            max_task_retries=0,
            num_cpus=config.ray.num_cpus_per_runner, scheduling_strategy="SPREAD")
        # Handles, typed loosely: Ray's stubs do not know the actor's remote methods.
        nets = script_nets(getattr(config.hparams, "net", None),
                           f"{config.hparams.section}.net")
        self.actors: list[Any] = [actor_cls.remote(config, i, build, nets)
                                  for i in range(self.num_runners)]
        spec = algorithm.env.spec
        self.env = RemoteEnvs(spec, self.num_runners * self.envs, self)
        self.obs = torch.zeros((self.env.num_envs, *spec.obs_shape), device=self.device)
        self.episodes = FragmentEpisodes(self.num_runners, self.envs)
        self._inflight: dict[Any, int] = {}  # object ref -> runner index
        self._ahead: dict[int, Fragment] = {}  # runner -> its next fragment, already here
        #: As an in-process runner's: set_state makes the episodes restart.
        self.restart_due = self.restarted_at_resume = False
        self._published: list[int] = []  # weights_seq_no of each broadcast, ascending
        self._weights_ref: Any = None
        self.restarts = self.dropped = 0
        self.restarted: set[int] = set()  # restarted since pop_restarted
        self._failures = [0] * self.num_runners
        self._instances: list[int | None] = [None] * self.num_runners
        self._down_since: list[float | None] = [None] * self.num_runners
        self._wait_s = self._lag_sum = 0.0
        self._taken = 0
        self.time_env = self.time_inference = 0.0

    # ---- sampling ----------------------------------------------------------------------
    def _weights(self) -> int:
        """The learner's weights_seq_no, its weights in the object store (once each)."""
        seq = int(self.algorithm.learner.weights_seq_no)
        if not self._published or self._published[-1] != seq:
            # on the host: runners act on the CPU (runner_config)
            self._weights_ref = ray.put(move_to(self.algorithm.get_policy_state(), _HOST))
            self._published.append(seq)
            del self._published[:-1000]
        return seq

    def _launch(self, runner: int) -> None:
        seq = self._weights()
        ref = self.actors[runner].sample.remote([self._weights_ref], seq, self.env_steps)
        self._inflight[ref] = runner

    @property
    def env_steps(self) -> int:
        """The learner's env-step count, which off-policy runners explore by."""
        loop = getattr(self.algorithm, "loop", None)
        return int(loop.env_steps) if loop is not None else 0

    def take(self, count: int, extra: bool = False, one_each: bool = False) -> list[Fragment]:
        """``count`` fragments, in the order they arrive, fresh enough to use; with
        ``extra``, also those that arrived meanwhile (they would only grow older). With
        ``one_each`` (a rollout of one fragment per runner) a runner's second fragment
        waits for the next call, which takes it first."""
        self._weights()  # publish the newest weights: lags count from them
        out: list[Fragment] = []
        for runner, waiting in sorted(self._ahead.items()):
            del self._ahead[runner]
            if self._accept(waiting):
                out.append(waiting)
        for runner in range(self.num_runners):
            if runner not in self._inflight.values():
                self._launch(runner)
        t0 = time.perf_counter()
        while len(out) < count or extra:
            if len(out) < count:
                [ref], _ = ray.wait(list(self._inflight), num_returns=1)
            else:
                ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=0)
                if not ready:
                    break
                ref = ready[0]
            runner = self._inflight.pop(ref)
            try:
                frag: Fragment = move_to(ray.get(ref), self.device)
            except RayError as e:
                self._failed(runner, e)
                self._launch(runner)
                continue
            self._down_since[runner] = None
            self._check_instance(frag)
            if one_each and any(f.runner == runner for f in out):
                self._ahead[runner] = frag  # the next call's (a slot holds one per runner)
                continue
            if not self._accept(frag):
                self._launch(runner)
            else:
                out.append(frag)
                if self.asynchronous:  # sample ahead with the weights at hand
                    self._launch(runner)
                    extra = extra and len(out) < self.num_runners
        self._wait_s += time.perf_counter() - t0
        return sorted(out, key=lambda f: f.runner)

    def _accept(self, frag: Fragment) -> bool:
        """Whether ``frag`` is fresh enough to learn from. A dropped one leaves a gap in its
        runner's transitions: the runner's pending n-step windows restart (as after a
        restart), while its episodes, which the envs did play, are counted all the same."""
        lag = weights_lag(self._published, frag.weights_seq_no)
        self.episodes.add(frag)
        if lag > self.config.max_weight_lag:
            self.dropped += 1
            self.restarted.add(frag.runner)
            return False
        self._lag_sum += lag
        self._taken += 1
        self.time_env += frag.env_s
        self.time_inference += frag.inference_s
        return True

    def _failed(self, runner: int, error: RayError) -> None:
        """A runner's call failed: drop its fragment and let it restart, or raise when
        that is not allowed. Calls made while Ray restarts it fail too (the actor is
        unavailable): they count once, and are retried until it is back."""
        cfg = self.config
        cause = _cause_line(error)
        if isinstance(error, RayActorError) and error.actor_init_failed:
            # Its constructor raised (its env, network or settings): each restart would
            # raise again, so Ray's restarts only delay the error.
            raise EnvRunnerError(f"env runner {runner} could not start: "
                                 f"{_raised(str(error)) or cause}; fix that and run again")
        down = self._down_since[runner]
        if down is not None and isinstance(error, RayActorError):
            if time.monotonic() - down > RESTART_TIMEOUT_S:
                raise EnvRunnerError(f"env runner {runner} did not come back within "
                                     f"{RESTART_TIMEOUT_S:.0f} s of failing: {cause}")
            time.sleep(0.1)  # Ray is starting it again
            return
        self._down_since[runner] = time.monotonic()
        self._failures[runner] += 1
        if not cfg.restart_failed_env_runners:
            raise EnvRunnerError(f"env runner {runner} failed: {cause}; "
                                 "set restart_failed_env_runners=true to restart it")
        if self._failures[runner] > cfg.max_restarts:
            raise EnvRunnerError(f"env runner {runner} failed {self._failures[runner]} times, "
                                 f"more than max_restarts={cfg.max_restarts}: {cause}; fix the "
                                 "env or raise max_restarts")
        if not isinstance(error, RayActorError):  # its env raised: start it afresh
            ray.kill(self.actors[runner], no_restart=False)
        self._restarted(runner)
        self._instances[runner] = None  # its next life is expected, not counted again

    def _check_instance(self, frag: Fragment) -> None:
        """Count a restart no failed call showed (the runner died between calls): it
        answers from a new life, its envs started over."""
        known = self._instances[frag.runner]
        self._instances[frag.runner] = frag.instance
        if known is not None and known != frag.instance:
            self._restarted(frag.runner)

    def _restarted(self, runner: int) -> None:
        self.restarts += 1
        self.restarted.add(runner)
        self.episodes.restart(runner)

    def pop_restarted(self) -> set[int]:
        """The runners restarted since the last call (their envs started over)."""
        out, self.restarted = self.restarted, set()
        return out

    def collect(self, policy: Any, buf: RolloutBuffer) -> int:
        """Fill ``buf`` ``[T, K*M]`` with K fragments (``policy`` acts in the runners, with
        the learner's weights); returns the env steps taken."""
        m = self.envs
        for slot, frag in enumerate(self.take(self.num_runners, one_each=True)):
            cols = slice(slot * m, (slot + 1) * m)
            buf.obs[:, cols] = frag.obs
            buf.actions[:, cols] = frag.actions
            assert frag.log_probs is not None
            buf.log_probs[:, cols] = frag.log_probs
            buf.rewards[:, cols] = frag.rewards
            buf.terminated[:, cols] = frag.terminated
            buf.truncated[:, cols] = frag.truncated
            buf.next_obs[:, cols] = frag.next_obs
            self.obs[cols] = frag.last_obs
        return buf.steps * buf.num_envs

    def reset(self, seed: int | None = None) -> None:
        """Start fresh episodes in every runner (``horizons_per_env_reset``); fragments
        in flight are dropped."""
        self._drain()
        base = 0 if seed is None else seed
        ray.get([actor.reset.remote(base + i * self.envs) for i, actor in
                 enumerate(self.actors)])
        self.episodes.restart()

    def _drain(self) -> None:
        refs, self._inflight = list(self._inflight), {}
        self._ahead.clear()
        for ref in refs:
            with contextlib.suppress(RayError):
                ray.get(ref)

    def pop_times(self) -> dict[str, float]:
        out = {"time/env_s": self.time_env, "time/inference_s": self.time_inference,
               "time/sample_wait_s": self._wait_s,
               "env_runners/restarts": float(self.restarts),
               "env_runners/dropped_fragments": float(self.dropped),
               "env_runners/weights_lag": self._lag_sum / max(self._taken, 1)}
        self.time_env = self.time_inference = self._wait_s = self._lag_sum = 0.0
        self._taken = 0
        return out

    def get_state(self) -> dict[str, Any]:
        """What the learner knows of the runners: the episode statistics and restarts.
        The envs' own state stays in the runners; a resumed run starts new episodes."""
        return {"obs": self.obs.clone(), "episodes": self.episodes.get_state(), "env": {},
                "restarts": self.restarts}

    def set_state(self, state: dict[str, Any]) -> None:
        self.episodes.set_state(state["episodes"])
        self.restarts = int(state.get("restarts", 0))
        self.restart_due = True  # the runners' envs begin new episodes (see get_state)

    def restart_episodes(self) -> None:
        """After ``set_state``: the runners start new episodes and sampling streams from
        seeds of the resume point (their own seeds would replay the run's first episodes,
        as a `gymnasium-async` run reseeds after lost workers), and what the learner
        carried along the old ones is dropped (as an in-process runner's
        `restart_episodes`)."""
        base = derive_seed(self.config.seed, f"env-runners-resumed-{self.episodes.count}-"
                                             f"{self.restarts}") % 2**31
        self._drain()
        calls = [actor.restart.remote(base + i * self.envs)
                 for i, actor in enumerate(self.actors)]
        for runner, call in enumerate(calls):
            try:
                ray.get(call)
            except RayError as e:  # e.g. it could not start: one line, as in a collect
                self._failed(runner, e)
        self.episodes.restart()
        self.restarted.update(range(self.num_runners))
        self.restart_due, self.restarted_at_resume = False, True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in self.actors:
            ray.kill(actor)
        disconnect(self._started_ray)


class RemoteOffPolicyLoop(OffPolicyLoop):
    """An off-policy loop whose env step takes fragments from the runners: their
    transitions go through one step processor per runner into the replay buffer.

    It adopts the parts of the loop the algorithm built (replay buffer, config, RNG,
    schedules), so checkpoints hold the same state.
    """

    def __init__(self, loop: OffPolicyLoop, group: RayEnvRunnerGroup) -> None:
        self.__dict__.update(loop.__dict__)
        self.runner: Any = group
        self.group = group
        # One runner's envs; fragments arrive as float32 rows, on the group's device.
        spec = dataclasses.replace(loop.experience, num_envs=group.envs, device=group.device,
                                   obs_dtype=torch.float32, obs_layout=None)
        self.processors = [loop.step_processor(spec) for _ in range(group.num_runners)]
        # Sampling ahead: at least one fragment per env step (those that are ready);
        # synchronous: one from every runner.
        self._per_step = 1 if group.asynchronous else group.num_runners

    def env_step(self, explore: Any) -> int:
        steps = 0
        for frag in self.group.take(self._per_step, extra=self.group.asynchronous):
            for runner in self.group.pop_restarted():  # its envs started over
                self.processors[runner].reset()
            processor = self.processors[frag.runner]
            for t in range(frag.rewards.shape[0]):
                done = frag.terminated[t] | frag.truncated[t]
                reward = self.learning_reward(frag.rewards[t], done, frag.next_obs[t])
                self.replay.add(processor.process(
                    frag.obs[t], frag.actions[t], reward, frag.next_obs[t], frag.terminated[t],
                    frag.truncated[t]))
            steps += frag.steps
        self.env_steps += steps
        return steps


def attach_env_runners(algorithm: Any, config: RunConfig,
                       build: BuildAlgorithm) -> RayEnvRunnerGroup:
    """Replace ``algorithm``'s in-process runner with ``config.num_env_runners`` Ray
    actors, each of which builds its own algorithm with ``build``; the envs ``algorithm``
    built for its spaces are closed."""
    group = RayEnvRunnerGroup(config, algorithm, build)
    algorithm.env.close()
    algorithm.env = group.env  # type: ignore[assignment]
    algorithm.runner = group  # type: ignore[assignment]
    loop = getattr(algorithm, "loop", None)
    if isinstance(loop, OffPolicyLoop):
        algorithm.loop = RemoteOffPolicyLoop(loop, group)  # type: ignore[attr-defined]
    return group


def _cause_line(error: RayError) -> str:
    """The cause of a runner's failure in one line: the env's exception, or Ray's reason."""
    if isinstance(error, RayTaskError) and error.cause is not None:
        return f"{type(error.cause).__name__}: {one_line(error.cause)}"
    return one_line(error)[:300]
