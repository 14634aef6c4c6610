"""PPO's, APPO's and SAC's learners as L data-parallel ranks (``num_learners=L``).

What keeps L ranks equal to one learner on the whole batch, beyond the shared machinery of
:mod:`rlloop.learners.distributed`:

* PPO (and APPO, whose batch rank 0 has V-trace'd) standardises advantages over the whole
  minibatch before it is split (a rank's shard
  alone would give other means and stds), then its loss leaves them as they are.
* SAC draws the policy noise for the whole batch from the generator state rank 0 sent, and
  each rank takes its rows, so every sample sees the noise it would see in one learner.
  Its non-finite guard takes every rank's loss into account.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlloop.algorithms.appo import APPOLearner
from rlloop.algorithms.ppo import PPOLearner, policy_factory
from rlloop.algorithms.sac import SACLearner, SACModule, sac_module_factory
from rlloop.config.appo import APPOConfig
from rlloop.config.offpolicy import SACConfig
from rlloop.config.ppo import PPOConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.action_masks import resolve_action_mask
from rlloop.errors import ConfigError
from rlloop.learners.distributed import DataParallel, Link
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.learners.learner_group import Launcher, LearnerSpec, start_group
from rlloop.learners.optim_step import GuardedStep
from rlloop.learners.process_group import GroupInfo, destroy_group
from rlloop.modules.custom import resolve_net
from rlloop.system.devices import build_module, new_generator

if TYPE_CHECKING:
    from rlloop.algorithms.base import AlgorithmBase
    from rlloop.config.run_config import RunConfig


class DataParallelPPOLearner(DataParallel, PPOLearner):  # type: ignore[misc]
    """:class:`PPOLearner` on one rank's shard of every minibatch (its
    :meth:`~PPOLearner.prepare_minibatch` standardises the whole minibatch first)."""


class DataParallelAPPOLearner(DataParallel, APPOLearner):  # type: ignore[misc]
    """:class:`~rlloop.algorithms.appo.APPOLearner` on one rank's shard of every minibatch."""


class AllReduceStep(GuardedStep):
    """:class:`GuardedStep` with the gradients all-reduced between backward and clipping,
    skipped on every rank when any rank's loss is non-finite."""

    def __init__(self, reduce: Callable[[], None]) -> None:
        super().__init__()
        self.reduce = reduce

    def __call__(self, loss: Tensor) -> None:
        for o in self.optims:
            for p in o.params:
                p.grad = None
        loss.backward()  # type: ignore[no-untyped-call]
        self.reduce()
        finite = torch.isfinite(loss.detach()).to(torch.float32)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        self.apply(finite.bool())


class DataParallelSACLearner(DataParallel, SACLearner):  # type: ignore[misc]
    """:class:`SACLearner` on one rank's shard of every batch."""

    def __init__(self, modules: Mapping[str, SACModule], config: SACConfig,
                 target_entropy: float, generator: torch.Generator,
                 on_nonfinite: str = "skip") -> None:
        super().__init__(modules, config, target_entropy, generator, on_nonfinite)
        step = AllReduceStep(self.reduce_gradients)
        for optim in self.step.optims:
            step.add(optim)
        self.step = step

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        if self.link is None:
            return self._sharded_update(batch)
        with self.link.guard():
            self.link.send("update", {"batch": batch, "generator": self.generator.get_state(),
                                      "updates": self.updates, "env_steps": self.env_steps})
            return self._sharded_update(batch)

    def _sharded_update(self, batch: Transitions) -> dict[str, Tensor]:
        m = self.module()
        next_noise, noise = self._noise(m, batch)
        start, stop = self.shard(DEFAULT_MODULE_ID, len(batch))
        if not self.config.use_sde:  # per-row noise; gSDE's is one matrix for the batch
            next_noise, noise = next_noise[start:stop], noise[start:stop]
        stats = self._loss_step(batch.rows(start, stop), next_noise, noise)
        stats = self.reduce_stats(stats, self._weights[DEFAULT_MODULE_ID])
        self.after_update()
        return stats

    def handle(self, op: str, payload: dict[str, Any]) -> None:
        if op != "update":
            return super().handle(op, payload)
        self.generator.set_state(payload["generator"].cpu())
        self.updates = int(payload["updates"])
        if payload["env_steps"] != self.env_steps:
            self.before_gradient_based_update(int(payload["env_steps"]))
        self._sharded_update(payload["batch"])
        return None


