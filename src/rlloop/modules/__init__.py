"""Networks: encoders, distributions, actor-critics, Q-networks and recurrent cores.

What lives here: encoders (MLP, Nature CNN, Dict), action distributions, actor-critics and
Q-networks, recurrent cores, gSDE and action noise, masked policies, and user networks named
in a config (``custom``).

May import: ``rlloop.errors``, ``system``, ``config`` (network choices) and ``envs`` (the
spaces and action masks).
"""
