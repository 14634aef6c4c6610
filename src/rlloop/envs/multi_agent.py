"""PettingZoo environments behind a batched tensor interface, one tensor per agent.

``PettingZooVecEnv`` holds ``N`` copies of a PettingZoo *parallel* env and steps them
together: actions go in as ``{agent_id: [N] tensor}``, observations, rewards and the
``terminated``/``truncated`` flags come back the same way. As in rlloop's single-agent
``VecEnv``, an env whose episode ended (no agent left) is reset in the same step; the last
observations of the ended episode are in ``MultiAgentStep.final_obs``.

Turn-based games (PettingZoo's classic AEC envs such as tic-tac-toe or connect four) go
through ``pettingzoo.utils.conversions.turn_based_aec_to_parallel``: every agent submits
an action each step, only the one whose turn it is counts. ``active`` says which agent's
action counts (or, in parallel envs, which agents are still alive), so learners can leave
the others out of their losses. Dict observations ``{"observation", "action_mask"}`` are
flattened and the legal-action mask appended (``AgentSpec.action_mask`` tells how many
trailing features are the mask), keeping one observation tensor per agent.

Env ids are ``"pettingzoo:<family>.<env>"`` (``pettingzoo:classic.tictactoe_v3``), or
``"pettingzoo:<module>"`` for any importable module with a ``parallel_env()`` or ``env()``.
Where PettingZoo has its env registry (1.27+), built-in envs are made through
``pettingzoo.make`` (its own ids, ``classic/tictactoe-v3``, work too).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlloop.envs.action_masks import legal_actions
from rlloop.envs.core import ActionSpace, Box, Discrete, EnvSpec, sample_box
from rlloop.envs.gym_spec import convert_action_space
from rlloop.envs.ids import PETTINGZOO_PREFIX, is_pettingzoo_id
from rlloop.errors import EnvError
from rlloop.system.devices import arrays_to_device

PREFIX = PETTINGZOO_PREFIX
ParallelEnvFn = Callable[[], Any]


@dataclass(frozen=True)
class AgentSpec:
    """One agent's view. ``action_mask > 0``: the last that many observation features are
    the legal-action mask (1 = legal) of a ``Discrete`` action space."""

    obs_shape: tuple[int, ...]
    action_space: ActionSpace
    action_mask: int = 0


@dataclass(frozen=True)
class MultiAgentSpec:
    """The agents of a multi-agent env and their spaces."""

    env_id: str
    agents: tuple[str, ...]
    agent_specs: Mapping[str, AgentSpec]

    def summary(self) -> EnvSpec:
        """A single-agent ``EnvSpec`` (first agent's spaces) for code that validates configs."""
        first = self.agent_specs[self.agents[0]]
        return EnvSpec(self.env_id, first.obs_shape, first.action_space)


class MultiAgentStep(NamedTuple):
    """One batched step; every field is ``{agent_id: tensor}`` with ``N = num_envs`` rows.

    Attributes:
        obs: ``[N, *obs]`` next observation (the reset one where the episode ended);
            zeros for agents not in the episode any more.
        reward: ``[N]``.
        terminated, truncated: ``[N]`` bool, the agent's episode ended at this step in a
            terminal state / by a cut; never both.
        final_obs: ``[N, *obs]`` last observation where the episode ended, else ``obs``.
        active: ``[N]`` bool, the agent must act on ``obs`` (alive, and its turn).
        episode_over: ``[N]`` bool, the env's episode ended and it was reset. It stays on
            the host, where the per-episode bookkeeping (who plays whom) happens; every
            other field is on the env's device.
    """

    obs: dict[str, Tensor]
    reward: dict[str, Tensor]
    terminated: dict[str, Tensor]
    truncated: dict[str, Tensor]
    final_obs: dict[str, Tensor]
    active: dict[str, Tensor]
    episode_over: Tensor


def pettingzoo_factory(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> ParallelEnvFn:
    """A function making one parallel env for ``env_id`` (see the module docstring)."""
    if not is_pettingzoo_id(env_id):
        raise EnvError(f"{env_id!r} is not a PettingZoo env id; write pettingzoo:<family>.<env>"
                       ", e.g. pettingzoo:classic.tictactoe_v3")
    name = env_id[len(PREFIX):]
    kwargs = dict(env_kwargs or {})
    registered = _from_registry(name, kwargs)
    if registered is not None:
        return registered
    module = None
    for path in (f"pettingzoo.{name}", name):
        try:
            module = importlib.import_module(path)
            break
        except ModuleNotFoundError as e:
            if e.name == "pettingzoo":
                raise EnvError("PettingZoo is not installed; pip install 'rlloop[multiagent]'"
                               ) from None
            if e.name is None or not path.startswith(e.name):
                raise EnvError(f"{env_id}: importing {path} failed ({e}); install the env "
                               "family's extra dependencies") from None
        except ImportError as e:  # e.g. MPE, which moved to its own package
            raise EnvError(f"{env_id}: {e}") from None
    if module is None:
        raise EnvError(f"unknown PettingZoo env {env_id!r}; ids look like "
                       "pettingzoo:classic.tictactoe_v3 or pettingzoo:butterfly.pistonball_v6")
    if hasattr(module, "parallel_env"):
        return functools.partial(module.parallel_env, **kwargs)
    if hasattr(module, "env"):
        return functools.partial(_turn_based, module.env, kwargs)
    raise EnvError(f"{env_id}: module {module.__name__} has neither parallel_env() nor env()")


def _from_registry(name: str, kwargs: dict[str, Any]) -> ParallelEnvFn | None:
    """A maker through ``pettingzoo.make`` if this PettingZoo has a registry holding ``name``
    (``classic.tictactoe_v3`` is looked up as ``classic/tictactoe-v3``)."""
    try:
        import pettingzoo
    except ModuleNotFoundError:
        raise EnvError("PettingZoo is not installed; pip install 'rlloop[multiagent]'") from None
    make = getattr(pettingzoo, "make", None)
    if make is None:
        return None
    reg_id = name if "/" in name else name.replace(".", "/", 1).replace("_v", "-v")
    if reg_id in getattr(pettingzoo, "parallel_registry", {}):
        return functools.partial(_checked_make, make, "parallel", reg_id, kwargs)
    if reg_id in getattr(pettingzoo, "aec_registry", {}):
        aec = functools.partial(_checked_make, make, "aec", reg_id, {})
        return functools.partial(_turn_based, aec, kwargs)
    if "/" in name:
        raise EnvError(f"unknown PettingZoo env {name!r}; see pettingzoo.pprint_registry()")
    return None


def _checked_make(make: Callable[..., Any], kind: str, reg_id: str, kwargs: dict[str, Any],
                  **more: Any) -> Any:
    from pettingzoo.env_registry.exceptions import PettingZooRegistryError

    try:
        return make(kind, reg_id, **kwargs, **more)
    except (ImportError, PettingZooRegistryError) as e:  # the family's optional dependencies
        cause = f" ({e.__cause__})" if e.__cause__ else ""
        raise EnvError(f"pettingzoo:{reg_id}: {e}{cause}") from None


def _turn_based(make_aec: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    return turn_based_aec_to_parallel(make_aec(**kwargs))


def _agent_spec(env_id: str, obs_space: spaces.Space[Any], act_space: spaces.Space[Any]
                ) -> AgentSpec:
    action = convert_action_space(env_id, act_space)
    if not isinstance(action, Discrete | Box):
        raise EnvError(f"{env_id}: action space {act_space} is not supported by ma_ppo "
                       "(Discrete or Box); PPO takes MultiDiscrete and MultiBinary on "
                       "single-agent envs")
    if isinstance(obs_space, spaces.Box):
        return AgentSpec(tuple(obs_space.shape), action)
    if isinstance(obs_space, spaces.Discrete):
        return AgentSpec((int(obs_space.n),), action)
    if (isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == {"observation",
                                                                       "action_mask"}
            and isinstance(action, Discrete)):
        inner = obs_space["observation"]
        if isinstance(inner, spaces.Box):
            dim = int(np.prod(inner.shape))
            return AgentSpec((dim + action.n,), action, action_mask=action.n)
    raise EnvError(f"{env_id}: observation space {obs_space} is not supported (Box, Discrete, "
                   "or a Dict of a Box 'observation' and an 'action_mask')")


def _encode(spec: AgentSpec, obs_space: spaces.Space[Any], raw: Any) -> np.ndarray:
    if spec.action_mask:
        flat = np.asarray(raw["observation"], dtype=np.float32).reshape(-1)
        return np.concatenate([flat, np.asarray(raw["action_mask"], dtype=np.float32)])
    if isinstance(obs_space, spaces.Discrete):
        one_hot = np.zeros(spec.obs_shape, dtype=np.float32)
        one_hot[int(raw) - int(obs_space.start)] = 1.0
        return one_hot
    return np.asarray(raw, dtype=np.float32)


def _is_active(spec: AgentSpec, row: np.ndarray) -> bool:
    return not spec.action_mask or bool(row[-spec.action_mask:].any())


class PettingZooVecEnv:
    """``num_envs`` copies of a PettingZoo parallel env (see the module docstring).

    ``get_state`` saves each copy's ``np_random`` state where it has one, not the game
    state; resume with ``set_state(s)`` then ``reset()``. The games run on the host;
    each step's tensors cross to ``device`` in one transfer.
    """

    def __init__(self, env_fn: ParallelEnvFn, num_envs: int, seed: int | None = None,
                 env_id: str = "pettingzoo", device: str | torch.device = "cpu") -> None:
        if num_envs < 1:
            raise EnvError(f"num_envs must be >= 1, got {num_envs}")
        try:
            self.envs = [env_fn() for _ in range(num_envs)]
        except TypeError as e:  # almost always env_kwargs the env does not take
            raise EnvError(f"{env_id} could not be made ({e}); check env_kwargs against the "
                           "env's constructor") from None
        first = self.envs[0]
        self.agents: tuple[str, ...] = tuple(first.possible_agents)
        self._obs_spaces = {a: first.observation_space(a) for a in self.agents}
        self._act_spaces = {a: first.action_space(a) for a in self.agents}
        specs = {a: _agent_spec(env_id, self._obs_spaces[a], self._act_spaces[a])
                 for a in self.agents}
        self.spec = MultiAgentSpec(env_id, self.agents, specs)
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._pending_seed = seed
        self.active: dict[str, Tensor] = {
            a: torch.zeros(num_envs, dtype=torch.bool, device=self.device) for a in self.agents}

    def _blank(self) -> dict[str, np.ndarray]:
        return {a: np.zeros((self.num_envs, *s.obs_shape), np.float32)
                for a, s in self.spec.agent_specs.items()}

    def _write(self, out: dict[str, np.ndarray], active: dict[str, np.ndarray], i: int,
               raw_obs: Mapping[str, Any]) -> None:
        """Row ``i`` of every agent's observation and activity after a step or reset."""
        for a in self.agents:
            out[a][i] = 0.0
            active[a][i] = False
        for a, raw in raw_obs.items():
            out[a][i] = _encode(self.spec.agent_specs[a], self._obs_spaces[a], raw)
        turn = _turn(self.envs[i])
        for a in self.envs[i].agents:
            active[a][i] = (_is_active(self.spec.agent_specs[a], out[a][i])
                            and turn in (None, a))

    def reset(self, seed: int | None = None) -> dict[str, Tensor]:
        """Reset every copy; ``seed`` (or the constructor's, once) seeds copy ``i`` with
        ``seed + i``. Returns ``{agent: [N, *obs]}``; ``self.active`` says who acts."""
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        obs = self._blank()
        active = {a: np.zeros(self.num_envs, bool) for a in self.agents}
        for i, env in enumerate(self.envs):
            raw, _ = env.reset(seed=None if seed is None else seed + i)
            self._write(obs, active, i, raw)
        moved = iter(arrays_to_device([*active.values(), *obs.values()], self.device))
        self.active = {a: next(moved) for a in active}
        return {a: next(moved) for a in obs}

    def _action(self, agent: str, value: np.ndarray) -> Any:
        space = self._act_spaces[agent]
        if isinstance(space, spaces.Discrete):
            return int(value) + int(space.start)
        assert isinstance(space, spaces.Box)
        return np.clip(value, space.low, space.high).astype(space.dtype)

    def step(self, actions: Mapping[str, Tensor]) -> MultiAgentStep:
        """Step every copy with ``{agent: [N] or [N, *act]}`` (actions of agents that are
        not active are ignored); ended episodes are reset in the same call."""
        acts = {a: actions[a].detach().cpu().numpy() for a in self.agents}
        n = self.num_envs
        obs = self._blank()
        reward = {a: np.zeros(n, np.float32) for a in self.agents}
        term = {a: np.zeros(n, bool) for a in self.agents}
        trunc = {a: np.zeros(n, bool) for a in self.agents}
        over = np.zeros(n, bool)
        active = {a: np.zeros(n, bool) for a in self.agents}
        finals: list[tuple[int, dict[str, np.ndarray]]] = []
        for i, env in enumerate(self.envs):
            live = list(env.agents)
            raw, rew, te, tr, _ = env.step({a: self._action(a, acts[a][i]) for a in live})
            self._write(obs, active, i, raw)
            for a, r in rew.items():
                reward[a][i] = r
            for a in live:
                term[a][i] = bool(te.get(a, False))
                trunc[a][i] = bool(tr.get(a, False)) and not term[a][i]
            if not env.agents:  # the episode is over for everyone: reset in this step
                over[i] = True
                for a in live:  # an env that drops agents without a flag cut their episode
                    trunc[a][i] |= not term[a][i]
                finals.append((i, {a: obs[a][i].copy() for a in self.agents}))
                raw, _ = env.reset()
                self._write(obs, active, i, raw)
        final_obs = {a: o.copy() for a, o in obs.items()}
        for i, rows in finals:
            for a, row in rows.items():
                final_obs[a][i] = row
        fields = (obs, reward, term, trunc, final_obs, active)
        moved = iter(arrays_to_device([x for f in fields for x in f.values()], self.device))
        obs_t, reward_t, term_t, trunc_t, final_t, self.active = (
            {a: next(moved) for a in f} for f in fields)
        return MultiAgentStep(obs_t, reward_t, term_t, trunc_t, final_t, self.active,
                              torch.from_numpy(over))

    def get_state(self) -> dict[str, Any]:
        """RNG states only (see the class docstring)."""
        return {"np_random": [_rng_state(env) for env in self.envs]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        rngs = state["np_random"]
        if len(rngs) != self.num_envs:
            raise EnvError(f"saved state holds {len(rngs)} envs but this one has "
                           f"num_envs={self.num_envs}; create it with the saved num_envs")
        for env, rng in zip(self.envs, rngs, strict=True):
            if rng is not None:
                holder = _rng_holder(env)
                bit_gen = getattr(np.random, rng["bit_generator"])()
                bit_gen.state = rng
                holder.np_random = np.random.Generator(bit_gen)
        self._pending_seed = None

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _turn(env: Any) -> str | None:
    """The agent whose move it is in a turn-based game (``turn_based_aec_to_parallel``:
    only its action counts, mask or no mask); None in a parallel env."""
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel_wrapper

    if isinstance(env, turn_based_aec_to_parallel_wrapper):
        return str(env.aec_env.agent_selection)
    return None


def _rng_holder(env: Any) -> Any:
    inner = getattr(env, "aec_env", env)  # turn_based_aec_to_parallel keeps the AEC env
    return getattr(inner, "unwrapped", inner)


def _rng_state(env: Any) -> dict[str, Any] | None:
    rng = getattr(_rng_holder(env), "np_random", None)
    return dict(rng.bit_generator.state) if isinstance(rng, np.random.Generator) else None


def make_multi_agent_env(env_id: str, num_envs: int, seed: int | None = None,
                         env_kwargs: Mapping[str, Any] | None = None,
                         device: str | torch.device = "cpu") -> PettingZooVecEnv:
    """``num_envs`` copies of the PettingZoo env ``env_id`` as one batched env."""
    return PettingZooVecEnv(pettingzoo_factory(env_id, env_kwargs), num_envs, seed, env_id,
                            device)


def multi_agent_spec(env_id: str, env_kwargs: Mapping[str, Any] | None = None
                     ) -> MultiAgentSpec:
    """The spec of ``env_id`` from one instance, made and closed."""
    env = make_multi_agent_env(env_id, 1, env_kwargs=env_kwargs)
    try:
        return env.spec
    finally:
        env.close()


def random_actions(spec: AgentSpec, obs: Tensor, generator: torch.Generator) -> Tensor:
    """Uniformly random actions for ``obs`` ``[B, *obs]``, legal ones only where the agent
    has an action mask (any action where the mask is empty: the agent is not to move).
    Drawn on the generator's device, which is ``obs``'s."""
    b, device = obs.shape[0], generator.device
    if isinstance(spec.action_space, Box):
        space = spec.action_space
        return sample_box(space.low, space.high, tuple(space.shape), b, generator)
    noise = torch.rand((b, spec.action_space.n), generator=generator, device=device)
    if spec.action_mask:
        noise = noise.masked_fill(~legal_actions(obs.flatten(1), spec.action_mask), -1.0)
    return noise.argmax(-1)