def build_rank_learner(spec: LearnerSpec, group: GroupInfo, device: torch.device,
                       link: Link | None, module: nn.Module | None = None,
                       generator: torch.Generator | None = None) -> DataParallel:
    """One rank's learner; rank 0 passes the algorithm's own module and generator, the
    other ranks build their own (rank 0's weights reach them before the first update)."""
    config, env = spec.config, spec.env_spec
    on_nonfinite = cast(Literal["skip", "raise"], spec.on_nonfinite)
    learner: DataParallel
    if isinstance(config, PPOConfig):
        # The algorithm's own policy, as rank 0 built it (masks, gSDE, encoders, nets).
        features = resolve_net(config.net, "ppo.net") if config.net else None
        mask_dims = resolve_action_mask(config.action_mask, env, config.section)
        module = module or build_module(policy_factory(env, config, mask_dims, features),
                                        device)
        cls = (DataParallelAPPOLearner if isinstance(config, APPOConfig)
               else DataParallelPPOLearner)
        learner = cls({DEFAULT_MODULE_ID: module}, config, on_nonfinite)
    elif isinstance(config, SACConfig):
        space = env.action_space
        entropy = (-float(space.dim) if config.target_entropy is None
                   else config.target_entropy)
        module = module or build_module(sac_module_factory(env, space.dim, config), device)
        learner = DataParallelSACLearner({DEFAULT_MODULE_ID: cast(SACModule, module)},
                                         config, entropy,
                                         generator or new_generator(device, spec.seed),
                                         on_nonfinite)
    else:
        raise ConfigError(f"num_learners > 1 needs ppo, appo or sac, not "
                          f"{type(config).__name__}")
    comm = device if group.backend == "nccl" else torch.device("cpu")
    learner.join(group, link, comm)
    return learner


def _launcher(config: RunConfig, device: torch.device) -> Launcher | None:
    """Ray actors for ranks 1..L-1 when the run uses Ray (see ``ray.learner_actors``);
    None spawns processes. Ray is imported only then."""
    from rlloop.config.ray import learner_actors

    if not learner_actors(config):
        return None
    from rlloop.learners.ray_learners import RayLauncher

    gpus = config.ray.num_gpus_per_learner
    return RayLauncher(config.ray.num_cpus_per_learner,
                       (1.0 if device.type == "cuda" else 0.0) if gpus is None else gpus)


def start_learners(algorithm: AlgorithmBase, config: RunConfig) -> None:
    """With ``num_learners > 1``: form the learner group and give ``algorithm`` rank 0's
    learner, over its own module and generator. A rank > 0 started by ``torchrun`` serves
    rank 0 here and exits when the run ends."""
    if config.num_learners == 1:
        return
    if getattr(config.hparams, "compile", False):
        raise ConfigError(f"{config.algo}.compile=true does not combine with num_learners > 1 "
                          "(the gradient all-reduce runs between backward and the step); "
                          "set compile=false or num_learners=1")
    module = getattr(algorithm, "policy", None) or getattr(algorithm, "module", None)
    spec = LearnerSpec(build_rank_learner, config.hparams, algorithm.settings.spec,
                       str(algorithm.device), config.on_nonfinite, config.seed,
                       config.torch_threads)
    group, link, serve = start_group(spec, config.num_learners, algorithm.device,
                                     _launcher(config, algorithm.device))
    try:
        learner = build_rank_learner(spec, group, algorithm.device, link, module,
                                     algorithm.generator)
    except BaseException:
        if link is not None:
            link.close()
        raise
    algorithm.learner = learner
    if link is None:  # a torchrun rank > 0: the training process is rank 0's
        try:
            serve(learner)
        finally:
            destroy_group()
        raise SystemExit(0)
    learner.broadcast_state()
