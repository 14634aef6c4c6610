"""Env runners: a policy and a batch of envs -> rollouts or transitions.

What lives here: ``env_runner`` (in process, batched inference, episode tracking),
``graphed`` (a collect captured as a CUDA graph), ``evaluation`` (evaluation episodes),
``multi_agent`` (PettingZoo self-play and leagues), ``fragments``, ``ray_actor`` and
``ray_runners`` (K Ray actors that each step their own envs and send fragments back),
``ray_cluster`` (connecting to Ray).

May import: ``rlloop.errors``, ``system``, ``config``, ``envs``, ``modules`` and ``data``.
Ray env runners build an algorithm in each actor with the builder the run layer hands them,
and wrap the off-policy loop (``algorithms.offpolicy_loop``): the one import that runs up.
"""
