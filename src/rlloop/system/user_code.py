"""Importing a module a user named (``--set ppo.net=module:Class``, ``--callback
module:Class``), with one-line errors that tell a missing module from a module that
failed; and the note that marks an error raised by a user's callback. Torch-free."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

#: Prefix of the note (``BaseException.add_note``) on an error a user callback raised.
CALLBACK_NOTE = "raised in callback "


def import_user_module(module: str, label: str, *, cwd_first: bool = False) -> ModuleType:
    """``importlib.import_module(module)``, also from the working directory (where a
    user's module usually is; console scripts, unlike ``python -m``, do not search it):
    searched last, or first with ``cwd_first`` (as ``python -m`` searches it).

    Raises ConfigError, prefixed with ``label`` (what named the module), in one line:
    no such module, a module whose own imports fail, or one that raised while importing.
    """
    from rlloop.errors import ConfigError

    if module not in sys.modules and os.getcwd() not in sys.path and "" not in sys.path:
        if cwd_first:
            sys.path.insert(0, os.getcwd())
        else:
            sys.path.append(os.getcwd())  # appended: it never shadows an installed package
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == module or module.startswith(e.name + ".")):
            raise ConfigError(f"{label}: no module named {module!r}; put it on PYTHONPATH "
                              "or run from the directory that holds it") from None
        raise ConfigError(f"{label}: importing {module!r} failed ({one_line(e)}); install "
                          "what it needs") from None
    except Exception as e:  # the user's module raised while importing (a SyntaxError too)
        raise ConfigError(f"{label}: importing {module!r} raised {type(e).__name__}: "
                          f"{one_line(e)}; fix the module") from None


def callback_note(error: BaseException) -> str | None:
    """``Class.hook`` of the user callback that raised ``error``, or None."""
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, str) and note.startswith(CALLBACK_NOTE):
            return note[len(CALLBACK_NOTE):]
    return None


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
