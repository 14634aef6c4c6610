"""A recurrent actor-critic: encoder -> LSTM or GRU cell -> the feed-forward heads.

The memory sits between whatever the encoder makes of an observation (flattening, for
vector observations) and :class:`~rlloop.modules.actor_critic.ActorCritic`'s MLP heads.
Actor and critic have a cell each (as sb3-contrib's RecurrentPPO by default): through a
shared one the value loss, whose gradients are far larger early on, drowns the policy's
(a shared GRU did not learn masked-velocity CartPole at all in 100k steps).

The recurrent state of one env is one flat vector: ``[actor, critic]`` with ``h`` per
cell for a GRU and ``[h, c]`` for an LSTM, so rollouts, sequences and checkpoints store it
as one ``[..., state_size]`` tensor.
A state is zeroed where an episode starts, *inside* the forward pass, so one sequence may
span episode boundaries without carrying memory from one episode into the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from rlloop.envs.core import ActionSpace
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.distributions import ActionDist
from rlloop.modules.encoders import FlatInput
from rlloop.modules.networks import flat_dim

RecurrentKind = Literal["lstm", "gru"]


class RecurrentActorCritic(nn.Module):
    """``pi(a | o_1..o_t)`` and ``V(o_1..o_t)``, one recurrent cell each.

    The cells' outputs travel together as ``features`` ``[B, 2H]`` (actor's, then
    critic's); :meth:`dist`, :meth:`value` and :meth:`act` read their half.

    Args:
        obs_shape: Shape of one observation.
        action_space: Discrete or Box.
        kind: ``"lstm"`` or ``"gru"``.
        hidden_size: Width ``H`` of each cell's output.
        head_hidden, activation, init_log_std: The heads' MLPs (as ``ActorCritic``'s).
        encoder: Maps ``[B, *obs_shape]`` to ``[B, feature_dim]`` (default:
            :class:`FlatInput`, the flattened observation as floats).
        feature_dim: The encoder's output width (default: the flattened observation).
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_space: ActionSpace,
        kind: RecurrentKind = "lstm",
        hidden_size: int = 64,
        head_hidden: Sequence[int] = (64,),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        encoder: nn.Module | None = None,
        feature_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.hidden_size = hidden_size
        self.encoder = encoder if encoder is not None else FlatInput()
        in_dim = feature_dim if feature_dim is not None else flat_dim(obs_shape)
        cell = nn.LSTMCell if kind == "lstm" else nn.GRUCell
        self.actor_cell: nn.LSTMCell | nn.GRUCell = cell(in_dim, hidden_size)
        self.critic_cell: nn.LSTMCell | nn.GRUCell = cell(in_dim, hidden_size)
        self.heads = ActorCritic((hidden_size,), action_space, head_hidden, activation,
                                 init_log_std)
        self.action_space = action_space

    @property
    def cell_state_size(self) -> int:
        """One cell's state width: ``2H`` for an LSTM (``h`` then ``c``), ``H`` for a GRU."""
        return 2 * self.hidden_size if self.kind == "lstm" else self.hidden_size

    @property
    def state_size(self) -> int:
        """Width ``S`` of the flat recurrent state (both cells)."""
        return 2 * self.cell_state_size

    def initial_state(self, batch: int, device: torch.device) -> Tensor:
        """Zeros ``[batch, state_size]``: the state before an episode's first step."""
        return torch.zeros((batch, self.state_size), device=device)

    def _cell(self, cell: nn.Module, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        if isinstance(cell, nn.LSTMCell):
            h, c = cell(x, (state[:, : self.hidden_size], state[:, self.hidden_size:]))
            return h, torch.cat([h, c], dim=-1)
        h = cell(x, state)
        return h, h

    def step(self, obs: Tensor, state: Tensor, starts: Tensor | None = None
             ) -> tuple[Tensor, Tensor]:
        """One time step: ``(features [B, 2H], next state [B, S])``.

        ``starts`` ``[B]`` bool marks observations that begin an episode: their incoming
        state is zeroed first (a multiply, so the same graph holds whatever the flags).
        """
        if starts is not None:
            state = state * (~starts).unsqueeze(-1).to(state.dtype)
        # to(): the cells' dtype (float64 under torch.set_default_dtype(torch.float64)).
        x = self.encoder(obs).to(self.actor_cell.weight_ih.dtype)
        split = self.cell_state_size
        h_pi, s_pi = self._cell(self.actor_cell, x, state[:, :split])
        h_vf, s_vf = self._cell(self.critic_cell, x, state[:, split:])
        return torch.cat([h_pi, h_vf], dim=-1), torch.cat([s_pi, s_vf], dim=-1)

    def unroll(self, obs: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        """Run ``L`` steps of ``B`` sequences: ``obs`` ``[B, L, *obs]``, the state entering
        step 0 ``[B, S]``, ``starts`` ``[B, L]``. Returns the features ``[B, L, 2H]`` and
        the state after every step ``[B, L, S]``; gradients flow through the whole
        sequence (back to ``state``, which callers pass detached)."""
        feats, states = [], []
        for t in range(obs.shape[1]):
            f, state = self.step(obs[:, t], state, starts[:, t])
            feats.append(f)
            states.append(state)
        return torch.stack(feats, 1), torch.stack(states, 1)

    def dist(self, features: Tensor) -> ActionDist:
        """The policy from the actor's half of ``features`` ``[B, 2H]``."""
        return self.heads.dist(features[:, : self.hidden_size])

    def value(self, features: Tensor) -> Tensor:
        """``V`` ``[B]`` from the critic's half of ``features``."""
        return self.heads.value(features[:, self.hidden_size:])

    def act(self, features: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Actions and their log-probabilities, as ``ActorCritic.act``."""
        return self.heads.act(features[:, : self.hidden_size], deterministic, generator)
