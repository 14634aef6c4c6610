"""The task API: bring your own algorithm, let rlloop run the envs, batches and checkpoints.

What lives here: ``base`` (`Task`, its config and hooks), ``sampling`` (env worker pools
with batched inference), ``dataset`` (trajectories -> minibatches), ``trainer``
(`TaskTrainer`: the one loop with a task's update).

May import: everything up to ``runs`` (the run directory, video, reports); nothing in rlloop
imports it: a user's script does.
"""

from rlloop.tasks.base import Episode, Task, TaskConfig
from rlloop.tasks.dataset import TrajectoryDataset, collate, make_dataloader
from rlloop.tasks.sampling import Sample, SamplingStats, iter_trajectories
from rlloop.tasks.trainer import TaskTrainer, all_finite

__all__ = [
    "Episode",
    "Sample",
    "SamplingStats",
    "Task",
    "TaskConfig",
    "TaskTrainer",
    "TrajectoryDataset",
    "all_finite",
    "collate",
    "iter_trajectories",
    "make_dataloader",
]
