"""Experience storage and the targets computed from it, on the run's device.

What lives here: ``batch`` (`TensorBatch`, the base of every typed batch), ``rollout``
(on-policy rollouts and `RolloutBatch`, flat or cut into recurrent sequences by
``sequences``), ``returns`` (GAE and discounted returns as pure functions),
``transitions`` (`Transitions`, the off-policy batch), ``replay``, ``prioritized_replay``,
``nstep``, ``frame_replay``, ``hindsight_replay``, ``obs_storage`` and ``info_storage``
(the off-policy replay buffers: uniform, prioritized, n-step, Atari frames, hindsight
relabelling, Dict observations, the steps' info dicts) and ``multi_agent`` (per-agent
rollouts).

May import: ``rlloop.errors``, ``system``, ``config`` and ``envs`` (the spaces).
"""
