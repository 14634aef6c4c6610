"""The task API: bring your own algorithm, let rlloop run the envs, batches and checkpoints."""

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
