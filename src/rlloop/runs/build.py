"""Building an algorithm from a run config: the registry entry's builder (and Ray env
runners when the config asks for them), for the env settings the pre-flight checks found."""

from __future__ import annotations

from rlloop.algorithms.base import AlgorithmBase, EnvSettings
from rlloop.config.appo import ASYNC_ALGOS, ray_runner_settings
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import RunConfig
from rlloop.runs.preflight import check_fit

#: The components of a run's checkpoint.
COMPONENTS = ("algorithm", "trainer", "rng")


def build_algorithm(config: RunConfig, settings: EnvSettings | None = None) -> AlgorithmBase:
    """Build the algorithm (and its Ray env runners when the config asks for them) for the
    env ``settings`` that :func:`~rlloop.runs.preflight.check_fit` found (it runs here when
    they are not given)."""
    if settings is None:
        settings = check_fit(config)
    algorithm = ALGORITHMS[config.algo].build(config.hparams, settings)
    if config.num_env_runners and config.algo in ASYNC_ALGOS and config.ray.address is None:
        from rlloop.runners.async_runners import attach_async_runners

        try:
            attach_async_runners(algorithm, config, build_algorithm)
        except BaseException:
            algorithm.close()
            raise
    elif config.num_env_runners:
        from rlloop.runners.ray_runners import attach_env_runners

        try:
            attach_env_runners(algorithm, ray_runner_settings(config), build_algorithm)
        except BaseException:
            algorithm.close()
            raise
    return algorithm
