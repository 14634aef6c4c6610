"""The ``rlloop`` command: argument parsing and the commands (train, eval, tune, export, plot,
presets, ...).

What lives here: ``main`` (the commands' dispatch; the console script's entry point),
``arguments`` (the parser), ``early_checks`` (input refused before torch is imported),
``tune`` (the tune command), ``export`` (a policy to ONNX or TorchScript) and ``plot``
(learning curves of several runs). A command imports torch only once its arguments are
known to be good.

May import: any package of rlloop; nothing imports it but ``rlloop.__main__``.
"""
