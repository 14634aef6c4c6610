"""Rendering without a display, for the envs a run films or ``check_env`` renders."""

from __future__ import annotations

import os


def offscreen_rendering() -> None:
    """Let pygame-drawn envs (Gymnasium's classic control) and MuJoCo envs render without
    a display.

    SDL otherwise looks for one and prints ``error: XDG_RUNTIME_DIR is invalid or not set``
    on every run; pygame also prints a banner to stdout when imported. Set before an env
    is made, so subprocess envs inherit it; a value the user set is kept.
    """
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # MuJoCo's default (GLFW) needs a display; EGL renders without one.
        os.environ.setdefault("MUJOCO_GL", "egl")
