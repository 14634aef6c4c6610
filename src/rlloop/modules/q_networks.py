"""Networks of the off-policy family: Q-network (optionally dueling), its quantile form
(QR-DQN), twin-Q critic, tanh-squashed Gaussian actor (SAC) and deterministic actor (TD3).

Continuous actors work in the normalised action box ``[-1, 1]^d``; the algorithm maps
actions to the env's bounds when it steps the env, and stores normalised actions in the
replay buffer (as Stable-Baselines3 does), so critics and target smoothing see ``[-1, 1]``.

Layers use PyTorch's default ``nn.Linear`` initialisation (as Stable-Baselines3 and
CleanRL do for these algorithms), and the forward passes call ``F.linear`` directly on
the layers' parameters: for batch-256 MLPs on one CPU thread, per-module call overhead
is a visible share of an update.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlloop.envs.action_masks import legal_actions, mask_scores
from rlloop.modules.encoders import Encoder, flat_input

LOG_STD_MIN = -20.0
LOG_STD_MAX = 2.0
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


class MLP(nn.Module):
    """``in_dim -> hidden... -> out_dim`` with ReLU between layers (none at the output)."""

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int) -> None:
        super().__init__()
        dims = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype, which the input must have."""
        return cast(nn.Linear, self.layers[0]).weight.dtype

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(cast(Sequence[nn.Linear], self.layers)):
            x = F.linear(x, layer.weight, layer.bias)
            if i < last:
                x = x.relu_()
        return x


