"""PPO on native CartPole at GPU scale: rlloop vs rl8, on the same device, same network.

Run: ``python benchmarks/gpu.py --rl8-python PATH [--device auto] [--num-envs 4096 16384
65536]``. This is ``benchmarks/ppo_throughput.py`` (see its docstring for what is measured
and how) with defaults for a GPU: the device CUDA when present, 4,096 to 65,536 envs. The
same command runs on a CPU with a small env count (``--device cpu --num-envs 64``), which
``tests/benchmarks/test_benchmarks_smoke.py`` does so that it keeps working where no GPU is at hand.

Goal (the redesign issue): at least 1,000,000 env steps/s end to end, and at least twice
rl8's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo_throughput import main  # a sibling script, not a package

if __name__ == "__main__":
    main(device="auto", num_envs=(4096, 16384, 65536))
