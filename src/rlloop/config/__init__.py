"""Settings, torch-free: a run's config, each algorithm's config, presets and their checks.

What lives here: ``run_config`` (`RunConfig`: loading YAML files, ``--set`` overrides,
validation, resume rules), ``ppo`` and ``offpolicy`` (the algorithms' config dataclasses),
``registry`` (algorithm name -> config class and constructor, named by module path so that
nothing here imports torch), ``presets`` (the tuned YAML settings per env),
``unused_settings`` (warnings for settings a run does not use).

May import: ``rlloop.errors`` and ``rlloop.system``; never torch at import time, so that
``rlloop --help`` and bad input answer in well under a second. ``runners.ray_cluster``
is the one exception, for the Ray settings' dataclass and checks.
"""
