"""The low floor: what every other package may lean on, about the process and the machine.

What lives here: device names and device selection (``device_names``, ``devices``), floating
point settings (``numerics``), seeding (``seeding``), signal handling and the stop request
(``signals``), writing into run directories without following links (``run_files``),
importing user code named in a config (``user_code``), the profiler (``profiling``) and the
loop that env and learner worker processes run (``worker_loop``).

May import: ``rlloop.errors`` only (and the standard library, numpy, torch, psutil). Every
other package of rlloop may import this one.
"""
