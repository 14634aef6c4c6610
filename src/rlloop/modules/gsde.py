"""Generalised state-dependent exploration (gSDE; Raffin et al. 2022, arXiv:2005.05719).

The action noise is a linear function of the policy's latent features ``phi(s)`` (the
last hidden layer): ``a = mu(s) + phi(s)^T W`` with a noise matrix
``W [latent, act]``, ``W_ij ~ N(0, sigma_ij^2)``, held fixed for ``sde_sample_freq``
steps. For a fixed ``s`` that is a Gaussian with

    Var(a_i | s) = sum_j (phi_j(s) * sigma_ij)^2

so the log-probability of an action is a diagonal Gaussian's with that variance. As in
Stable-Baselines3, ``1e-6`` is added to the variance (a latent of all zeros would
otherwise give an infinite log-probability), ``sigma = exp(log_std)`` or the paper's
``expln`` (``exp`` below 0, ``log1p(x) + 1`` above), and ``full_std=False`` learns one
sigma per feature, shared by every action dimension.

Noise matrices are drawn as standard normals ``eps`` and scaled by the current sigma
when used (``W = eps * sigma``): the same draw as SB3's reparameterised
``Normal(0, sigma).rsample()``, and a matrix kept across steps needs no gradient graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlloop.modules.encoders import flat_input
from rlloop.modules.q_networks import MLP, tanh_log_det

#: Added to the variance (SB3's ``StateDependentNoiseDistribution.epsilon``).
VARIANCE_EPSILON = 1e-6
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class StateDependentNoise(nn.Module):
    """The learned ``log_std [latent, act]`` (``[latent, 1]`` without ``full_std``) and
    the maps from latent features to noise and to the per-sample log std.

    Args:
        latent_dim: Size of the latent features ``phi(s)``.
        act_dim: Action dimensions.
        init_log_std: Initial value of every log std entry (SB3's ``log_std_init``).
        full_std: One sigma per (feature, action) pair; else one per feature.
        use_expln: ``expln`` instead of ``exp`` (keeps sigma from growing too fast).
        learn_features: Let the noise and variance pass gradients into ``phi`` (SB3's
            SAC does; its PPO detaches the features).
    """

    def __init__(self, latent_dim: int, act_dim: int, init_log_std: float,
                 full_std: bool = True, use_expln: bool = False,
                 learn_features: bool = False) -> None:
        super().__init__()
        self.latent_dim, self.act_dim = latent_dim, act_dim
        self.use_expln, self.learn_features = use_expln, learn_features
        cols = act_dim if full_std else 1
        self.log_std = nn.Parameter(torch.full((latent_dim, cols), float(init_log_std)))

    def std(self) -> Tensor:
        """``sigma [latent, act]``."""
        log_std = self.log_std
        if self.use_expln:
            std = torch.where(log_std <= 0, log_std.exp(),
                              torch.log1p(log_std.clamp(min=0.0)) + 1.0)
        else:
            std = log_std.exp()
        return std.expand(self.latent_dim, self.act_dim)

    def sample_eps(self, batch: Sequence[int], generator: torch.Generator | None) -> Tensor:
        """Standard normal ``eps [*batch, latent, act]`` from ``generator`` (on its
        device), in ``log_std``'s dtype and on its device; ``batch=()`` gives one
        matrix."""
        home = self.log_std
        device = generator.device if generator is not None else home.device
        eps = torch.randn((*batch, self.latent_dim, self.act_dim), generator=generator,
                          device=device, dtype=home.dtype)
        return eps.to(home.device)

    def _phi(self, latent: Tensor) -> Tensor:
        return latent if self.learn_features else latent.detach()

    def noise(self, latent: Tensor, eps: Tensor) -> Tensor:
        """``phi(s)^T (eps * sigma)`` ``[B, act]``: one matrix ``eps [latent, act]`` for
        the whole batch, or one per row ``eps [B, latent, act]``."""
        weights = eps * self.std()
        phi = self._phi(latent)
        if weights.dim() == 2:
            return phi @ weights
        return torch.bmm(phi.unsqueeze(1), weights).squeeze(1)

    def log_std_of(self, latent: Tensor) -> Tensor:
        """The per-sample log std ``[B, act]``: ``0.5 log(phi^2 @ sigma^2 + 1e-6)``."""
        variance = self._phi(latent).square() @ self.std().square()
        return 0.5 * torch.log(variance + VARIANCE_EPSILON)


class TanhGSDEActor(nn.Module):
    """SAC's policy with gSDE: ``a = tanh(u)``, ``u = mu(s) + phi(s)^T W``.

    ``phi(s)`` is the ReLU output of the last hidden layer and ``mu(s)`` a linear head on
    it, clipped to ``[-clip_mean, clip_mean]`` (SB3's ``clip_mean=2``: without it the
    mean can run far into tanh's flat tails). ``log pi(a|s)`` is the state-dependent
    Gaussian's log-density of ``u`` minus ``sum log(1 - tanh(u)^2)``.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int],
                 init_log_std: float, full_std: bool = True, use_expln: bool = False,
                 clip_mean: float = 2.0) -> None:
        super().__init__()
        self.act_dim, self.clip_mean = act_dim, clip_mean
        self.latent = MLP(obs_dim, hidden[:-1], hidden[-1])
        self.mu = nn.Linear(hidden[-1], act_dim)
        self.sde = StateDependentNoise(hidden[-1], act_dim, init_log_std, full_std,
                                       use_expln, learn_features=True)

    def features(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(phi(s) [B, latent], mu(s) [B, act])``."""
        phi = self.latent(flat_input(obs, self.mu.weight.dtype)).relu()
        mean = self.mu(phi)
        return phi, mean.clamp(-self.clip_mean, self.clip_mean) if self.clip_mean > 0 else mean

    def forward(self, obs: Tensor, generator: torch.Generator | None = None,
                noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A reparameterised sample ``[B, d]`` and its log-probability ``[B]``.

        ``noise`` is the standard normal ``eps`` of the noise matrix (``[latent, d]``
        shared by the batch, or ``[B, latent, d]``); when None one matrix is drawn from
        ``generator``."""
        phi, mean = self.features(obs)
        u = self._pre_tanh(phi, mean, generator, noise)
        log_std = self.sde.log_std_of(phi)
        z = (u - mean) * torch.exp(-log_std)
        gauss = (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(-1)
        return torch.tanh(u), gauss - tanh_log_det(u)

    def sample(self, obs: Tensor, generator: torch.Generator | None = None,
               noise: Tensor | None = None) -> Tensor:
        """:meth:`forward`'s action alone, without the log-probability (for acting)."""
        return torch.tanh(self._pre_tanh(*self.features(obs), generator, noise))

    def _pre_tanh(self, phi: Tensor, mean: Tensor, generator: torch.Generator | None,
                  noise: Tensor | None) -> Tensor:
        eps = self.sde.sample_eps((), generator) if noise is None else noise
        return mean + self.sde.noise(phi, eps)

    def mode(self, obs: Tensor) -> Tensor:
        """The deterministic action ``tanh(mu(s))``."""
        return torch.tanh(self.features(obs)[1])
