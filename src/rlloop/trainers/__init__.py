"""The one training loop, its two schedules, stop conditions and callbacks.

What lives here: ``loop`` (`Trainer`: step / eval / run, counted in env steps, and the
on-policy schedule of collect + update iterations), ``offpolicy_schedule`` (the off-policy
cadence: optimisation, evaluation, record and save intervals counted in env and
optimisation steps), ``stop_conditions`` (small callables over the stats), ``callbacks``
(the user callback protocol) and ``result`` (what a finished run reports).

May import: everything below it (``errors``, ``system``, ``config``, ``logging``,
``algorithms`` and what they use); never ``runs``, ``tasks``, ``tuning``, ``cli`` or the API.
"""
