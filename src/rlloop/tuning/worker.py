"""``python -m rlloop.tuning.worker DIR INDEX``: one of ``rlloop tune --jobs J``'s processes.

It runs trials of the study in DIR until the study holds its number of finished trials;
the ``rlloop tune`` process that started it holds the directory's lock.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from rlloop.envs.gym_worker import die_with_parent
from rlloop.envs.ids import resolve_env_id
from rlloop.system.signals import terminate_as_interrupt
from rlloop.tuning.settings import load_settings
from rlloop.tuning.study import Study


def main(argv: list[str]) -> int:
    # A SIGTERM (forwarded by `rlloop tune`, or sent when it dies) ends the trial in
    # flight as a stopped run, to be retried by the next --resume; between trials it
    # stops the worker as Ctrl-C does.
    die_with_parent(signal.SIGTERM)
    path = Path(argv[0])
    settings = load_settings(path)
    # `rlloop tune` checked the env id (typed by the user, or consented to): a module it
    # names is imported from the working directory too, which -P left off sys.path.
    resolve_env_id(settings.env, allow_import=True, search_cwd=True)
    try:
        with terminate_as_interrupt():
            Study(path, settings, quiet=True, worker=int(argv[1])).optimize()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
