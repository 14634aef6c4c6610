"""Env runners in local processes that sample ahead into a bounded queue (APPO, IMPALA).

Each of K processes holds M envs and its own copy of the algorithm (built, as a Ray
runner's, from :func:`~rlloop.runners.ray_actor.runner_config`) and loops: read the newest
weights from shared memory if they changed, sample a fragment of T steps per env, tag it
with the weights' version and put it on the queue. The queue holds ``queue_size``
fragments; a runner whose fragment finds it full waits there, so a slow learner holds the
runners back instead of letting their fragments grow stale. The learner takes fragments in
the order they arrive and drops those whose weights are more than ``max_policy_lag``
versions behind its own (a version is one update's weights).

With ``max_policy_lag=0`` the runners do not sample ahead: each fragment is asked for, and
sampled with the newest weights. With one runner such a run is deterministic, and its
checkpoints hold the runner's envs and sampling RNG, so a resume continues it exactly.
Otherwise a resume starts new episodes in every runner (the fragments in flight are lost):
asynchronous runs are not bit-exact on resume.

A runner process that dies (or whose env raises) is started again, up to ``max_restarts``
times, with a new seed; the fragment it was sampling is lost and ``env_runners/restarts``
counts it. ``restart_failed_env_runners=false`` raises
:class:`~rlloop.runners.ray_runners.EnvRunnerError`-like :class:`AsyncRunnerError` instead.
"""

from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from rlloop.errors import RlloopError
from rlloop.runners.async_runner_process import serve, to_tensors
from rlloop.runners.fragments import Fragment, FragmentEpisodes, RemoteEnvs, weights_lag
from rlloop.runners.ray_actor import BuildAlgorithm, envs_per_runner
from rlloop.system.seeding import derive_seed

if TYPE_CHECKING:
    from rlloop.config.run_config import RunConfig

#: Seconds a runner process may take to build its algorithm (imports, its envs).
START_TIMEOUT_S = 300.0
_POLL_S = 0.2


class AsyncRunnerError(RlloopError, RuntimeError):
    """An env runner process failed and may not (or can no longer) be restarted."""