class QNetwork(nn.Module):
    """``Q(s, .)`` for ``n_actions`` discrete actions: ``[B, *obs] -> [B, n_actions]``.

    With ``dueling`` the last hidden layer feeds a value head and an advantage head,
    ``Q = V + A - mean_a A`` (Wang et al. 2016, arXiv:1511.06581, eq. 9).

    With an ``encoder`` (a CNN for pixels, or a DictEncoder) the heads are linear on its
    features, as in the Nature DQN and Stable-Baselines3's ``CnnPolicy``: ``obs_dim`` and
    ``hidden`` are unused.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int],
                 dueling: bool = False, encoder: Encoder | None = None, *,
                 mask_dims: int = 0) -> None:
        super().__init__()
        self.dueling = dueling
        self.mask_dims = mask_dims
        self.encoder = encoder
        if encoder is not None:
            obs_dim, hidden = encoder.out_dim, ()
        self.net: MLP | nn.Identity
        if not dueling:
            self.net = MLP(obs_dim, hidden, n_actions)
            return
        # The encoder's features are the (ReLU) layer the heads read.
        self.net = MLP(obs_dim, hidden[:-1], hidden[-1]) if hidden else nn.Identity()
        width = hidden[-1] if hidden else obs_dim
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, n_actions)

    def forward(self, obs: Tensor) -> Tensor:
        q = self._q(obs)
        if self.mask_dims:  # argmax and the target's max then see legal actions only
            q = mask_scores(q, legal_actions(obs.flatten(1), self.mask_dims))
        return q

    def _q(self, obs: Tensor) -> Tensor:
        if self.encoder is None:
            # A body a user swapped in (or a dueling net's Identity): its first parameter.
            dtype = self.net.dtype if isinstance(self.net, MLP) else next(self.parameters()).dtype
            x = self.net(flat_input(obs, dtype))
        else:
            x = self.net(self.encoder(obs))
        if not self.dueling:
            return x
        if self.encoder is None:
            x = x.relu_()
        adv = F.linear(x, self.advantage.weight, self.advantage.bias)
        return F.linear(x, self.value.weight, self.value.bias) + adv - adv.mean(1, keepdim=True)


class QuantileQNetwork(nn.Module):
    """QR-DQN's network: ``n_quantiles`` quantiles of the return of each of ``n_actions``
    actions, ``[B, *obs] -> [B, n_quantiles, n_actions]`` (:meth:`quantiles`), from a
    :class:`QNetwork` with ``n_quantiles * n_actions`` outputs (sb3-contrib's layout).

    Calling it gives the Q-values ``[B, n_actions]`` (the quantiles' mean, illegal actions
    masked), so DQN's acting code takes it unchanged.
    """

    def __init__(self, obs_dim: int, n_actions: int, n_quantiles: int,
                 hidden: Sequence[int], encoder: Encoder | None = None, *,
                 mask_dims: int = 0) -> None:
        super().__init__()
        self.n_actions, self.n_quantiles, self.mask_dims = n_actions, n_quantiles, mask_dims
        self.body = QNetwork(obs_dim, n_quantiles * n_actions, hidden, encoder=encoder)

    def quantiles(self, obs: Tensor) -> Tensor:
        """``[B, n_quantiles, n_actions]`` quantiles (unmasked)."""
        return self.body(obs).view(-1, self.n_quantiles, self.n_actions)

    def quantiles_and_q(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """The quantiles and the masked Q-values from one forward pass."""
        z = self.quantiles(obs)
        q = z.mean(1)
        if self.mask_dims:
            q = mask_scores(q, legal_actions(obs.flatten(1), self.mask_dims))
        return z, q

    def forward(self, obs: Tensor) -> Tensor:
        return self.quantiles_and_q(obs)[1]


def encode(encoder: Encoder | None, obs: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, features]``: ``obs`` flattened into ``dtype`` (the reading weights'), or
    through ``encoder`` when there is one."""
    return flat_input(obs, dtype) if encoder is None else encoder(obs)


def stacked_linears(dims: Sequence[int], members: int
                    ) -> tuple[nn.ParameterList, nn.ParameterList]:
    """The weights ``[members, in, out]`` and biases ``[members, 1, out]`` of ``members``
    independent MLPs with layer widths ``dims``, each member initialised as ``nn.Linear``."""
    weights, biases = nn.ParameterList(), nn.ParameterList()
    for a, b in itertools.pairwise(dims):
        bound = 1.0 / math.sqrt(a)
        weights.append(nn.Parameter(torch.empty(members, a, b).uniform_(-bound, bound)))
        biases.append(nn.Parameter(torch.empty(members, 1, b).uniform_(-bound, bound)))
    return weights, biases


class TwinQ(nn.Module):
    """Two critics ``Q1, Q2(s, a)`` whose weights are stacked, one tensor per layer.

    Each layer holds both critics' weights as ``[2, in, out]`` (one parameter, one Adam
    state, one Polyak op for both). The forward pass runs each member's layer as its own
    2-D ``addmm`` on a view of that tensor: on a CPU, ``bmm``'s backward copies its
    transposed ``[2, 256, 256]`` operands and its ``[., 256, 1]`` output layer runs as
    slow matrix-vector products, so per-member matmuls take about 12% off a SAC update.
    The critics are independent (separately initialised, never sharing a weight), except
    for an ``encoder`` (a CNN for pixels), which both read, as in
    Stable-Baselines3's critic.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], members: int = 2,
                 encoder: Encoder | None = None, out_dim: int = 1) -> None:
        super().__init__()
        self.encoder = encoder
        self.out_dim = out_dim
        if encoder is not None:
            obs_dim = encoder.out_dim
        self.weights, self.biases = stacked_linears([obs_dim + act_dim, *hidden, out_dim],
                                                    members)
        self.members = members

    def forward(self, obs: Tensor, action: Tensor, *, detach_params: bool = False,
                member: int | None = None) -> Tensor:
        """``[members, B]`` Q-values of ``(obs [B, *obs], action [B, *act])``; with
        ``out_dim > 1`` (TQC's quantile critics) ``[B, members, out_dim]``.

        ``detach_params`` evaluates the critics as constants: gradients reach ``action``
        (and through it the actor) but not the critic weights. This is how an actor loss
        is added to the critic loss for a single backward pass. ``member`` evaluates only
        that critic (``[1, B]``).
        """
        if detach_params and self.encoder is not None:
            with torch.no_grad():  # the features do not depend on the action
                features = self.encoder(obs)
        else:
            features = encode(self.encoder, obs, self.weights[0].dtype)
        # The replay's float32 actions, for critics of another dtype.
        x = torch.cat([features, action.flatten(1).to(features.dtype)], 1)
        params = [(w.detach(), b.detach()) if detach_params else (w, b)
                  for w, b in zip(self.weights, self.biases, strict=True)]
        # Each member's (w, b) views per layer. unbind gives all members at once, and its
        # backward writes their gradients into the stacked parameter in one op.
        if member is None:
            per_member = list(zip(*[list(zip(w.unbind(0), b.unbind(0), strict=True))
                                    for w, b in params], strict=True))
        else:
            per_member = [tuple((w[member], b[member]) for w, b in params)]
        outs = []
        for layers in per_member:
            h = x
            for i, (w, b) in enumerate(layers):
                h = torch.addmm(b, h, w)
                if i < len(layers) - 1:
                    h = h.relu_()
            outs.append(h)
        if self.out_dim > 1:
            return torch.stack(outs, 1)
        return torch.cat(outs, 1).t()


def standard_normal(shape: Sequence[int], like: Tensor,
                    generator: torch.Generator | None = None) -> Tensor:
    """``N(0, 1)`` noise of ``shape`` with ``like``'s dtype, drawn from ``generator`` on
    the generator's device, then moved to ``like``'s."""
    device = generator.device if generator is not None else like.device
    eps = torch.randn(tuple(shape), generator=generator, device=device, dtype=like.dtype)
    return eps.to(like.device)


def tanh_log_det(u: Tensor) -> Tensor:
    """``sum_i log(1 - tanh(u_i)^2)`` over the last dim, computed stably as
    ``2 (log 2 - u - softplus(-2u))`` (SAC paper, appendix C)."""
    return (2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)


class TanhGaussianActor(nn.Module):
    """SAC's policy: ``a = tanh(u)``, ``u ~ N(mu(s), sigma(s)^2)``, actions in ``[-1, 1]^d``.

    ``log pi(a|s) = log N(u; mu, sigma) - sum log(1 - tanh(u)^2)`` (Haarnoja et al. 2018,
    arXiv:1812.05905, appendix C). ``log sigma`` is clamped to ``[-20, 2]``.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int],
                 encoder: Encoder | None = None) -> None:
        super().__init__()
        self.act_dim = act_dim
        self.encoder = encoder
        self.net = MLP(obs_dim if encoder is None else encoder.out_dim, hidden, 2 * act_dim)

    def forward(self, obs: Tensor, generator: torch.Generator | None = None,
                noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A reparameterised sample ``[B, d]`` and its log-probability ``[B]``.

        ``noise`` is the standard normal draw ``[B, d]``; when None it is drawn from
        ``generator`` (a compiled update draws it outside and passes it in)."""
        u, eps, log_std = self._gaussian_sample(obs, generator, noise)
        gauss = (-0.5 * eps.square() - log_std).sum(-1) - self.act_dim * _LOG_SQRT_2PI
        return torch.tanh(u), gauss - tanh_log_det(u)

    def sample(self, obs: Tensor, generator: torch.Generator | None = None,
               noise: Tensor | None = None) -> Tensor:
        """:meth:`forward`'s action alone (the same draw), without the log-probability
        that only the losses read: what acting needs."""
        return torch.tanh(self._gaussian_sample(obs, generator, noise)[0])

    def _gaussian_sample(self, obs: Tensor, generator: torch.Generator | None,
                         noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``(u, eps, log sigma)``: the pre-tanh sample ``u = mu + eps sigma`` ``[B, d]``."""
        mean, raw_log_std = self.net(encode(self.encoder, obs, self.net.dtype)).chunk(2, dim=-1)
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        eps = standard_normal(mean.shape, mean, generator) if noise is None else noise
        return mean + eps * log_std.exp(), eps, log_std

    def mode(self, obs: Tensor) -> Tensor:
        """The deterministic action ``tanh(mu(s))``."""
        return torch.tanh(self.net(encode(self.encoder, obs, self.net.dtype))[:, : self.act_dim])


class DeterministicActor(nn.Module):
    """TD3's policy ``mu(s) = tanh(MLP(s))`` in ``[-1, 1]^d``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int],
                 encoder: Encoder | None = None) -> None:
        super().__init__()
        self.act_dim = act_dim
        self.encoder = encoder
        self.net = MLP(obs_dim if encoder is None else encoder.out_dim, hidden, act_dim)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.net(encode(self.encoder, obs, self.net.dtype)))
