"""PPO: config, learner and the collect/update algorithm wired from rlloop's parts (A2C
subclasses it, with its own learner and update)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import AlgorithmBase, EnvSettings
from rlloop.config.gradient_clip import GradientClip
from rlloop.config.on_policy import OnPolicyConfig
from rlloop.config.ppo import AUTO_MICRO_BATCH as AUTO_MICRO_BATCH
from rlloop.config.ppo import PPOConfig as PPOConfig
from rlloop.config.schedules import learning_rate
from rlloop.data.obs_storage import ObsLayout
from rlloop.data.returns import gae
from rlloop.data.rollout import RolloutBatch, RolloutBuffer
from rlloop.envs.action_masks import resolve_action_mask
from rlloop.envs.core import Box, EnvSpec
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.envs.wrappers import discounted_reward_scale
from rlloop.errors import ConfigError
from rlloop.learners.adam import Adam
from rlloop.learners.learner import DEFAULT_MODULE_ID, Learner, PoliciesToTrain
from rlloop.losses.ppo import PPOLossConfig, ppo_loss, standardize
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.custom import resolve_net
from rlloop.modules.distributions import ActionDist
from rlloop.modules.encoders import DictEncoder, Encoder, NatureCNN, NetInput, build_encoder
from rlloop.modules.masked import MaskedActorCritic
from rlloop.runners.graphed import GraphedCollect
from rlloop.system.devices import build_module, resolve_device, stats_dtype

#: A minibatch's loss with :func:`~rlloop.losses.ppo.ppo_loss`'s arguments (and meaning).
PPOLossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]


class PPOLearner(Learner[RolloutBatch]):
    """Adam per module; the clipped-surrogate loss of :func:`rlloop.losses.ppo.ppo_loss`.

    ``clip_coef`` and ``ent_coef`` are scheduled hyperparameters: their current values are
    read on every minibatch and logged with every update.
    """

    #: The compiled loss's coefficient tensors: filled from the schedules before every use.
    transient_attrs: ClassVar[frozenset[str]] = frozenset({"_coefs"})
    #: The loss of a minibatch, ``ppo_loss``'s signature (APPO's learner runs ``appo_loss``).
    loss_fn: ClassVar[PPOLossFn] = staticmethod(ppo_loss)

    def __init__(self, modules: Mapping[str, nn.Module], config: PPOConfig,
                 on_nonfinite: Literal["skip", "raise"] = "skip", *,
                 policies_to_train: PoliciesToTrain = None,
                 stats_prefix: Literal["auto", "always"] = "auto") -> None:
        super().__init__(modules, config, on_nonfinite=on_nonfinite,  # type: ignore[arg-type]
                         policies_to_train=policies_to_train, stats_prefix=stats_prefix)
        self.micro_batch = self.micro_batch_rows(config.micro_batch)
        #: ``ppo.compile``: :func:`_module_loss` through ``torch.compile`` (built on first use).
        self._compiled_loss: Callable[..., tuple[Tensor, dict[str, Tensor]]] | None = None
        self._coefs: dict[tuple[str, str], Tensor] = {}  # its scheduled coefficients

    def micro_batch_rows(self, setting: int | Literal["auto"] | None) -> int | None:
        """``ppo.micro_batch`` resolved on the modules' device."""
        if setting != "auto":
            return setting
        params = next(iter(self.modules.parameters()), None)
        return AUTO_MICRO_BATCH if params is None or params.device.type == "cpu" else None

    def prepare_minibatch(self, module_id: str, batch: RolloutBatch) -> RolloutBatch:
        """Advantages standardised over the whole minibatch (when normalize_advantages is
        on), before it is split into micro-batches or shards."""
        adv = batch.advantages
        if not self.config.normalize_advantages or adv.numel() <= 1:
            return batch
        return dataclasses.replace(batch, advantages=standardize(adv))

    def configure_optimizers_for_module(self, module_id: str, config: PPOConfig) -> None:
        params = list(self.modules[module_id].parameters())
        self.register_optimizer(module_id, "default",
                                Adam(params, lr=config.lr, eps=config.adam_eps, fused=True),
                                params, learning_rate(config.lr, config.lr_schedule,
                                                      config.lr_decay_steps),
                                GradientClip(config.max_grad_norm, config.grad_clip_by))
        self.register_hyperparameter(module_id, "clip_coef", config.clip_coef)
        self.register_hyperparameter(module_id, "ent_coef", config.ent_coef)

    def forward_train(self, module_id: str, batch: RolloutBatch
                      ) -> tuple[ActionDist, Tensor] | None:
        if self.config.compile:
            return None  # the compiled loss runs the module inside its own graph
        module = self.modules[module_id]
        assert isinstance(module, ActorCritic)
        return module.dist_value(batch.obs)

    def compute_loss_for_module(self, module_id: str, config: PPOConfig, batch: RolloutBatch,
                                fwd_out: tuple[ActionDist, Tensor] | None = None,
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        # prepare_minibatch has standardised the advantages
        coefs = (self.hyperparameter(module_id, "clip_coef"), config.vf_coef,
                 self.hyperparameter(module_id, "ent_coef"), config.clip_vf)
        if fwd_out is not None:
            return _loss_of(fwd_out, batch, self.loss_fn, *coefs)
        module = self.modules[module_id]
        if not self.config.compile:
            return _module_loss(module, batch, self.loss_fn, *coefs)
        if self._compiled_loss is None:
            # Built on first use: torch.compile imports torch._dynamo (about a second).
            self._compiled_loss = torch.compile(_module_loss)
        clip_coef, vf_coef, ent_coef, clip_vf = coefs
        return self._compiled_loss(module, batch, self.loss_fn,
                                   self._coef(module_id, "clip_coef", clip_coef),
                                   vf_coef, self._coef(module_id, "ent_coef", ent_coef), clip_vf)

    def _coef(self, module_id: str, name: str, value: float) -> Tensor:
        """A scheduled coefficient as a 0-dim tensor on the module's device, for the
        compiled loss: a float would be a constant of the graph, recompiled whenever a
        schedule moves it. Made once and filled in place (no host-to-device copy, which
        on a GPU would wait for the stream)."""
        key = (module_id, name)
        if key not in self._coefs:
            device = next(self.modules[module_id].parameters()).device
            self._coefs[key] = torch.zeros((), device=device)
        return self._coefs[key].fill_(value)


def _module_loss(module: nn.Module, batch: RolloutBatch, loss_fn: PPOLossFn,
                 clip_coef: float | Tensor, vf_coef: float, ent_coef: float | Tensor,
                 clip_vf: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of ``module`` on ``batch``, its forward pass included: the function
    ``ppo.compile`` compiles (forward, loss and, through autograd, their backward)."""
    assert isinstance(module, ActorCritic)
    return _loss_of(module.dist_value(batch.obs), batch, loss_fn, clip_coef, vf_coef, ent_coef,
                    clip_vf)


def _loss_of(fwd_out: tuple[ActionDist, Tensor], batch: RolloutBatch, loss_fn: PPOLossFn,
             clip_coef: float | Tensor, vf_coef: float, ent_coef: float | Tensor,
             clip_vf: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of a forward pass's ``(dist, values)`` on ``batch`` (advantages
    standardised already)."""
    dist, values = fwd_out
    actions = batch.actions.flatten(1) if batch.actions.dim() > 1 else batch.actions
    cfg = PPOLossConfig(clip_coef, vf_coef, ent_coef, clip_vf, normalize_advantages=False)
    return loss_fn(dist.log_prob(actions), batch.log_probs, batch.advantages, values,
                   batch.values, batch.returns, dist.entropy(), cfg)


def policy_factory(spec: EnvSpec, config: OnPolicyConfig, mask_dims: int,
                   features: Any = None) -> Callable[[], nn.Module]:
    """What builds PPO's feed-forward policy for ``spec`` (every learner rank builds its
    copy so): masked where ``mask_dims``, on ``features`` (a custom net) or an encoder."""
    if mask_dims:
        return lambda: MaskedActorCritic(
            spec.obs_shape, spec.action_space, mask_dims,  # type: ignore[arg-type]
            config.hidden, config.activation, features=features,
            ortho_init=config.ortho_init,
            # a Dict observation's entries are encoded (its mask is not)
            encoder=_encoder(spec, config) if spec.obs_parts and features is None else None)
    return lambda: ActorCritic(
        spec.obs_shape, spec.action_space, config.hidden, config.activation,
        config.init_log_std, None if features is not None else _encoder(spec, config),
        sde=(config.full_std, config.use_expln) if config.use_sde else None,
        ortho_init=config.ortho_init, features=features,
        net_input=NetInput(spec.obs_parts, standardized=config.normalize_obs)
        if features is not None else None)


def _encoder(spec: EnvSpec, config: OnPolicyConfig) -> Encoder | None:
    if spec.obs_parts and config.encoder != "mlp":  # one encoder per Dict entry
        return DictEncoder(spec.obs_parts, config.hidden, config.activation,
                           config.cnn_precision, standardized=config.normalize_obs)
    return build_encoder(config.section, config.encoder, spec.obs_shape, spec.image_obs,
                         cnn_precision=config.cnn_precision)


class PPO(AlgorithmBase):
    """Collect ``rollout_steps`` x ``num_envs`` steps, then ``num_epochs`` of minibatch PPO."""

    name = "ppo"
    supports_dict_obs = True
    #: A2C's learner here (its update is its own; the collection is this class's).
    learner_cls: ClassVar[type[Learner[RolloutBatch]]] = PPOLearner
    #: Whether an MLP policy on a CPU records V(s) as it acts (see ``_rollout_values``);
    #: with a shared encoder the rollout always does.
    values_while_acting: ClassVar[bool] = True
    policy: Any  # ActorCritic here, RecurrentActorCritic in RecurrentPPO
    #: Scratch storage, fully rewritten by every collect before it is read: not state
    #: (gSDE's noise matrices are drawn afresh when a collect starts).
    transient_attrs: ClassVar[frozenset[str]] = frozenset(
        {"buffer", "_sde_eps", "_rollout_values", "_t", "_values_fresh"})

    def __init__(self, config: PPOConfig, env: EnvSettings) -> None:
        config.check_batch(env.num_envs)
        box = isinstance(env.spec.action_space, Box)
        if config.use_sde and not box:
            raise ConfigError(f"ppo.use_sde needs continuous (Box) actions but {env.env_id} "
                              "has discrete ones; drop ppo.use_sde")
        # Resolved before any env is made: a bad path fails fast.
        features = resolve_net(config.net, "ppo.net") if config.net else None
        device = resolve_device(env.device)
        super().__init__(env, obs_stats=RunningMeanStd(env.spec.obs_shape, device=device)
                         if config.normalize_obs else None)
        self.config = config
        spec = self.env.spec
        self._features = features
        self.mask_dims = resolve_action_mask(config.action_mask, spec, config.section)
        if self.mask_dims and config.normalize_obs:  # standardising would blur the 0/1 mask
            raise ConfigError(f"{config.section}.normalize_obs cannot run with an action mask "
                              f"from {env.env_id}; set {config.section}.normalize_obs=false")
        self.policy = build_module(self._policy_factory(), self.device)
        self._sde_eps: Tensor | None = None
        self._sde_age = 0
        self.learner = self.learner_cls({DEFAULT_MODULE_ID: self.policy}, config,
                                        on_nonfinite=env.on_nonfinite)  # type: ignore[arg-type]
        act_shape = getattr(spec.action_space, "shape", ())  # () for Discrete
        encoder = getattr(self.policy, "encoder", None)
        self.buffer = RolloutBuffer(config.rollout_steps, self.env.num_envs, spec.obs_shape,
                                    act_shape, torch.float32 if box else torch.int64,
                                    device=self.device, obs_dtype=spec.obs_dtype,
                                    # standardised observations are no pixels any more
                                    obs_layout=None if config.normalize_obs
                                    else ObsLayout.of(spec),
                                    channels_last=isinstance(encoder, NatureCNN)
                                    and encoder.takes_channels_first)
        # The rollout records V(s) as it acts, with a shared CNN from the same encoder
        # pass (as SB3's does), on a CPU in passes of num_envs rows whose activations stay
        # in cache; _batch would otherwise pass every observation again. _values_fresh
        # says this instance's behaviour policy filled the whole rollout with the current
        # weights (not so for Ray runners' fragments).
        self._rollout_values = torch.zeros(
            (config.rollout_steps, self.env.num_envs), device=self.device) \
            if isinstance(self.policy, ActorCritic) and (encoder is not None or (
                self.device.type == "cpu" and self.values_while_acting)) else None
        self._t = 0
        self._values_fresh = False
        self._graphed = self._graphed_collect() if config.cuda_graph else None
        self.reward_stats = RunningMeanStd(device=self.device) \
            if config.normalize_rewards else None
        self.reward_running = torch.zeros(self.env.num_envs, dtype=stats_dtype(self.device),
                                          device=self.device)

    def _graphed_collect(self) -> GraphedCollect:
        """``ppo.cuda_graph``: the rollout as a CUDA graph, where one can capture it."""
        section = self.config.section
        if self.device.type != "cuda":
            raise ConfigError(f"{section}.cuda_graph needs a CUDA device, the run's is "
                              f"{self.device}; set device=cuda or drop {section}.cuda_graph")
        if not getattr(self.env, "graph_safe", False):
            raise ConfigError(f"{section}.cuda_graph needs a native env stepped on the GPU "
                              f"(backend=native), and {self.settings.env_id} here is not one; "
                              f"drop {section}.cuda_graph")
        return GraphedCollect(self.runner, [self.generator])

    def _policy_factory(self) -> Callable[[], nn.Module]:
        return policy_factory(self.env.spec, self.config, self.mask_dims, self._features)

    def _encoder(self) -> Encoder | None:
        return _encoder(self.env.spec, self.config)

    def _behaviour(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        sde = self.policy.sde
        if sde is not None:
            freq = self.config.sde_sample_freq
            if self._sde_eps is None or self._sde_age == 0 or (
                    freq > 0 and self._sde_age % freq == 0):
                self._sde_eps = sde.sample_eps((len(obs),), self.generator)
            self._sde_age += 1
        eps = self._sde_eps if sde is not None else None
        if self._rollout_values is None:
            return self.policy.act(obs, generator=self.generator, sde_eps=eps)
        actions, log_probs, values = self.policy.act_value(obs, self.generator, eps)
        if self._t < len(self._rollout_values):
            self._rollout_values[self._t] = values
        self._t += 1
        return actions, log_probs

    def start_rollout(self) -> None:
        self._sde_age = 0  # gSDE: a rollout starts with new noise matrices
        self._t = 0

    def collect(self) -> dict[str, float]:
        self.start_rollout()
        if self._graphed is not None:
            steps = self._graphed.collect(self._behaviour, self.buffer)
            self._t = self.buffer.steps  # a replay filled every row (its Python ran once)
        else:
            steps = self.runner.collect(self._behaviour, self.buffer)
        self._values_fresh = self._t == self.buffer.steps
        return {"env/steps": float(steps), **self.runner.episodes.stats()}

    def update(self, env_steps: int) -> dict[str, float]:
        self.learner.before_gradient_based_update(env_steps)  # logs learner/lr_default etc.
        batch = self._batch()
        cfg = self.config

        def kl_stop(stats: dict[str, Tensor]) -> bool:
            return cfg.target_kl is not None and float(stats["ppo/approx_kl"]) > cfg.target_kl

        stats = self.learner.update_from_batch(
            {DEFAULT_MODULE_ID: batch}, num_epochs=cfg.num_epochs,
            minibatch_size=cfg.minibatch_size, generator=self.generator, stop=kl_stop)
        return stats

    @torch.no_grad()
    def _batch(self) -> RolloutBatch:
        buf, policy = self.buffer, self.policy
        t, n = buf.steps, buf.num_envs
        obs = buf.obs[:].flatten(0, 1)  # Dict observations: joined from their entries
        if self._rollout_values is None and self.device.type != "cpu":
            # One forward over every observation and every stored final one: selecting the
            # truncated rows first would wait for the device to say how many there are.
            values_all = policy.value(torch.cat([obs, self.runner.obs,
                                                 buf.next_obs[:].flatten(0, 1)]))
            final_values = values_all[(t + 1) * n:].view(t, n)
        else:
            # A pass over every stored final observation would cost a third of an epoch;
            # one wait per update for the few truncated rows costs nothing in comparison
            # (and on a CPU, where A2C does not record the values, none).
            if self._rollout_values is not None and self._values_fresh:
                values_all = torch.cat([self._rollout_values.flatten(),
                                        policy.value(self.runner.obs)])
            else:
                values_all = policy.value(torch.cat([obs, self.runner.obs]))
            self._values_fresh = False  # the update changes the weights that made them
            final_values = torch.zeros_like(buf.rewards)
            if bool(buf.truncated.any()):
                final_values[buf.truncated] = policy.value(buf.next_obs[buf.truncated])
        values = values_all[: t * n].view(t, n)
        next_values = torch.where(buf.truncated, final_values, values_all[n: (t + 1) * n]
                                  .view(t, n))
        adv, ret = self._advantages(values, next_values)
        return RolloutBatch(obs, buf.actions.flatten(0, 1),
                            buf.log_probs.flatten(), adv.flatten(), ret.flatten(), values.flatten())

    def _advantages(self, values: Tensor, next_values: Tensor) -> tuple[Tensor, Tensor]:
        """GAE advantages and returns ``[T, N]`` of the buffer's rewards (scaled when
        normalize_rewards is on) for ``values`` and the bootstrap ``next_values``."""
        buf, cfg = self.buffer, self.config
        rewards = buf.rewards.sign() if cfg.clip_rewards else buf.rewards
        if self.reward_stats is not None:
            rewards = discounted_reward_scale(rewards, buf.terminated | buf.truncated,
                                              self.reward_running, self.reward_stats, cfg.gamma)
        return gae(rewards, values, next_values, buf.terminated, buf.truncated,
                   cfg.gamma, cfg.gae_lambda)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        return self.policy.act(obs, deterministic=deterministic, generator=self.generator)[0]

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["learner"] = self.learner.get_state()
        if self.reward_stats is not None:
            state["reward_norm"] = {**self.reward_stats.get_state(),
                                    "running": self.reward_running.clone()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        # Before the base class's: where the episodes restart at the cut, it drops their
        # discounted return (episodes_restarted).
        if self.reward_stats is not None and "reward_norm" in state:
            self.reward_stats.set_state(state["reward_norm"])
            self.reward_running.copy_(state["reward_norm"]["running"])
        super().set_state(state)
        self.learner.set_state(state["learner"])
        self._values_fresh = False  # recorded by the weights just replaced

    def episodes_restarted(self) -> None:
        # The reward normaliser's discounted return restarts with the episodes (as
        # VecNormalize's at a reset); a return carried over would skew its std.
        self.reward_running.zero_()

    def export_weights(self) -> dict[str, Tensor]:
        return dict(self.policy.state_dict())

