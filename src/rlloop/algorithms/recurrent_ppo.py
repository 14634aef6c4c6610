"""Recurrent PPO: PPO whose policy carries an LSTM or GRU state (``ppo.recurrent``).

What changes against feed-forward PPO, and nothing else:

* Collection carries one recurrent state per env across steps *and* rollouts, zeroes it
  where an episode starts, and stores the state entering every step with the rollout.
* Values for GAE come from one unroll over the rollout (the bootstrap value of a
  truncated episode continues from the state its last step left).
* Training runs on sequences of ``seq_len`` steps (:mod:`rlloop.data.sequences`) starting
  from their stored states; minibatches shuffle whole sequences and the loss masks out
  padding.
* Acting (evaluation, ``rlloop eval``, videos) carries its own state, reset by
  :meth:`~RecurrentPPO.begin_episodes`; the training state and its episode-start flags are
  checkpointed, so a run cut mid-episode resumes exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.ppo import PPO, PPOLearner
from rlloop.config.ppo import PPOConfig
from rlloop.data.rollout import RolloutBatch
from rlloop.data.sequences import chunk_states, sequence_mask, to_sequences
from rlloop.errors import ConfigError
from rlloop.losses.ppo import PPOLossConfig, ppo_loss
from rlloop.modules.distributions import ActionDist
from rlloop.modules.recurrent import RecurrentActorCritic


class RecurrentPPOLearner(PPOLearner):
    """PPO's optimiser and loss on minibatches of sequences (a :class:`RolloutBatch` with
    ``starts``, ``mask`` and ``state``): each sequence is
    unrolled from its stored state (gradients flow through its ``seq_len`` steps) and the
    loss averages over real steps only."""

    def micro_batch_rows(self, setting: int | Literal["auto"] | None) -> int | None:
        return None  # its loss averages over real steps, not rows: whole minibatches

    def prepare_minibatch(self, module_id: str, batch: RolloutBatch
                          ) -> RolloutBatch:
        return batch  # the loss standardises over real steps only (padding left out)

    def forward_train(self, module_id: str, batch: RolloutBatch
                      ) -> tuple[ActionDist, Tensor]:
        module = self.modules[module_id]
        assert isinstance(module, RecurrentActorCritic)
        assert batch.state is not None and batch.starts is not None, "needs sequences"
        feats, _ = module.unroll(batch.obs, batch.state, batch.starts)
        feats = feats.flatten(0, 1)
        return module.dist(feats), module.value(feats)

    def compute_loss_for_module(self, module_id: str, config: PPOConfig,  # type: ignore[override]
                                batch: RolloutBatch,
                                fwd_out: tuple[ActionDist, Tensor] | None = None,
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        dist, values = fwd_out or self.forward_train(module_id, batch)
        assert batch.mask is not None, "needs sequences"
        actions = batch.actions.flatten(0, 1)
        actions = actions.flatten(1) if actions.dim() > 1 else actions
        cfg = PPOLossConfig(self.hyperparameter(module_id, "clip_coef"), config.vf_coef,
                            self.hyperparameter(module_id, "ent_coef"), config.clip_vf,
                            config.normalize_advantages)
        return ppo_loss(dist.log_prob(actions), batch.log_probs.flatten(),
                        batch.advantages.flatten(), values, batch.values.flatten(),
                        batch.returns.flatten(), dist.entropy(), cfg, mask=batch.mask.flatten())


class RecurrentPPO(PPO):
    """PPO with a recurrent policy; built by :func:`build_ppo` when ``ppo.recurrent`` is set.

    State (besides PPO's): ``state`` ``[N, S]``, each training env's recurrent state after
    its last step, and ``starts`` ``[N]``, whether the runner's current observation begins
    an episode (its state is then zeroed before use).
    """

    learner_cls: ClassVar[type[PPOLearner]] = RecurrentPPOLearner
    policy: RecurrentActorCritic
    supports_dict_obs = False
    #: Rollout scratch (rewritten by every collect) and the acting state, which every
    #: evaluation starts afresh.
    transient_attrs: ClassVar[frozenset[str]] = frozenset(
        {"buffer", "rollout_states", "rollout_starts", "_act_state", "_act_starts", "_t"})

    def __init__(self, config: PPOConfig, env: EnvSettings) -> None:
        super().__init__(config, env)
        n, t, d = self.env.num_envs, config.rollout_steps, self.device
        size = self.policy.state_size
        self.state = self.policy.initial_state(n, d)
        self.starts = torch.ones(n, dtype=torch.bool, device=d)
        self.rollout_states = torch.zeros((t, n, size), device=d)
        self.rollout_starts = torch.zeros((t, n), dtype=torch.bool, device=d)
        self._act_state: Tensor | None = None
        self._act_starts: Tensor | None = None
        self._t = 0

    def _policy_factory(self) -> Callable[[], nn.Module]:
        spec, cfg = self.env.spec, self.config
        kind = cfg.recurrent
        assert kind is not None
        if self.mask_dims:
            raise ConfigError(f"recurrent PPO does not mask actions yet, but {spec.env_id} "
                              "gives action masks; set ppo.action_mask=false")

        def build() -> RecurrentActorCritic:
            encoder = self._encoder()  # the Nature CNN for pixels, else the flat input
            return RecurrentActorCritic(
                spec.obs_shape, spec.action_space, kind, cfg.recurrent_hidden, cfg.hidden,
                cfg.activation, cfg.init_log_std, encoder=encoder,
                feature_dim=None if encoder is None else encoder.out_dim)

        return build

    # ---- collection ------------------------------------------------------------------
    def _behaviour(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        t, buf = self._t, self.buffer
        # The runner wrote step t-1's flags before asking for step t's actions.
        starts = self.starts if t == 0 else buf.terminated[t - 1] | buf.truncated[t - 1]
        self.rollout_states[t] = self.state
        self.rollout_starts[t] = starts
        feats, self.state = self.policy.step(obs, self.state, starts)
        self._t = t + 1
        return self.policy.act(feats, generator=self.generator)

    def collect(self) -> dict[str, float]:
        self._t = 0
        stats = super().collect()
        self.starts = self.buffer.terminated[-1] | self.buffer.truncated[-1]
        return stats

    def episodes_restarted(self) -> None:
        super().episodes_restarted()
        self.starts = torch.ones_like(self.starts)  # memory starts afresh with them

    # ---- update ----------------------------------------------------------------------
    def update(self, env_steps: int) -> dict[str, float]:
        self.learner.before_gradient_based_update(env_steps)
        cfg = self.config

        def kl_stop(stats: dict[str, Tensor]) -> bool:
            return cfg.target_kl is not None and float(stats["ppo/approx_kl"]) > cfg.target_kl

        return self.learner.update_from_batch(
            {"default_policy": self._batch()}, num_epochs=cfg.num_epochs,
            minibatch_size=max(1, cfg.minibatch_size // cfg.seq_len),
            generator=self.generator, stop=kl_stop)

    @torch.no_grad()
    def _batch(self) -> RolloutBatch:
        buf, policy, length = self.buffer, self.policy, self.config.seq_len
        t, n = buf.steps, buf.num_envs
        obs = buf.obs[:]  # a view: recurrent PPO takes no Dict observations
        feats, after = policy.unroll(obs.transpose(0, 1), self.rollout_states[0],
                                     self.rollout_starts.T)  # [N, T, H], [N, T, S]
        last, _ = policy.step(self.runner.obs, self.state, self.starts)
        # A truncated episode's final observation continues from the state its step left.
        final, _ = policy.step(buf.next_obs[:].transpose(0, 1).flatten(0, 1), after.flatten(0, 1))
        values_all = policy.value(torch.cat([feats.flatten(0, 1), last, final]))
        values = values_all[: n * t].view(n, t).T
        next_values = torch.cat([values[1:], values_all[n * t: n * (t + 1)].unsqueeze(0)])
        next_values = torch.where(buf.truncated, values_all[n * (t + 1):].view(n, t).T,
                                  next_values)
        adv, ret = self._advantages(values, next_values)

        def seq(x: Tensor) -> Tensor:
            return to_sequences(x, length)

        return RolloutBatch(seq(obs), seq(buf.actions), seq(buf.log_probs), seq(adv),
                            seq(ret), seq(values), starts=seq(self.rollout_starts),
                            mask=sequence_mask(t, n, length, self.device),
                            state=chunk_states(self.rollout_states, length))

    # ---- acting ----------------------------------------------------------------------
    def begin_episodes(self, starts: Tensor) -> None:
        self._act_starts = starts

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions for ``obs`` ``[B, *obs]``, carrying the acting state from the previous
        call (a fresh zero state when ``B`` changes); see :meth:`begin_episodes`."""
        if self._act_state is None or self._act_state.shape[0] != obs.shape[0]:
            self._act_state = self.policy.initial_state(obs.shape[0], self.device)
        feats, self._act_state = self.policy.step(obs, self._act_state, self._act_starts)
        self._act_starts = None
        return self.policy.act(feats, deterministic=deterministic,
                                     generator=self.generator)[0]

    # ---- state -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["recurrent"] = {"state": self.state.clone(), "starts": self.starts.clone()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        # New tensors, not copy_(): the current ones may be inference tensors (collect).
        # Before the base class's, which restarts them where the episodes restart.
        self.state = state["recurrent"]["state"].to(self.device, copy=True)
        self.starts = state["recurrent"]["starts"].to(self.device, dtype=torch.bool, copy=True)
        super().set_state(state)


def build_ppo(config: PPOConfig, env: EnvSettings) -> PPO:
    """PPO, or :class:`RecurrentPPO` when ``config.recurrent`` names a cell."""
    return RecurrentPPO(config, env) if config.recurrent else PPO(config, env)
