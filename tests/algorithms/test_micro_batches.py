"""Micro-batches (``ppo.micro_batch``): a minibatch passed in chunks makes the same update.

Gradients of the chunks add up in ``.grad`` with weights ``rows / minibatch rows``, and
advantages are standardised over the whole minibatch first, so weights, optimiser state
and every per-sample statistic equal the whole minibatch's up to float rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from learner_cases import ppo_batch, ppo_update_case

from rlloop.algorithms.ppo import PPOLearner
from rlloop.config.loading import build_config
from rlloop.config.ppo import AUTO_MICRO_BATCH, PPOConfig
from rlloop.data.rollout import RolloutBatch
from rlloop.envs.core import Discrete
from rlloop.errors import ConfigError
from rlloop.modules.actor_critic import ActorCritic


def _learner(cfg: PPOConfig, module_ids: tuple[str, ...] = ("a",)) -> PPOLearner:
    torch.manual_seed(0)
    module = ActorCritic((4,), Discrete(2), cfg.hidden, cfg.activation, 0.0)
    return PPOLearner({m: copy.deepcopy(module) for m in module_ids}, cfg)


def _update(learner: PPOLearner, batches: dict[str, RolloutBatch]) -> dict[str, float]:
    return learner.update_from_batch(batches, num_epochs=2, minibatch_size=None,
                                     generator=torch.Generator().manual_seed(5),
                                     env_steps=1000)


def _assert_same(chunked: PPOLearner, whole: PPOLearner, stats_c: dict[str, float],
                 stats_w: dict[str, float]) -> None:
    for (name, p), q in zip(chunked.modules.named_parameters(), whole.modules.parameters(),
                            strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert stats_c.keys() == stats_w.keys()
    for key, value in stats_w.items():
        if key.endswith("_throughput"):  # samples per second of wall time
            continue
        assert stats_c[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("micro", [1, 16, 23, 74])
def test_micro_batches_make_the_whole_minibatchs_update(micro):
    cfg = PPOConfig(micro_batch=None, max_grad_norm=0.3, ent_coef=0.01, clip_vf=0.2)
    whole, chunked = _learner(cfg), _learner(cfg)
    chunked.micro_batch = micro
    batch = ppo_batch(75, seed=1)
    stats_w = _update(whole, {"a": batch})
    stats_c = _update(chunked, {"a": batch})
    _assert_same(chunked, whole, stats_c, stats_w)
    # the norm before clipping was over the whole minibatch's gradient: clipping bit
    assert stats_w["a/gradients_default_global_norm"] > 0.3


def test_micro_batches_of_several_modules_with_uneven_batches():
    cfg = PPOConfig(micro_batch=None)
    whole, chunked = _learner(cfg, ("a", "b")), _learner(cfg, ("a", "b"))
    chunked.micro_batch = 10
    batches = {"a": ppo_batch(64, seed=1), "b": ppo_batch(21, seed=2)}
    _assert_same(chunked, whole, _update(chunked, batches), _update(whole, batches))


def test_micro_batches_do_not_change_the_distributed_reference_case():
    one = ppo_update_case().one  # the case several learner ranks must reproduce
    case = ppo_update_case(micro_batch=8)
    assert case.one.micro_batch == 8
    for p, q in zip(case.one.modules.parameters(), one.modules.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_chunked_update_runs_one_pass_per_micro_batch():
    learner = _learner(PPOConfig(micro_batch=None))
    learner.micro_batch = 16
    rows: list[int] = []
    forward = learner.forward_train

    def counted(module_id, batch):  # type: ignore[no-untyped-def]
        rows.append(len(batch))
        return forward(module_id, batch)

    learner.forward_train = counted  # type: ignore[method-assign]
    learner.update_from_batch({"a": ppo_batch(40, seed=3)}, num_epochs=1)
    assert rows == [14, 14, 12]  # ceil(40 / 16) = 3 passes of (nearly) equal rows


def test_micro_batch_setting_resolves_and_checks():
    assert build_config("ppo", "CartPole-v1").hparams.micro_batch == "auto"
    assert _learner(PPOConfig()).micro_batch == AUTO_MICRO_BATCH  # auto on a CPU
    assert _learner(PPOConfig(micro_batch=None)).micro_batch is None
    assert _learner(PPOConfig(micro_batch=512)).micro_batch == 512
    for bad in (0, -3):
        with pytest.raises(ConfigError, match=r"ppo.micro_batch must be > 0"):
            build_config("ppo", "CartPole-v1", sets=[f"ppo.micro_batch={bad}"])
    with pytest.raises(ConfigError, match="micro_batch"):
        build_config("ppo", "CartPole-v1", sets=["ppo.micro_batch=big"])
    cfg = build_config("ppo", "CartPole-v1", sets=["ppo.micro_batch=null"]).hparams
    assert cfg.micro_batch is None


def test_recurrent_ppo_passes_whole_minibatches():
    from rlloop.algorithms.recurrent_ppo import RecurrentPPOLearner

    learner = RecurrentPPOLearner({"a": torch.nn.Linear(2, 2)}, PPOConfig(micro_batch=4))
    assert learner.micro_batch is None
