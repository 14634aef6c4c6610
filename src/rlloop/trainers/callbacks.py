"""User callbacks on the one loop, for ``Model.learn(callbacks=[...])`` and
``rlloop train --callback module:Class``.

A :class:`Callback` sees the flat stats of every iteration and every eval, the path of
every checkpoint written and the run's result. Returning ``False`` from ``on_step`` or
``on_eval`` stops the run at the end of that iteration (the final checkpoint and the
report are written as for any other stop); ``None`` or anything true goes on (a false
value of another type, such as numpy's ``False``, stops as well).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlloop.errors import ConfigError
from rlloop.system.user_code import CALLBACK_NOTE, import_user_module, one_line

if TYPE_CHECKING:
    from rlloop.trainers.loop import Stats, Trainer
    from rlloop.trainers.result import RunResult


class Callback:
    """Override the hooks you need; every hook's default does nothing and goes on."""

    def on_step(self, stats: Stats) -> bool | None:
        """After every iteration (flat stats such as ``env/steps``); False stops the run."""
        return None

    def on_eval(self, stats: Stats) -> bool | None:
        """After every evaluation (``eval/return_mean``, ...); False stops the run."""
        return None

    def on_checkpoint(self, path: Path) -> None:
        """After a checkpoint was written to ``path`` (periodic and final ones; a final
        checkpoint at the step of a periodic one rewrites it, and ``path`` comes again)."""

    def on_train_end(self, result: RunResult) -> None:
        """Once the run is over, with what it reports."""


class UserCallbacks:
    """User :class:`Callback`\\ s: one trainer callback each (:meth:`each`), their
    checkpoint and end-of-training hooks, and the stop one of them asked for."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)
        self.stopped_by: str | None = None

    def ask(self, cb: Callback, hook: Callable[[Stats], Any], stats: Stats,
             name: str) -> None:
        """Call ``hook``; a false answer other than None stops the run (reading the answer,
        e.g. a numpy array's truth, counts as the callback's own code)."""
        def stops(s: Stats) -> bool:
            answer = hook(s)
            return answer is not None and not answer

        if _called(cb, stops, stats, name) and self.stopped_by is None:
            self.stopped_by = f"callback {type(cb).__name__}"

    def each(self) -> list[_OneUserCallback]:
        """One trainer callback per user callback (each asked by itself: the stop it asks
        for names it)."""
        return [_OneUserCallback(self, cb) for cb in self.callbacks]

    def checkpoint(self, path: Path) -> None:
        for cb in self.callbacks:
            _called(cb, cb.on_checkpoint, path, "on_checkpoint")

    def train_end(self, result: RunResult) -> None:
        for cb in self.callbacks:
            _called(cb, cb.on_train_end, result, "on_train_end")


class _OneUserCallback:
    """The trainer callback for one user :class:`Callback` of a :class:`UserCallbacks`."""

    def __init__(self, owner: UserCallbacks, callback: Callback) -> None:
        self.owner, self.callback = owner, callback

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        self.owner.ask(self.callback, self.callback.on_step, stats, "on_step")

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        self.owner.ask(self.callback, self.callback.on_eval, stats, "on_eval")


def as_callbacks(callbacks: object) -> list[Callback]:
    """``callbacks`` as a list (one may be passed alone, as in SB3); anything that is not a
    :class:`Callback` is refused (``ConfigError``) before training starts."""
    one = isinstance(callbacks, Callback) or not isinstance(callbacks, Iterable)
    items: list[object] = [callbacks] if one else list(cast(Iterable[object], callbacks))
    good = [cb for cb in items if isinstance(cb, Callback)]
    if len(good) < len(items):
        wrong = ", ".join(repr(cb) for cb in items if not isinstance(cb, Callback))
        raise ConfigError(f"callbacks must be rlloop.Callback instances (subclass it and "
                          f"override on_step, on_eval, ...), got {wrong}")
    return good


def _called(cb: Callback, hook: Callable[[Any], Any], arg: Any, name: str) -> Any:
    """``hook(arg)`` (``cb``'s hook ``name``, or its answer's reading); an error it raises
    goes on as it is, noted with the callback's name (the CLI's error line names it: a
    user's code, not rlloop's)."""
    try:
        return hook(arg)
    except Exception as e:
        e.add_note(f"{CALLBACK_NOTE}{type(cb).__name__}.{name}")
        raise


def load_callback(spec: str) -> Callback:
    """An instance of ``module:Class`` (made with no arguments); imports ``module``.

    Only for names the user typed (``--callback``): importing runs the module's code.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--callback expects module:Class, got {spec!r}")
    # the working directory first, as before: a user's profile.py is not the stdlib's
    module = import_user_module(module_name, f"--callback {spec}", cwd_first=True)
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"--callback {spec}: module {module_name!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise ConfigError(f"--callback {spec}: {attr} is not a subclass of "
                          "rlloop.trainers.callbacks.Callback")
    try:
        callback = cls()
    except TypeError as e:
        raise ConfigError(f"--callback {spec}: {attr}() cannot be made without arguments "
                          f"({e}); give its parameters defaults") from None
    except Exception as e:
        raise ConfigError(f"--callback {spec}: {attr}() raised {type(e).__name__}: "
                          f"{one_line(e)}; fix the class") from None
    if not isinstance(callback, Callback):
        raise ConfigError(f"--callback {spec}: {attr} is not a subclass of "
                          "rlloop.trainers.callbacks.Callback")
    return callback
