"""A run on disk: from a config to a trained policy, its run directory and its reports.

What lives here: ``start`` (`train`, `resume`: where a run starts), ``session`` (`Session`:
the run as named steps — check, build, claim the directory, open the sinks, make the
trainer, restore, run, finish), ``preflight`` (the config checked against the run
directory, the machine and the env), ``build`` (an algorithm from a config), ``memory``
(the memory estimate), ``run_dir`` (default names, refusals, whether a run has a
checkpoint), ``sinks`` (the run's metrics sinks), ``skip_guard`` (a run that stops
learning stops), ``saved`` (reading a saved run: its config, its checkpoints, its
policy), ``lock`` (one trainer per run directory), ``disk_full`` (a full disk as one
line), ``report``, ``video`` and ``wrap_up`` (what a run leaves to read and watch, made at
its end), ``timing`` (time per phase).

May import: everything below it (``trainers`` and down); never ``tasks``, ``tuning``,
``cli`` or the API.
"""
