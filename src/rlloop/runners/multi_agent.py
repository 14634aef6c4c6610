"""Multi-agent env runner: modules mapped to agents per episode, batched inference.

A *policy mapping function* ``mapping(agent_id, episode_id) -> module_id`` decides, when
an episode starts in one of the ``N`` envs, which module acts for each agent in it (as in
RLlib). At every step all ``(agent, env)`` rows mapped to one module go through that module
in one forward call. The module id :data:`RANDOM` acts uniformly at random (over legal
actions), which is how baselines and "vs random" evaluations are played.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from rlloop.data.multi_agent import AgentRollout
from rlloop.envs.core import Box
from rlloop.envs.multi_agent import MultiAgentSpec, PettingZooVecEnv, random_actions
from rlloop.system.devices import stats_dtype
from rlloop.system.signals import check_eval_stop

RANDOM = "random"
#: ``policy(module_id, obs [B, *obs]) -> (actions [B, ...], log_probs [B])``.
PolicyFn = Callable[[str, Tensor], tuple[Tensor, Tensor]]
#: ``mapping(agent_id, episode_id) -> module_id``, called when an episode starts.
MappingFn = Callable[[str, int], str]


class Assignment:
    """Which module acts for each ``(agent, env)``, with the row groups per module cached."""

    def __init__(self, agents: Iterable[str], num_envs: int,
                 device: str | torch.device = "cpu") -> None:
        self.ids: dict[str, list[str]] = {a: [RANDOM] * num_envs for a in agents}
        self.device = torch.device(device)
        self._groups: dict[str, list[tuple[str, Tensor]]] | None = None

    def set(self, agent: str, env: int, module_id: str) -> None:
        if self.ids[agent][env] != module_id:
            self.ids[agent][env] = module_id
            self._groups = None

    def replace(self, old: str, new: str) -> None:
        """Hand every row of module ``old`` to ``new`` (``old`` was removed)."""
        for agent, ids in self.ids.items():
            for env, m in enumerate(ids):
                if m == old:
                    self.set(agent, env, new)

    def groups(self) -> dict[str, list[tuple[str, Tensor]]]:
        if self._groups is None:
            groups: dict[str, list[tuple[str, Tensor]]] = {}
            for agent, ids in self.ids.items():
                for m in dict.fromkeys(ids):
                    rows = torch.tensor([i for i, x in enumerate(ids) if x == m],
                                        device=self.device)
                    groups.setdefault(m, []).append((agent, rows))
            self._groups = groups
        return self._groups


def act_all(obs: Mapping[str, Tensor], assignment: Assignment, policy: PolicyFn,
            spec: MultiAgentSpec, generator: torch.Generator
            ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Actions and log-probabilities ``{agent: [N, ...]}``, one forward call per module."""
    first = next(iter(obs.values()))
    n, device = first.shape[0], first.device
    actions: dict[str, Tensor] = {}
    log_probs = {a: torch.zeros(n, device=device) for a in spec.agents}
    for a, s in spec.agent_specs.items():
        box = isinstance(s.action_space, Box)
        shape = (n, *s.action_space.shape) if isinstance(s.action_space, Box) else (n,)
        actions[a] = torch.zeros(shape, dtype=torch.float32 if box else torch.int64,
                                 device=device)
    for module_id, parts in assignment.groups().items():
        if module_id == RANDOM:
            for a, rows in parts:
                actions[a][rows] = random_actions(spec.agent_specs[a], obs[a][rows],
                                                  generator).to(actions[a].dtype)
            continue
        act, logp = policy(module_id, torch.cat([obs[a][rows] for a, rows in parts]))
        start = 0
        for a, rows in parts:
            actions[a][rows] = act[start:start + len(rows)].to(actions[a].dtype)
            log_probs[a][rows] = logp[start:start + len(rows)]
            start += len(rows)
    return actions, log_probs


