"""Multi-agent PPO on PettingZoo envs: several modules in one learner.

Three ways to map agents to modules (``policy_mapping``):

- ``shared``: one module, ``default_policy``, acts for every agent (parameter sharing);
- ``independent``: one module per agent, named after it (independent learners);
- a self-play league (``league_every > 0``, two-player envs): the module ``main`` plays
  frozen snapshots of itself (see :mod:`rlloop.algorithms.league`), and only it is trained.

Each module learns with PPO on the samples where its agents acted (:func:`masked_gae`
credits rewards that arrive on the opponent's turn to the agent's last move).
Evaluation plays a *focal* agent, each seat in turn, against random opponents
(``eval_opponent="random"``) or against the other agents' own modules.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import (
    EVAL_SEED_OFFSET,
    EnvSettings,
    counted_once_made,
    horizon_starts,
)
from rlloop.algorithms.league import MAIN, League
from rlloop.algorithms.ppo import PPOLearner
from rlloop.config.ppo import MultiAgentPPOConfig as MultiAgentPPOConfig
from rlloop.data.multi_agent import (
    AgentRollout,
    WaitingDecisions,
    masked_gae,
    waiting_decisions,
    waiting_rows,
    with_waiting,
)
from rlloop.data.rollout import RolloutBatch
from rlloop.envs.core import Box
from rlloop.envs.multi_agent import AgentSpec, PettingZooVecEnv, make_multi_agent_env
from rlloop.errors import ConfigError, saved_count
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.encoders import build_encoder
from rlloop.modules.masked import MaskedActorCritic
from rlloop.runners.multi_agent import RANDOM, MultiAgentRunner, evaluate_multi_agent
from rlloop.system.devices import build_module, new_generator, resolve_device, set_generator_state
from rlloop.system.seeding import derive_seed, seed_global_rngs


class MultiAgentPPO:
    """Collect ``rollout_steps`` x ``num_envs`` steps of all agents, then PPO per module."""

    name = "ma_ppo"
    #: Scratch storage, fully rewritten by every collect before it is read: not state.
    transient_attrs: ClassVar[frozenset[str]] = frozenset({"rollout"})

    def __init__(self, config: MultiAgentPPOConfig, settings: EnvSettings) -> None:
        if settings.backend != "auto":  # it was recorded in config.yaml and not used
            raise ConfigError(f"ma_ppo steps its PettingZoo envs in this process; "
                              f"--backend {settings.backend} does not apply to it: leave "
                              "the flag out")
        config.check_batch(settings.num_envs)
        self.config, self.settings = config, settings
        self.device = resolve_device(settings.device)
        seed_global_rngs(settings.seed)
        self.generator = new_generator(self.device, derive_seed(settings.seed, "algorithm"))
        self.env_config: dict[str, Any] = {}
        self.env = self._make_env(settings.num_envs, settings.seed, {})
        self.spec = self.env.spec
        self.league = League(config.league_every, config.league_size) \
            if config.league_every else None
        modules, self.mapping = self._plan()
        train = [MAIN] if self.league else config.policies_to_train
        unknown = set(train or ()) - set(modules)
        if unknown:
            raise ConfigError(f"ma_ppo.policies_to_train names unknown modules {sorted(unknown)};"
                              f" this run has {sorted(modules)}")
        self.learner = PPOLearner(
            {m: self._make_module(spec) for m, spec in modules.items()}, config,
            on_nonfinite=settings.on_nonfinite,  # type: ignore[arg-type]
            policies_to_train=train, stats_prefix="always" if self.league else "auto")
        self.runner = MultiAgentRunner(self.env, self.mapping, seed=settings.seed)
        self.rollout = {a: self._rollout(s) for a, s in self.spec.agent_specs.items()}
        self._forget_waiting()
        self._eval_envs: dict[int, PettingZooVecEnv] = {}
        self.evals = 0
        self.iterations = 0

    # ---- set-up ------------------------------------------------------------------------
    def _make_env(self, num_envs: int, seed: int, extra: dict[str, Any]) -> PettingZooVecEnv:
        s = self.settings
        return make_multi_agent_env(s.env_id, num_envs, seed=seed,
                                    env_kwargs={**s.env_kwargs, **extra}, device=self.device)

    def _plan(self) -> tuple[dict[str, AgentSpec], Any]:
        """The initial modules (id -> the agent spec they are built for) and the mapping."""
        agents, specs = self.spec.agents, self.spec.agent_specs
        if self.config.policy_mapping == "independent" and not self.league:
            return dict(specs), lambda agent, episode: agent
        if len(set(specs.values())) != 1:
            fix = ("a self-play league needs agents with the same spaces" if self.league
                   else "use ma_ppo.policy_mapping=independent")
            raise ConfigError(f"{self.spec.env_id}: agents have different spaces, so they "
                              f"cannot share one module; {fix}")
        if self.league:
            if len(agents) != 2:
                raise ConfigError(f"a self-play league needs a two-player env; "
                                  f"{self.spec.env_id} has agents {list(agents)}")
            return {MAIN: specs[agents[0]]}, self.league.mapping(agents, self.generator)
        return {DEFAULT_MODULE_ID: specs[agents[0]]}, lambda agent, episode: DEFAULT_MODULE_ID

    def _make_module(self, spec: AgentSpec) -> nn.Module:
        cfg = self.config

        def build() -> nn.Module:
            if spec.action_mask:
                return MaskedActorCritic(spec.obs_shape, spec.action_space,  # type: ignore[arg-type]
                                         spec.action_mask, cfg.hidden, cfg.activation)
            # PettingZoo observations reach rlloop as float vectors: "auto" is the MLP.
            return ActorCritic(spec.obs_shape, spec.action_space, cfg.hidden, cfg.activation,
                               cfg.init_log_std, build_encoder(
                                   cfg.section, cfg.encoder, spec.obs_shape, image=False,
                                   cnn_precision=cfg.cnn_precision))

        return build_module(build, self.device)

    def _rollout(self, spec: AgentSpec) -> AgentRollout:
        space = spec.action_space
        shape = space.shape if isinstance(space, Box) else ()
        dtype = torch.float32 if isinstance(space, Box) else torch.int64
        return AgentRollout(self.config.rollout_steps, self.env.num_envs, spec.obs_shape,
                            shape, dtype, self.device)

    def focal_module(self, agent: str) -> str:
        """The module that plays ``agent`` in evaluations."""
        if self.league:
            return MAIN
        return agent if self.config.policy_mapping == "independent" else DEFAULT_MODULE_ID

    # ---- the trainer's protocol ----------------------------------------------------------
    @property
    def horizons_per_env_reset(self) -> int:
        return self.settings.horizons_per_env_reset

    def begin_horizon(self, collects: int, env_config: dict[str, Any] | None) -> None:
        """Reset the envs at ``horizons_per_env_reset`` boundaries (rl8 semantics)."""
        if not horizon_starts(collects, self.horizons_per_env_reset):
            return
        config = dict(env_config or {})
        if config != self.env_config:
            self._rebuild_env(config, self.settings.seed + collects)
        elif collects:
            self._restart_episodes(self.settings.seed + collects)

    def _forget_waiting(self) -> None:
        """Episodes restarted: no decision of theirs waits for its outcome any more."""
        self._waiting = {a: WaitingDecisions.none(r) for a, r in self.rollout.items()}

    def _rebuild_env(self, env_config: dict[str, Any], seed: int) -> None:
        """The envs made again with ``env_config``, their episodes started from ``seed``."""
        self.env.close()
        self.env = self.runner.env = self._make_env(self.settings.num_envs,
                                                    self.settings.seed, env_config)
        self.env_config = env_config
        self._restart_episodes(seed)

    def _restart_episodes(self, seed: int) -> None:
        """Every env starts a new episode from ``seed``: nothing of the old ones waits."""
        self.runner._restart(self.env.reset(seed=seed))
        self._forget_waiting()

    def _policy(self, deterministic: bool):  # type: ignore[no-untyped-def]
        def act(module_id: str, obs: Tensor) -> tuple[Tensor, Tensor]:
            module = self.learner.modules[module_id]
            return module.act(obs, deterministic=deterministic,  # type: ignore[operator]
                              generator=self.generator)

        return act

    def collect(self) -> dict[str, float]:
        steps = self.runner.collect(self._policy(False), self.rollout, self.generator)
        stats = self.runner.stats(self.learner.modules)
        return {"env/steps": float(steps), **stats}

    def update(self, env_steps: int) -> dict[str, float]:
        self.iterations += 1
        self.learner.before_gradient_based_update(env_steps)
        cfg = self.config

        def kl_stop(stats: dict[str, Tensor]) -> bool:
            kls = [float(v) for k, v in stats.items() if k.endswith("ppo/approx_kl")]
            return cfg.target_kl is not None and bool(kls) and max(kls) > cfg.target_kl

        stats = self.learner.update_from_batch(
            self._batch(), num_epochs=cfg.num_epochs, minibatch_size=cfg.minibatch_size,
            generator=self.generator, stop=kl_stop)
        if self.league is not None:
            if self.league.due(self.iterations):
                self._snapshot()
            stats["league/size"] = float(len(self.league.snapshots))
        return stats

    @torch.no_grad()
    def _batch(self) -> dict[str, RolloutBatch]:
        """Per trained module, the active samples of every agent it played.

        An agent's last decision whose episode goes on while the agent waits for its turn
        (turn-based games) is left to the next rollout, which holds the rewards that still
        reach it and its next decision's value (`WaitingDecisions`); the decisions that
        waited from the last rollout are trained here."""
        cfg, table, learner = self.config, self.runner.module_table, self.learner
        trained = {m for m in learner.modules if learner.should_module_be_updated(m)}
        parts: dict[str, list[RolloutBatch]] = {}
        for agent, rollout in self.rollout.items():
            buf = with_waiting(rollout, self._waiting[agent])
            values, final_values = torch.zeros_like(buf.rewards), torch.zeros_like(buf.rewards)
            # Values where GAE reads them: decisions, and final observations. (Rows where
            # the agent did not act may hold another module's tag: a placeholder row
            # tagged 0, which a module for other observation shapes cannot read.)
            read = buf.active | buf.truncated
            for k in buf.module[read].unique().tolist():
                if table[k] not in learner.modules:  # the random player or a removed snapshot
                    continue
                module, rows = learner.modules[table[k]], (buf.module == k) & read
                values[rows] = module.value(buf.obs[rows])  # type: ignore[operator]
                cut = rows & buf.truncated
                if bool(cut.any()):
                    final_values[cut] = module.value(buf.final_obs[cut])  # type: ignore[operator]
            last = torch.zeros(self.env.num_envs, device=self.device)
            for m, groups in self.runner.assignment.groups().items():
                for a, rows in groups:
                    if a == agent and m in learner.modules:
                        last[rows] = learner.modules[m].value(  # type: ignore[operator]
                            self.runner.obs[agent][rows])
            waiting = waiting_rows(buf, self.env.active[agent])
            self._waiting[agent] = waiting_decisions(buf, waiting)
            adv, ret = masked_gae(buf.rewards, values, final_values, last, buf.terminated,
                                  buf.truncated, buf.active, cfg.gamma, cfg.gae_lambda,
                                  waiting)
            for m in trained:
                if m not in table:
                    continue
                sel = (buf.module == table.index(m)) & buf.active & ~waiting
                if bool(sel.any()):
                    parts.setdefault(m, []).append(RolloutBatch(
                        buf.obs[sel], buf.actions[sel], buf.log_probs[sel], adv[sel],
                        ret[sel], values[sel]))
        return {m: _cat(batches) for m, batches in parts.items()}

    def _snapshot(self) -> None:
        assert self.league is not None
        new, gone = self.league.add()
        self._add_snapshot(new)
        if gone is not None:
            self.learner.remove_module(gone)
            self.runner.assignment.replace(gone, new)

    def _add_snapshot(self, module_id: str) -> None:
        snapshot = self._make_module(self.spec.agent_specs[self.spec.agents[0]])
        snapshot.load_state_dict(self.learner.modules[MAIN].state_dict())
        self.learner.add_module(module_id, snapshot.requires_grad_(False))

    @torch.no_grad()
    def act(self, obs: dict[str, Tensor], deterministic: bool = True) -> dict[str, Tensor]:
        """Actions of every agent's focal module for ``{agent: [N, *obs]}``."""
        policy = self._policy(deterministic)
        return {a: policy(self.focal_module(a), o)[0] for a, o in obs.items()}

    def evaluate(self, episodes: int, env_config: dict[str, Any] | None = None,
                 deterministic: bool = True) -> dict[str, float]:
        """Focal agents (each seat in turn) vs ``eval_opponent``; ``return_mean`` etc."""
        if env_config:
            raise ConfigError("ma_ppo evaluations take no env config; drop the eval env config")
        n = min(episodes, 32)
        if n not in self._eval_envs:
            self._eval_envs[n] = self._make_env(n, self.settings.seed + EVAL_SEED_OFFSET, {})
        opponent = RANDOM if self.config.eval_opponent == "random" else None
        with counted_once_made(self) as seed:
            # Its own generator: evaluating never shifts the training draws.
            generator = new_generator(self.device, derive_seed(seed, "evaluation"))
            return evaluate_multi_agent(
                self._eval_envs[n], self._policy(deterministic), self.focal_module, opponent,
                episodes, generator, seed=seed)

    def pop_times(self) -> dict[str, float]:
        return self.runner.pop_times()

    # ---- state ---------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "generator": self.generator.get_state(), "runner": self.runner.get_state(),
            "learner": self.learner.get_state(), "evals": self.evals,
            "iterations": self.iterations, "env_config": self.env_config}
        if self.league is not None:
            state["league"] = self.league.get_state()
        return state

    def _restore_league(self, state: dict[str, Any]) -> None:
        """Make the learner hold exactly the saved league's snapshot modules."""
        if self.league is None or "league" not in state:
            return
        self.league.set_state(state["league"])
        for m in [m for m in self.learner.modules if m != MAIN]:
            if m not in self.league.snapshots:
                self.learner.remove_module(m)
        for m in self.league.snapshots:
            if m not in self.learner.modules:
                self._add_snapshot(m)

    def set_state(self, state: dict[str, Any]) -> None:
        self._restore_league(state)
        self.learner.set_state(state["learner"])
        set_generator_state(self.generator, state["generator"],
                            derive_seed(self.settings.seed, "algorithm-resumed"))
        self.evals = saved_count(state["evals"], "algorithm.evals")
        self.iterations = saved_count(state["iterations"], "algorithm.iterations")
        env_config = dict(state.get("env_config", {}))
        if env_config != self.env_config:  # made with the run's env_kwargs alone so far
            self._rebuild_env(env_config, self.settings.seed)
        self.runner.set_state(state["runner"])  # the episodes restart
        self._forget_waiting()

    def get_policy_state(self) -> dict[str, Any]:
        """What acting needs (the modules, the league's ids), for :meth:`set_policy_state`."""
        state: dict[str, Any] = {"learner": self.learner.get_state(components="module")}
        if self.league is not None:
            state["league"] = self.league.get_state()
        return state

    def set_policy_state(self, state: dict[str, Any]) -> None:
        """Load only what acting needs (the modules) from ``get_state()``."""
        self._restore_league(state)
        self.learner.set_state({"module": state["learner"]["module"]})

    def export_weights(self) -> dict[str, Tensor]:
        return {f"{m}.{k}": v for m, mod in self.learner.modules.items()
                for k, v in mod.state_dict().items()}

    def close(self) -> None:
        self.env.close()
        for env in self._eval_envs.values():
            env.close()
        self._eval_envs.clear()


def _cat(batches: list[RolloutBatch]) -> RolloutBatch:
    """One flat batch of the rows of ``batches`` (flat too: no sequence fields)."""
    def cat(name: str) -> Tensor:
        return torch.cat([getattr(b, name) for b in batches])

    return RolloutBatch(cat("obs"), cat("actions"), cat("log_probs"), cat("advantages"),
                        cat("returns"), cat("values"))
