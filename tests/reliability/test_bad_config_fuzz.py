"""A fuzz of bad configs: each raises a typed ConfigError at build time, before any env exists."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

import rlloop.algorithms.base as algorithms_base
from rlloop.algorithms import ALGORITHMS
from rlloop.config import RunConfig
from rlloop.errors import ConfigError
from rlloop.run import build_algorithm

from ._algos import ALGOS, small_config


def _wrong_type_values(tp) -> list:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return ["maybe", 3]
    if tp is int:
        return ["many", 2.5, True]
    if tp is float:
        return ["fast", [1.0]]
    if origin is typing.Literal:
        return ["bogus-choice"]
    if origin is list:
        return ["not-a-list", 5]
    if origin in (typing.Union, types.UnionType):
        return [v for a in args if a is not type(None) for v in _wrong_type_values(a)
                if not any(_accepts(b, v) for b in args)]
    return []


def _accepts(tp, value) -> bool:
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return tp is type(value)


def _cases():
    for algo in ALGOS:
        cls = ALGORITHMS[algo].config_cls
        for section, klass in ((algo, cls), ("", RunConfig)):
            hints = typing.get_type_hints(klass)
            for f in dataclasses.fields(klass):
                if f.name in ("hparams", "algo", "env", "env_kwargs"):
                    continue
                for value in _wrong_type_values(hints[f.name]):
                    key = f"{section}.{f.name}" if section else f.name
                    yield algo, f"{key}={value!r}".replace("'", "")
        yield algo, f"{algo}.no_such_key=1"
        yield algo, "no_such_top_level=1"
        for key in ("num_envs", "total_env_steps", "eval_episodes", "keep_checkpoints"):
            yield algo, f"{key}=0"
            yield algo, f"{key}=-3"
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sizes = ("size", "num_", "steps", "capacity", "interval")
            if any(w in f.name for w in sizes) and hints[f.name] is int:
                yield algo, f"{algo}.{f.name}=-1"


CASES = list(_cases())


@pytest.fixture
def no_env(monkeypatch):
    made = []
    real = algorithms_base.make_env
    monkeypatch.setattr(algorithms_base, "make_env",
                        lambda *a, **k: made.append(a) or real(*a, **k))
    return made


@pytest.mark.parametrize(("algo", "setting"), CASES, ids=[f"{a}:{s}" for a, s in CASES])
def test_bad_setting_is_a_config_error(algo, setting, no_env):
    with pytest.raises(ConfigError):
        build_algorithm(small_config(algo, extra=(setting,)))
    assert no_env == []


def test_minibatch_larger_than_batch(no_env):
    with pytest.raises(ConfigError, match="larger than the batch"):
        build_algorithm(small_config("ppo", extra=("ppo.minibatch_size=100000",)))
    assert no_env == []


def test_fuzz_is_not_empty():
    assert len(CASES) > 40
