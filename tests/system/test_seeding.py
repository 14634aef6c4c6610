"""One user seed, independent random streams (rlloop.system.seeding)."""

from __future__ import annotations

import torch

from rlloop.system.seeding import derive_seed


def test_derived_seeds_are_fixed_distinct_and_in_range():
    assert derive_seed(0, "algorithm") == derive_seed(0, "algorithm")
    seeds = {derive_seed(s, name) for s in range(50) for name in ("algorithm", "env")}
    assert len(seeds) == 100
    assert all(0 <= s < 2**63 for s in seeds)


def test_algorithm_and_native_env_draw_different_numbers_from_one_seed():
    # Two generators seeded alike repeat each other: exploration draws would be the
    # env's reset draws. The run's streams must not be the same sequence.
    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm

    config = build_config("dqn", "CartPole-v1", flags={"seed": 7},
                          sets=["mlflow=false", "progress=false", "num_envs=1",
                                "backend=native"])
    algo = build_algorithm(config)
    env_gen = algo.env._generator  # the native CartPole's reset stream
    ours = torch.rand(64, generator=algo.generator.clone_state())
    theirs = torch.rand(64, generator=env_gen.clone_state())
    plain = torch.rand(64, generator=torch.Generator().manual_seed(7))
    assert not torch.equal(ours, theirs)
    assert not torch.equal(ours, plain) and not torch.equal(theirs, plain)
    algo.close()
