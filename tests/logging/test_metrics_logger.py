"""MetricsLogger: every reduction checked against hand-computed values."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FakeClock

from rlloop.logging import MetricsLogger, flatten_mapping


def log_all(logger: MetricsLogger, key: str, values: list[float], **kwargs: object) -> None:
    for v in values:
        logger.log_value(key, v, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reduce", "expected"),
    [("mean", (3 + 4 + 5) / 3), ("min", 3.0), ("max", 5.0), ("sum", 12.0)],
)
def test_window_reduces_over_last_w_values(reduce: str, expected: float) -> None:
    logger = MetricsLogger()
    log_all(logger, "x", [1, 2, 3, 4, 5], reduce=reduce, window=3)
    assert logger.reduce() == {"x": pytest.approx(expected)}


def test_window_persists_across_reduces_without_clear() -> None:
    logger = MetricsLogger()
    log_all(logger, "x", [1, 2], window=2)
    assert logger.reduce()["x"] == 1.5
    logger.log_value("x", 10)
    assert logger.reduce()["x"] == 6.0  # last two values: 2 and 10


def test_ema() -> None:
    logger = MetricsLogger()
    log_all(logger, "x", [2, 4, 8], ema_coeff=0.5)
    # 2 -> 2 + 0.5 * (4 - 2) = 3 -> 3 + 0.5 * (8 - 3) = 5.5
    assert logger.peek("x") == 5.5
    logger.log_value("x", 1.5)
    assert logger.reduce()["x"] == pytest.approx(3.5)  # EMA continues across reduces


def test_plain_mean_min_max_are_lifetime_without_window() -> None:
    logger = MetricsLogger()
    log_all(logger, "mean", [1, 2, 3])
    log_all(logger, "min", [5, 2, 7], reduce="min")
    log_all(logger, "max", [5, 2, 7], reduce="max")
    assert logger.reduce() == {"mean": 2.0, "min": 2.0, "max": 7.0}
    logger.log_value("mean", 10)
    logger.log_value("min", 3)
    logger.log_value("max", 9)
    assert logger.reduce() == {"mean": 4.0, "min": 2.0, "max": 9.0}


def test_lifetime_sum_keeps_accumulating() -> None:
    logger = MetricsLogger()
    log_all(logger, "env/steps_lifetime", [100, 50], reduce="sum")
    assert logger.reduce() == {"env/steps_lifetime": 150.0}
    assert logger.reduce() == {"env/steps_lifetime": 150.0}
    logger.log_value("env/steps_lifetime", 25)
    assert logger.reduce() == {"env/steps_lifetime": 175.0}


def test_clear_on_reduce() -> None:
    logger = MetricsLogger()
    log_all(logger, "env/steps", [100, 50], reduce="sum", clear_on_reduce=True)
    log_all(logger, "loss", [1.0, 3.0], clear_on_reduce=True)
    assert logger.reduce() == {"env/steps": 150.0, "loss": 2.0}
    # Nothing logged since: the sum is 0, the mean has no value and is left out.
    assert logger.reduce() == {"env/steps": 0.0}
    logger.log_value("loss", 5.0)
    logger.log_value("env/steps", 10)
    assert logger.reduce() == {"env/steps": 10.0, "loss": 5.0}


def test_clear_on_reduce_with_window_and_ema() -> None:
    logger = MetricsLogger()
    log_all(logger, "w", [1, 2, 3], window=2, clear_on_reduce=True)
    log_all(logger, "e", [2, 4], ema_coeff=0.5, clear_on_reduce=True)
    assert logger.reduce() == {"w": 2.5, "e": 3.0}
    logger.log_value("w", 7)
    logger.log_value("e", 7)
    assert logger.reduce() == {"w": 7.0, "e": 7.0}  # both restarted from scratch


def test_throughput_with_controlled_clock() -> None:
    clock = FakeClock()
    logger = MetricsLogger(clock=clock)
    logger.log_value("steps", 100, reduce="sum", with_throughput=True)  # created at t=0
    clock.t = 1.0
    logger.log_value("steps", 100)
    clock.t = 2.0
    assert logger.reduce() == {"steps": 200.0, "steps_throughput": 100.0}  # 200 in 2 s
    clock.t = 3.0
    logger.log_value("steps", 50)
    clock.t = 4.0
    assert logger.reduce() == {"steps": 250.0, "steps_throughput": 25.0}  # 50 in 2 s
    clock.t = 8.0
    assert logger.reduce() == {"steps": 250.0, "steps_throughput": 0.0}


def test_throughput_of_a_per_iteration_sum() -> None:
    clock = FakeClock()
    logger = MetricsLogger(clock=clock)
    logger.log_value("n", 30, reduce="sum", clear_on_reduce=True, with_throughput=True)
    clock.t = 3.0
    assert logger.reduce() == {"n": 30.0, "n_throughput": 10.0}
    logger.log_value("n", 10)
    clock.t = 8.0
    assert logger.reduce() == {"n": 10.0, "n_throughput": 2.0}


def test_tensors_are_converted_at_reduce_and_detached() -> None:
    logger = MetricsLogger()
    w = torch.tensor(2.0, requires_grad=True)
    loss = w * 3  # has an autograd graph
    logger.log_value("loss", loss)
    logger.log_value("loss", torch.tensor([4]))  # one-element int tensor
    logger.log_value("loss", 2)
    pending = logger._stats["loss"].pending
    assert all(not (isinstance(v, torch.Tensor) and v.requires_grad) for v in pending)
    assert logger.reduce() == {"loss": pytest.approx(4.0)}
    with pytest.raises(ValueError, match="one-element"):
        logger.log_value("loss", torch.ones(2))
    with pytest.raises(TypeError, match="number or tensor"):
        logger.log_value("loss", "1.0")  # type: ignore[arg-type]


def test_many_values_fold_in_batches() -> None:
    logger = MetricsLogger()
    for i in range(5000):
        logger.log_value("x", float(i), window=4)
        logger.log_value("s", torch.tensor(1.0), reduce="sum")
    assert len(logger._stats["x"].pending) < 1024  # bounded between reduces
    assert logger.reduce() == {"x": (4996 + 4997 + 4998 + 4999) / 4, "s": 5000.0}


def test_tuple_keys_and_nested_dicts_are_flattened() -> None:
    logger = MetricsLogger()
    logger.log_value(("default_policy", "policy_loss"), 1.0, window=1)
    logger.log_dict({("p1", "loss"): 2.0, "p2": {"loss": 3.0, "vf": {"loss": 4.0}}}, window=1)
    assert logger.reduce() == {
        "default_policy/policy_loss": 1.0,
        "p1/loss": 2.0,
        "p2/loss": 3.0,
        "p2/vf/loss": 4.0,
    }
    assert logger.peek(("p2", "vf", "loss")) == 4.0
    assert ("p1", "loss") in logger
    assert flatten_mapping({"a": {"b": 1}, ("c", "d"): 2}) == {"a/b": 1, "c/d": 2}


def test_log_dict_settings_apply_to_every_key() -> None:
    logger = MetricsLogger()
    logger.log_dict({"a": 1, "b": 2}, reduce="sum")
    logger.log_dict({"a": 1, "b": 2}, reduce="sum")
    assert logger.reduce() == {"a": 2.0, "b": 4.0}


def test_delete_prefix() -> None:
    logger = MetricsLogger()
    for key in ["m1", "m1/loss", "m1/opt/lr", "m10/loss", "m2/loss"]:
        logger.log_value(key, 1.0)
    logger.delete("m1")
    assert sorted(logger.reduce()) == ["m10/loss", "m2/loss"]
    logger.delete(("m2",))
    assert logger.keys() == ["m10/loss"]
    logger.delete("absent")  # no error


def test_peek_does_not_clear_and_handles_missing() -> None:
    logger = MetricsLogger()
    logger.log_value("x", 1.0, clear_on_reduce=True)
    assert logger.peek("x") == 1.0
    assert logger.peek("x") == 1.0
    assert logger.reduce() == {"x": 1.0}
    assert logger.peek("x", default=None) is None  # emptied by clear_on_reduce
    with pytest.raises(KeyError, match="nope"):
        logger.peek("nope")
    assert logger.peek("nope", 0.0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 3, "ema_coeff": 0.1}, "either window=3 or ema_coeff=0.1"),
        ({"reduce": "sum", "ema_coeff": 0.1}, "ema_coeff needs reduce='mean'"),
        ({"ema_coeff": 1.5}, "ema_coeff must be in"),
        ({"reduce": "median"}, "reduce must be one of"),
        ({"window": 0}, "window must be >= 1"),
        ({"with_throughput": True}, "with_throughput needs reduce='sum'"),
    ],
)
def test_bad_settings_raise_clear_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MetricsLogger().log_value("x", 1.0, **kwargs)  # type: ignore[arg-type]


def test_empty_key_rejected() -> None:
    with pytest.raises(ValueError):
        MetricsLogger().log_value("", 1.0)
    with pytest.raises(TypeError):
        MetricsLogger().log_value((), 1.0)


def test_state_round_trip_continues_every_reduction() -> None:
    def fill(logger: MetricsLogger) -> None:
        log_all(logger, "w", [1, 2, 3], window=2)
        log_all(logger, "e", [2, 4], ema_coeff=0.5)
        log_all(logger, "life", [10, 20], reduce="sum")
        log_all(logger, "it", [1, 1], reduce="sum", clear_on_reduce=True)
        log_all(logger, "lo", [3, -1], reduce="min")
        log_all(logger, "m", [1, 2])
        logger.log_value("t", torch.tensor(7.0), reduce="max")

    def more(logger: MetricsLogger) -> None:
        for key in ["w", "e", "life", "lo", "m", "t"]:
            logger.log_value(key, -5.0)

    original = MetricsLogger()
    fill(original)
    state = json.loads(json.dumps(original.get_state()))  # plain data
    restored = MetricsLogger()
    restored.log_value("stale", 1.0)  # replaced by set_state
    restored.set_state(state)
    assert restored.reduce() == original.reduce()
    more(original)
    more(restored)
    # e: 3 + 0.5 * (-5 - 3) = -1; m: (1 + 2 - 5) / 3.
    expected = {"w": -1.0, "e": -1.0, "life": 25.0, "it": 0.0, "lo": -5.0, "m": -2 / 3, "t": 7.0}
    assert original.reduce() == restored.reduce() == pytest.approx(expected)


def test_set_state_rejects_unknown_version() -> None:
    with pytest.raises(ValueError, match="version"):
        MetricsLogger().set_state({"version": 99, "stats": {}})


def test_reset() -> None:
    logger = MetricsLogger()
    logger.log_value("x", 1.0)
    logger.reset()
    assert logger.reduce() == {}
    assert len(logger) == 0


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_sum_does_not_depend_on_when_values_were_folded(reduce):
    """A checkpoint folds pending values; the fold added them as one group
    (``acc + sum(new)``), so a run's saved sums differed in the last bits with the
    checkpoint cadence (off-policy learners log the learning rate every step)."""
    values = [0.1, 0.7, 1e-3, 0.35, 2.2, 0.9, 1e-7] * 40

    def total(fold_every: int) -> dict:
        m = MetricsLogger()
        for i, v in enumerate(values):
            m.log_value("x", v, reduce=reduce, with_throughput=reduce == "sum")
            if i % fold_every == 0:
                m.get_state()  # what a checkpoint does
        return m.get_state()["stats"]["x"]

    once, often, odd = total(10**9), total(1), total(37)
    assert once["acc"] == often["acc"] == odd["acc"]
    assert once["since_reduce"] == often["since_reduce"] == odd["since_reduce"]
