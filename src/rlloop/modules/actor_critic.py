"""The actor-critic module used by PPO: separate networks for policy and value."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn

from rlloop.envs.core import ActionSpace, Box, Discrete, MultiBinary, MultiDiscrete
from rlloop.errors import ConfigError
from rlloop.modules.distributions import (
    ActionDist,
    Bernoulli,
    Categorical,
    DiagGaussian,
    MultiCategorical,
)
from rlloop.modules.encoders import Encoder, NetInput, flat_input
from rlloop.modules.gsde import StateDependentNoise
from rlloop.modules.networks import _init, flat_dim, mlp, run_layers
from rlloop.system.user_code import one_line

#: ``factory(obs_shape) -> nn.Module`` with a ``features_dim`` attribute: a user network
#: mapping observations ``[B, *obs_shape]`` to features ``[B, features_dim]``.
FeaturesFactory = Callable[[tuple[int, ...]], nn.Module]


class ActorCritic(nn.Module):
    """Policy ``pi(a|s)`` and value ``V(s)`` for a Discrete, Box, MultiDiscrete (one
    categorical head per entry) or MultiBinary (one Bernoulli per entry) action space.

    Observations ``[B, *obs_shape]`` are flattened, or go through ``encoder`` (a CNN for
    pixels, shared by policy and value as in Stable-Baselines3's ``CnnPolicy``; the heads
    are then linear on its features and ``hidden`` is unused). Each of actor and critic is
    a body (an MLP, or a user network from ``features``, which sees observations as
    float32 with pixels scaled: ``net_input``) and a linear head. Box actions use a
    state-independent learned ``log_std``, or with ``sde`` (gSDE) a noise matrix on the
    actor's last hidden features; the environment adapter clips actions to the bounds.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_space: ActionSpace,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        encoder: Encoder | None = None,
        *,
        sde: tuple[bool, bool] | None = None,
        ortho_init: bool = True,
        features: FeaturesFactory | None = None,
        net_input: NetInput | None = None,
    ) -> None:
        """``sde`` is ``(full_std, use_expln)`` to explore with gSDE (Box actions);
        ``net_input`` what turns observations into a ``features`` network's input
        (default: :class:`NetInput` of a plain observation)."""
        super().__init__()
        if encoder is not None and features is not None:
            raise ConfigError("a custom network (net) and an encoder were both given; a "
                              "custom network replaces the encoder: set encoder=mlp")
        self.encoder = encoder
        self.obs_dim = flat_dim(obs_shape) if encoder is None else encoder.out_dim
        if encoder is not None:
            hidden = ()
        self.action_space = action_space
        self.sde: StateDependentNoise | None = None
        if isinstance(action_space, Discrete | MultiDiscrete | MultiBinary):
            out = action_space.n
        elif isinstance(action_space, Box):
            out = action_space.dim
        else:  # pragma: no cover - the env layer rejects other spaces first
            raise TypeError(f"unsupported action space {action_space!r}")
        self.net_input = None if features is None else net_input or NetInput()
        if features is None:
            self.actor = mlp(self.obs_dim, hidden, out, activation=activation, out_gain=0.01,
                             ortho_init=ortho_init)
            self.critic = mlp(self.obs_dim, hidden, 1, activation=activation, out_gain=1.0,
                              ortho_init=ortho_init)
        else:
            self.actor = _with_head(_build_body(features, obs_shape), out, 0.01, ortho_init)
            self.critic = _with_head(_build_body(features, obs_shape), 1, 1.0, ortho_init)
            for body in (self.actor[0], self.critic[0]):
                check_features(body, tuple(obs_shape))
        # The critic's head, held in a list (a reference, not a second registration):
        # indexing the Sequential for it on every call costs more than the layer's math.
        self._value_head: list[nn.Module] = [self.critic[-1]]
        if isinstance(action_space, Box):
            if sde is None:
                self.log_std = nn.Parameter(torch.full((out,), float(init_log_std)))
            else:
                latent = cast(nn.Linear, self.actor[-1]).in_features
                self.sde = StateDependentNoise(latent, out, init_log_std, *sde)

    def features(self, obs: Tensor) -> Tensor:
        """What the actor and critic bodies take: the encoder's features, the flattened
        observation, or (a user network) the observation as ``net_input`` makes it."""
        if self.encoder is not None:
            return self.encoder(obs)
        # The bodies' dtype: float64 under torch.set_default_dtype(torch.float64), where
        # the envs' observations are float32 still.
        dtype = cast(nn.Linear, self._value_head[0]).weight.dtype
        if self.net_input is not None:
            return cast(Tensor, self.net_input(obs)).to(dtype)
        return flat_input(obs, dtype)

    def _latent_mean(self, x: Tensor) -> tuple[Tensor, Tensor]:
        latent = run_layers(self.actor, x, -1)
        return latent, self.actor[-1](latent)

    def dist(self, obs: Tensor) -> ActionDist:
        return self._dist(self.features(obs))

    def _dist(self, x: Tensor) -> ActionDist:
        if self.sde is not None:
            latent, mean = self._latent_mean(x)
            return DiagGaussian(mean, self.sde.log_std_of(latent))
        out = run_layers(self.actor, x)
        space = self.action_space
        if isinstance(space, Discrete):
            return Categorical(out)
        if isinstance(space, MultiDiscrete):
            return MultiCategorical(out, space.nvec)
        if isinstance(space, MultiBinary):
            return Bernoulli(out)
        return DiagGaussian(out, self.log_std)

    def value(self, obs: Tensor) -> Tensor:
        return run_layers(self.critic, self.features(obs)).squeeze(-1)

    def dist_value(self, obs: Tensor) -> tuple[ActionDist, Tensor]:
        """``dist(obs)`` and ``value(obs)`` with one encoder pass."""
        x = self.features(obs)
        return self._dist(x), run_layers(self.critic, x).squeeze(-1)

    def act(self, obs: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None,
            sde_eps: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Actions and their log-probabilities for ``obs`` ``[B, *obs]``.

        With gSDE, ``sde_eps`` holds each row's noise matrix ``[B, latent, act]``
        (standard normal; one matrix is drawn from ``generator`` when None)."""
        if self.sde is None:
            return self._sampled(self.dist(obs), deterministic, generator)
        return self._act_sde(self.features(obs), deterministic, generator, sde_eps)

    def act_value(self, obs: Tensor, generator: torch.Generator | None = None,
                  sde_eps: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``act(obs)`` (sampled) and ``value(obs)`` with one encoder pass: what a rollout
        with a shared CNN records, instead of a second pass over every observation."""
        if self.sde is None:
            d, value = self.dist_value(obs)
            return (*self._sampled(d, False, generator), value)
        x = self.features(obs)
        return (*self._act_sde(x, False, generator, sde_eps),
                run_layers(self.critic, x).squeeze(-1))

    def _act_sde(self, x: Tensor, deterministic: bool, generator: torch.Generator | None,
                 sde_eps: Tensor | None) -> tuple[Tensor, Tensor]:
        assert self.sde is not None
        latent, mean = self._latent_mean(x)
        d = DiagGaussian(mean, self.sde.log_std_of(latent))
        if deterministic:
            actions = mean
        else:
            eps = self.sde.sample_eps((), generator) if sde_eps is None else sde_eps
            actions = mean + self.sde.noise(latent, eps)
        return self._finish(actions, d)

    def _sampled(self, d: ActionDist, deterministic: bool,
                 generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return self._finish(d.mode() if deterministic else d.sample(generator), d)

    def _finish(self, actions: Tensor, d: ActionDist) -> tuple[Tensor, Tensor]:
        if isinstance(self.action_space, Box):
            actions = actions.reshape(-1, *self.action_space.shape)
        return actions, d.log_prob(actions.flatten(1) if actions.dim() > 1 else actions)


def _build_body(features: FeaturesFactory, obs_shape: Sequence[int]) -> nn.Module:
    """``features(obs_shape)``, which must be a ``torch.nn.Module``: a factory that fails on
    the observation shape (a class that takes other arguments), or returns something
    else, fails here in one line that names it."""
    shape = tuple(obs_shape)
    name = getattr(features, "__qualname__", type(features).__name__)
    try:
        body = features(shape)
    except Exception as e:
        raise ConfigError(f"network {name}({shape}) raised {type(e).__name__}: {one_line(e)}; "
                          f"rlloop builds a network as {name}(obs_shape): make that call "
                          "work") from None
    if not isinstance(body, nn.Module):
        raise ConfigError(f"network factory {name}({shape}) returned a {type(body).__name__}, "
                          "not a torch.nn.Module; make it return the network")
    return body


def _with_head(body: nn.Module, out: int, gain: float, ortho_init: bool) -> nn.Sequential:
    """``body`` followed by a linear head of ``out`` units on its ``features_dim``."""
    dim = getattr(body, "features_dim", None)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ConfigError(f"network {type(body).__name__} must set features_dim (an int > 0: "
                          f"the size of its output features), got {dim!r}")
    return nn.Sequential(body, _init(nn.Linear(dim, out), gain, ortho_init))


def check_features(body: nn.Module, obs_shape: tuple[int, ...]) -> None:
    """Pass a zero batch of two observations through a user network (in eval mode,
    without gradient; lazy layers take their shapes and draw their weights here, each
    body its own): it must make ``[2, features_dim]`` features. A network whose layers do
    not fit the observation, or whose ``features_dim`` is not what it makes, fails here,
    naming itself, instead of inside the first rollout."""
    name, dim = type(body).__name__, getattr(body, "features_dim", None)
    training = body.training
    try:
        with torch.no_grad():
            out = body.eval()(torch.zeros(2, *obs_shape))
    except Exception as e:
        raise ConfigError(f"network {name} failed on observations of shape [B, "
                          f"{', '.join(map(str, obs_shape))}] ({type(e).__name__}: "
                          f"{one_line(e)}); make its layers fit that shape"
                          ) from None
    finally:
        body.train(training)
    if not isinstance(out, Tensor) or tuple(out.shape) != (2, dim):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ConfigError(f"network {name} sets features_dim={dim} but makes features of "
                          f"shape {got} from a batch of 2 observations; it must return [B, "
                          "features_dim]: set features_dim to what it makes")
