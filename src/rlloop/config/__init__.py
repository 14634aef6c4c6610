"""Settings, torch-free: a run's config, each algorithm's config, presets and their checks.

What lives here: ``run_config`` (`RunConfig`: the run's settings, validated on
construction, and which a resume may change), ``loading`` (a config from its layers: YAML
files, presets, flags, ``--set`` overrides), ``ppo`` and ``offpolicy`` (the algorithms'
config dataclasses), ``registry`` (algorithm name -> config class and constructor, named by
module path so that nothing here imports torch), ``presets`` (the tuned YAML settings per
env), ``ray`` (the Ray section and the env-runner checks), ``gradient_clip``,
``network_choices`` and ``schedules`` (settings the learners and networks take),
``unused_settings`` (warnings for settings a run does not use), ``api_arguments`` (the
Python API's arguments checked: env, ``learn``'s count, paths, an offline model's dataset).

May import: ``rlloop.errors`` and ``rlloop.system``; never torch at import time, so that
``rlloop --help`` and bad input answer in well under a second.
"""