class AsyncRunnerProcesses:
    """K runner processes behind the interface :class:`~rlloop.algorithms.appo.APPO`
    takes fragments from (``take``, ``episodes``, ``pop_times``, ``get_state``; see the
    module doc).

    Args:
        config: The run config (``num_env_runners``, restarts, the algorithm's async
            settings: ``max_policy_lag``, ``queue_size``).
        algorithm: The learner's algorithm: its ``policy`` is what the runners act with.
        build: How a runner builds its algorithm from its config.
    """

    def __init__(self, config: RunConfig, algorithm: Any, build: BuildAlgorithm) -> None:
        hp = config.hparams
        self.config, self.algorithm, self.build = config, algorithm, build
        self.num_runners, self.envs = config.num_env_runners, envs_per_runner(config)
        self.max_lag = int(hp.max_policy_lag)
        self.ahead = self.max_lag > 0
        self.device = algorithm.device
        self._ctx = mp.get_context("spawn")
        self.fragments: Any = self._ctx.Queue(maxsize=int(hp.queue_size))
        self.replies: Any = self._ctx.Queue()
        self.commands: list[Any] = [self._ctx.Queue() for _ in range(self.num_runners)]
        self.weights = {k: v.detach().to("cpu", copy=True).share_memory_()
                        for k, v in algorithm.policy.state_dict().items()}
        self.version: Any = self._ctx.Value("q", -1)
        self._published: list[int] = []
        self.episodes = FragmentEpisodes(self.num_runners, self.envs)
        self.obs = torch.zeros((self.num_runners * self.envs,
                                *algorithm.env.spec.obs_shape), device=self.device)
        self.restart_due = self.restarted_at_resume = False
        self.restarts = self.dropped = 0
        self._lives = [0] * self.num_runners
        self._asked: list[int] = [0] * self.num_runners  # fragments asked for (lag 0)
        self._next_runner = 0
        self._wait_s = self._lag_sum = self._env_s = self._inference_s = 0.0
        self._taken = self._arrived_steps = self._depth_sum = 0
        self._window_t0 = time.perf_counter()
        self._closed = False
        self.processes: list[Any] = [None] * self.num_runners
        self.env = RemoteEnvs(algorithm.env.spec, self.num_runners * self.envs, self)
        self._publish()
        try:
            for runner in range(self.num_runners):
                self._start(runner)
            self._await_ready(set(range(self.num_runners)))
        except BaseException:
            self.close()
            raise

    # ---- processes -----------------------------------------------------------------------
    def _start(self, runner: int) -> None:
        process = self._ctx.Process(
            target=serve, name=f"rlloop-env-runner-{runner}", daemon=True,
            args=(self.config, runner, self._lives[runner], self.build, self.weights,
                  self.version, self.fragments, self.commands[runner], self.replies,
                  self.ahead))
        process.start()
        self.processes[runner] = process
        self._asked[runner] = 0

    def _await_ready(self, waiting: set[int]) -> None:
        """Wait until every runner in ``waiting`` has built its algorithm."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            try:
                kind, runner, detail = self.replies.get(timeout=_POLL_S)
            except queue.Empty:
                for runner in waiting:
                    if not self.processes[runner].is_alive():
                        raise AsyncRunnerError(
                            f"env runner {runner} could not start (its process died); see "
                            "its traceback above") from None
                if time.monotonic() > deadline:
                    raise AsyncRunnerError(f"env runners {sorted(waiting)} did not start "
                                           f"within {START_TIMEOUT_S:.0f} s") from None
                continue
            if kind == "error":
                raise AsyncRunnerError(f"env runner {runner} could not start: {detail}; fix "
                                       "that and run again")
            waiting.discard(runner)

    def _check_runners(self) -> None:
        """Start again every runner whose process has died (or stop with its error)."""
        for runner, process in enumerate(self.processes):
            if process.is_alive():
                continue
            cause = self._error_of(runner) or f"its process exited with {process.exitcode}"
            cfg = self.config
            if not cfg.restart_failed_env_runners:
                raise AsyncRunnerError(f"env runner {runner} failed: {cause}; set "
                                       "restart_failed_env_runners=true to restart it")
            if self._lives[runner] >= cfg.max_restarts:
                raise AsyncRunnerError(f"env runner {runner} failed {self._lives[runner] + 1} "
                                       f"times, more than max_restarts={cfg.max_restarts}: "
                                       f"{cause}; fix the env or raise max_restarts")
            process.join(timeout=1)
            self._lives[runner] += 1
            self.restarts += 1
            self.episodes.restart(runner)
            self._start(runner)
            self._await_ready({runner})

    def _error_of(self, runner: int) -> str | None:
        """The error line a dead runner sent, if it sent one."""
        found = None
        while True:
            try:
                kind, who, detail = self.replies.get(timeout=0.05)
            except queue.Empty:
                return found
            if kind == "error" and who == runner:
                found = detail

    # ---- sampling ------------------------------------------------------------------------
    def _publish(self) -> None:
        """The learner's weights into shared memory, once per new ``weights_seq_no``."""
        seq = int(self.algorithm.learner.weights_seq_no)
        if self._published and self._published[-1] == seq:
            return
        with self.version.get_lock():
            for name, value in self.algorithm.policy.state_dict().items():
                self.weights[name].copy_(value)
            self.version.value = seq
        self._published.append(seq)
        del self._published[:-1000]

    def take(self, count: int) -> list[Fragment]:
        """``count`` fragments fresh enough to learn from, in the order they arrive."""
        self._publish()
        self._check_runners()
        out: list[Fragment] = []
        t0 = time.perf_counter()
        while len(out) < count:
            if not self.ahead:
                self._ask(count - len(out))
            self._depth_sum += self.fragments.qsize()
            try:
                frag = self.fragments.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_runners()
                continue
            self._asked[frag.runner] = max(0, self._asked[frag.runner] - 1)
            frag = to_tensors(frag, self.device)
            if self._accept(frag):
                out.append(frag)
        self._wait_s += time.perf_counter() - t0
        return out

    def _ask(self, wanted: int) -> None:
        """With lag 0: ask runners in turn for the fragments not asked for yet."""
        missing = wanted - sum(self._asked)
        for _ in range(max(0, missing)):
            runner = self._next_runner
            self._next_runner = (runner + 1) % self.num_runners
            self.commands[runner].put(("sample", None))
            self._asked[runner] += 1

    def _accept(self, frag: Fragment) -> bool:
        lag = weights_lag(self._published, frag.weights_seq_no)
        self.episodes.add(frag)
        self._arrived_steps += frag.steps  # the runners' throughput counts dropped ones too
        if lag > self.max_lag:
            self.dropped += 1
            return False
        self.obs[frag.runner * self.envs:(frag.runner + 1) * self.envs] = frag.last_obs
        self._lag_sum += lag
        self._taken += 1
        self._env_s += frag.env_s
        self._inference_s += frag.inference_s
        return True

    def pop_times(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self._window_t0, 1e-9)
        polls = max(self._taken + self.dropped, 1)
        out = {"time/env_s": self._env_s, "time/inference_s": self._inference_s,
               "time/sample_wait_s": self._wait_s,
               "env_runners/restarts": float(self.restarts),
               "env_runners/dropped_fragments": float(self.dropped),
               "env_runners/policy_lag": self._lag_sum / max(self._taken, 1),
               "env_runners/queue_depth": self._depth_sum / polls,
               "env_runners/env_steps_per_s": self._arrived_steps / elapsed}
        self._env_s = self._inference_s = self._wait_s = self._lag_sum = 0.0
        self._taken = self._arrived_steps = self._depth_sum = 0
        self._window_t0 = time.perf_counter()
        return out

    # ---- state ---------------------------------------------------------------------------
    @property
    def exact(self) -> bool:
        """One runner that samples only when asked: its state is the run's to save."""
        return self.num_runners == 1 and not self.ahead

    def get_state(self) -> dict[str, Any]:
        """Episode statistics and restarts; with one runner at lag 0 also the runner's
        envs and sampling RNG (see the module doc)."""
        state: dict[str, Any] = {"obs": self.obs.clone(), "episodes": self.episodes.get_state(),
                                 "env": {}, "restarts": self.restarts}
        if self.exact:
            self.commands[0].put(("get_state", None))
            state["runner_process"] = self._reply("state")
            state["episode_totals"] = self.episodes.totals.clone()  # episodes under way
        return state

    def _reply(self, wanted: str) -> Any:
        while True:
            try:
                kind, _runner, detail = self.replies.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_runners()
                continue
            if kind == wanted:
                return detail

    def set_state(self, state: dict[str, Any]) -> None:
        self.episodes.set_state(state["episodes"])
        self.restarts = int(state.get("restarts", 0))
        saved = state.get("runner_process")
        if self.exact and saved is not None:
            self.obs.copy_(state["obs"])
            self.episodes.totals.copy_(state["episode_totals"])
            self.commands[0].put(("set_state", saved))
        else:
            self.restart_due = True

    def restart_episodes(self) -> None:
        """After ``set_state`` of an asynchronous run: every runner starts new episodes and
        sampling streams from seeds of the resume point."""
        base = derive_seed(self.config.seed, f"env-runners-resumed-{self.episodes.count}-"
                                             f"{self.restarts}") % 2**31
        for runner, commands in enumerate(self.commands):
            commands.put(("restart", base + runner * self.envs))
        self.episodes.restart()
        self.restart_due, self.restarted_at_resume = False, True

    def reset(self, seed: int | None = None) -> None:
        """``horizons_per_env_reset``: the runners restart their episodes from ``seed``."""
        base = 0 if seed is None else seed
        for runner, commands in enumerate(self.commands):
            commands.put(("restart", base + runner * self.envs))
        self.episodes.restart()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for runner, process in enumerate(self.processes):
            if process is not None and process.is_alive():
                self.commands[runner].put(("stop", None))
        deadline = time.monotonic() + 2.0
        for process in self.processes:
            if process is None:
                continue
            while process.is_alive() and time.monotonic() < deadline:
                self._drain()  # a runner blocked on a full queue sees its stop after a put
                process.join(timeout=0.05)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
        for q in (self.fragments, self.replies, *self.commands):
            q.cancel_join_thread()
            q.close()

    def _drain(self) -> None:
        try:
            while True:
                self.fragments.get_nowait()
        except queue.Empty:
            pass


def attach_async_runners(algorithm: Any, config: RunConfig,
                         build: BuildAlgorithm) -> AsyncRunnerProcesses:
    """Replace ``algorithm``'s in-process runner with ``config.num_env_runners`` runner
    processes, each of which builds its own algorithm with ``build``; the envs
    ``algorithm`` built for its spaces are closed."""
    group = AsyncRunnerProcesses(config, algorithm, build)
    algorithm.env.close()
    algorithm.env = group.env
    algorithm.runner = group
    return group