class MultiAgentRunner:
    """Steps ``env``, maps modules to agents per episode, fills per-agent rollouts.

    Episodes continue across iterations. ``set_state`` restores counters and recent
    returns but restarts the episodes (PettingZoo envs cannot save their game state).
    """

    def __init__(self, env: PettingZooVecEnv, mapping: MappingFn, seed: int | None = None,
                 window: int = 100) -> None:
        self.env = env
        self.device = env.device
        self.mapping = mapping
        self.window = window
        self.module_table: list[str] = []
        self.episodes_started = 0
        self.episodes = 0
        self.recent: dict[str, deque[float]] = {}
        self.recent_lengths: deque[int] = deque(maxlen=window)
        self.time_env = self.time_inference = 0.0
        self.assignment = Assignment(env.agents, env.num_envs, self.device)
        self._restart(env.reset(seed=seed))

    def _restart(self, obs: dict[str, Tensor]) -> None:
        self.obs = obs
        dtype, device = stats_dtype(self.device), self.device
        self.returns = {a: torch.zeros(self.env.num_envs, dtype=dtype, device=device)
                        for a in self.env.agents}
        self.lengths = torch.zeros(self.env.num_envs, dtype=torch.int64, device=device)
        for i in range(self.env.num_envs):
            self._start_episode(i)

    def _start_episode(self, env_index: int) -> None:
        episode = self.episodes_started
        self.episodes_started += 1
        for a in self.env.agents:
            self.assignment.set(a, env_index, self.mapping(a, episode))

    def module_index(self, module_id: str) -> int:
        """The module's row in ``module_table`` (``AgentRollout.module`` stores these)."""
        if module_id not in self.module_table:
            self.module_table.append(module_id)
        return self.module_table.index(module_id)

    @torch.inference_mode()
    def collect(self, policy: PolicyFn, rollout: Mapping[str, AgentRollout],
                generator: torch.Generator) -> int:
        """Fill ``rollout`` (``T`` steps); returns the number of env steps taken."""
        env, clock = self.env, time.perf_counter
        steps = next(iter(rollout.values())).obs.shape[0]
        for t in range(steps):
            t0 = clock()
            actions, log_probs = act_all(self.obs, self.assignment, policy, env.spec, generator)
            t1 = clock()
            active = env.active
            res = env.step(actions)
            t2 = clock()
            for a, buf in rollout.items():
                buf.obs[t] = self.obs[a]
                buf.actions[t] = actions[a]
                buf.log_probs[t] = log_probs[a]
                buf.rewards[t] = res.reward[a]
                buf.terminated[t] = res.terminated[a]
                buf.truncated[t] = res.truncated[a]
                buf.final_obs[t] = res.final_obs[a]
                buf.active[t] = active[a]
                buf.module[t] = torch.tensor([self.module_index(m)
                                              for m in self.assignment.ids[a]],
                                             device=self.device)
                self.returns[a] += res.reward[a]
            self.lengths += 1
            for i in res.episode_over.nonzero().flatten().tolist():
                self._end_episode(i)
            self.obs = res.obs
            self.time_inference += t1 - t0
            self.time_env += t2 - t1
        return steps * env.num_envs

    def _end_episode(self, i: int) -> None:
        for a in self.env.agents:
            module = self.assignment.ids[a][i]
            self.recent.setdefault(module, deque(maxlen=self.window)).append(
                float(self.returns[a][i]))
            self.returns[a][i] = 0.0
        self.recent_lengths.append(int(self.lengths[i]))
        self.lengths[i] = 0
        self.episodes += 1
        self._start_episode(i)

    def stats(self, modules: Iterable[str]) -> dict[str, float]:
        """Recent episode returns per module (of ``modules``; others are forgotten)."""
        keep = set(modules)
        for m in [m for m in self.recent if m not in keep]:
            del self.recent[m]
        out = {"episode/count": float(self.episodes)}
        if self.recent_lengths:
            out["episode/length_mean"] = sum(self.recent_lengths) / len(self.recent_lengths)
        for m, values in self.recent.items():
            if values:
                out[f"episode/{m}/return_mean"] = sum(values) / len(values)
        return out

    def pop_times(self) -> dict[str, float]:
        out = {"time/env_s": self.time_env, "time/inference_s": self.time_inference}
        self.time_env = self.time_inference = 0.0
        return out

    def get_state(self) -> dict[str, Any]:
        return {"env": self.env.get_state(), "episodes": self.episodes,
                "episodes_started": self.episodes_started,
                "module_table": list(self.module_table),
                "recent": {m: list(v) for m, v in self.recent.items()},
                "recent_lengths": list(self.recent_lengths)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.env.set_state(state["env"])
        self.episodes = int(state["episodes"])
        self.episodes_started = int(state["episodes_started"])
        self.module_table = list(state["module_table"])
        self.recent = {m: deque((float(x) for x in v), maxlen=self.window)
                       for m, v in state["recent"].items()}
        self.recent_lengths = deque((int(x) for x in state["recent_lengths"]),
                                    maxlen=self.window)
        self._restart(self.env.reset())


@torch.inference_mode()
def evaluate_multi_agent(
    env: PettingZooVecEnv,
    policy: PolicyFn,
    focal: Callable[[str], str],
    opponent: str | None,
    episodes: int,
    generator: torch.Generator,
    seed: int | None = None,
    max_steps: int = 1_000_000,
) -> dict[str, float]:
    """Return of a *focal* agent over exactly ``episodes`` episodes.

    Episode ``k`` (counted over all envs) makes agent ``k mod n_agents`` the focal one, so
    every seat is played equally often; it acts with module ``focal(agent)``, every other
    agent with ``opponent`` (e.g. :data:`RANDOM`) or, when ``None``, its own ``focal``
    module. Returns ``return_mean`` etc. and ``<module>/return_mean`` per focal module.
    """
    n, agents, device = env.num_envs, env.agents, env.device
    quota = [len(range(i, episodes, n)) for i in range(n)]
    done = [0] * n
    assignment = Assignment(agents, n, device)
    focal_agent = [""] * n

    def assign(i: int) -> None:
        focal_agent[i] = agents[(i + done[i] * n) % len(agents)]
        for a in agents:
            own = focal(a)
            assignment.set(a, i, own if a == focal_agent[i] else (opponent or own))

    for i in range(n):
        assign(i)
    obs = env.reset(seed=seed)
    running = {a: torch.zeros(n, dtype=stats_dtype(device), device=device) for a in agents}
    lengths = torch.zeros(n, dtype=torch.int64, device=device)
    results: dict[str, list[float]] = {}
    ep_lengths: list[int] = []
    for _ in range(max_steps):
        if all(d >= q for d, q in zip(done, quota, strict=True)):
            break
        check_eval_stop(sum(done), episodes)
        actions, _ = act_all(obs, assignment, policy, env.spec, generator)
        res = env.step(actions)
        for a in agents:
            running[a] += res.reward[a]
        lengths += 1
        for i in res.episode_over.nonzero().flatten().tolist():
            if done[i] < quota[i]:
                fa = focal_agent[i]
                results.setdefault(assignment.ids[fa][i], []).append(float(running[fa][i]))
                ep_lengths.append(int(lengths[i]))
                done[i] += 1
            for a in agents:
                running[a][i] = 0.0
            lengths[i] = 0
            assign(i)
        obs = res.obs
    every = torch.tensor([r for rs in results.values() for r in rs], dtype=torch.float64,
                         device="cpu")
    nan = float("nan")
    out = {
        "return_mean": float(every.mean()) if len(every) else nan,
        "return_std": float(every.std(unbiased=False)) if len(every) else nan,
        "return_min": float(every.min()) if len(every) else nan,
        "return_max": float(every.max()) if len(every) else nan,
        "length_mean": sum(ep_lengths) / max(len(ep_lengths), 1),
        "episodes": float(len(every)),
    }
    if len(results) > 1:
        out.update({f"{m}/return_mean": sum(rs) / len(rs) for m, rs in results.items()})
    return out
