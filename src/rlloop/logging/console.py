"""Console progress: a live rich bar on a terminal, a plain line every few seconds elsewhere."""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

STEPS_KEY: Final = "env/steps"
RETURN_KEY: Final = "episode/return_mean"
EVAL_RETURN_KEY: Final = "eval/return_mean"
_RATE_WINDOW_S: Final = 10.0  # steps/s is measured over about the last 10 seconds
_LABEL: Final = "train"
_MIN_BAR, _MAX_BAR = 10, 40  # the live bar's width gives way to the text first
#: Durations from this long on show as ">999 d": `timedelta` overflows past ~2.7 million
#: years (``--total-env-steps 1e18``), and no ETA that far out is worth its digits.
_MAX_DAYS: Final = 999
_log = logging.getLogger(__name__)


def _fmt_duration(seconds: float) -> str:
    """``"0:01:23"``, ``"3 days, 0:00:05"``; ``">999 d"`` for more (or inf/NaN)."""
    if not seconds < (_MAX_DAYS + 1) * 86400:  # NaN too
        return f">{_MAX_DAYS} d"
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def format_number(value: float) -> str:
    """A return or loss for people: 4 significant digits, ``,`` from 1,000, never ``-0``.

    ``0.955 -> "0.955"``, ``-3e-05 -> "-3e-05"``, ``322.94 -> "322.9"``, ``-0.0 -> "0"``.
    """
    if value == 0:
        return "0"
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _percent(steps: int, total: int) -> str:
    # Floored and capped: the last iteration may overshoot the budget, and "100%" should
    # not show while steps remain.
    return f"{min(100, steps * 100 // total)}%"


def print_summary(
    lines: Mapping[str, str], console: Console | None = None, title: str = "Summary"
) -> None:
    """Print a short two-column table, e.g. ``{"env steps": "100,000", "time": "0:01:23"}``."""
    console = console or Console()
    if not console.is_terminal:
        # Plain lines for logs and pipes: a table would cut long paths to fit 80 columns.
        console.print(title, highlight=False)
        for name, value in lines.items():
            console.print(f"  {name}: {value}", highlight=False, soft_wrap=True)
        return
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for name, value in lines.items():
        table.add_row(name, value)
    console.print(table)


class ConsoleSink:
    """Show env steps (of the total), steps/s, latest train and eval return, and the ETA.

    Env steps come from the ``env/steps`` metric when present, else from `step`. On a
    terminal this is a live rich progress bar; otherwise (CI, pipes, tests) a plain line is
    printed at most every `print_interval_s` seconds, plus a final one on `close`.

    Args:
        total_env_steps: The run's budget, for the bar and the ETA; None if unknown.
        console: Where to write; a new `rich.console.Console` (stdout) by default.
        enabled: False makes every method a no-op (quiet runs).
        print_interval_s: Minimum seconds between plain lines when not on a terminal.
        clock: Seconds as a float; inject a fake one in tests.
    """

    def __init__(
        self,
        total_env_steps: int | None,
        console: Console | None = None,
        enabled: bool = True,
        *,
        print_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_env_steps = total_env_steps
        self.console = console or Console()
        self.enabled = enabled
        self._live = self.console.is_terminal and not self.console.is_dumb_terminal
        self._print_interval_s = print_interval_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque(maxlen=256)
        self._steps: int | None = None
        self._return: float | None = None
        self._eval_return: float | None = None
        self._last_print = -math.inf
        self._unprinted = False
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._bar = BarColumn()

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params are not shown on the console."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if not self.enabled:
            return
        now = self._clock()
        self._steps = int(metrics.get(STEPS_KEY, step))
        self._samples.append((now, self._steps))
        while now - self._samples[0][0] > _RATE_WINDOW_S and len(self._samples) > 2:
            self._samples.popleft()
        if RETURN_KEY in metrics:
            self._return = float(metrics[RETURN_KEY])
        if EVAL_RETURN_KEY in metrics:
            self._eval_return = float(metrics[EVAL_RETURN_KEY])
        if self._live:
            self._update_bar()
        elif now - self._last_print >= self._print_interval_s:
            self._print_line()
            self._last_print = now
        else:
            self._unprinted = True

    def steps_per_second(self) -> float | None:
        """Env steps per second over about the last 10 s; None before two reports."""
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def status_line(self, width: int | None = None) -> str:
        """The progress line as plain text; with `width`, shortened to fit it: short labels
        first, then steps/s, the train return and the eval return are left out, in that order.
        """
        steps = self._steps or 0
        total = self.total_env_steps
        rate = self.steps_per_second()
        progress = f"{steps:,}" + (f"/{total:,} ({_percent(steps, total)})" if total else "")
        rate_text = "-" if rate is None else f"{rate:,.0f}"
        # name -> (long form, short form), in reading order
        fields = {"steps": (f"steps {progress}", progress),
                  "rate": (f"{rate_text} steps/s", f"{rate_text}/s")}
        if self._return is not None:
            value = format_number(self._return)
            fields["return"] = (f"return {value}", f"ret {value}")
        if self._eval_return is not None:
            fields["eval"] = (f"eval {format_number(self._eval_return)}",) * 2
        if total and rate:
            fields["eta"] = (f"ETA {_fmt_duration(max(total - steps, 0) / rate)}",) * 2
        line = " | ".join(long for long, _ in fields.values())
        if width is None or len(line) <= width:
            return line
        for expendable in ("rate", "return", "eval"):
            line = " | ".join(short for _, short in fields.values())
            if len(line) <= width:
                return line
            fields.pop(expendable, None)
        return " | ".join(short for _, short in fields.values())

    def _layout(self) -> tuple[int, str]:
        """Bar width and status line that fit the console's width together (the live
        display is a one-row table: a squeezed table cuts every cell to "t…")."""
        room = self.console.width - len(_LABEL) - 2  # a space between each two columns
        line = self.status_line()
        if len(line) + _MIN_BAR > room:
            line = self.status_line(max(room - _MIN_BAR, 0))
        return max(min(_MAX_BAR, room - len(line)), 0), line

    def _update_bar(self) -> None:
        if self._progress is None:
            # Started on the first report, not in __init__, so setup output prints normally.
            self._progress = Progress(
                TextColumn(f"[bold]{_LABEL}"),
                self._bar,
                TextColumn("{task.fields[line]}"),
                console=self.console,
                refresh_per_second=4,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total_env_steps, line="")
        assert self._task is not None
        self._bar.bar_width, line = self._layout()
        self._progress.update(self._task, completed=self._steps, line=line)

    def _print_line(self) -> None:
        # soft_wrap: a log line is never broken at the console width ("ETA \n0:00:45").
        self.console.print(self.status_line(), markup=False, highlight=False, soft_wrap=True)
        self._unprinted = False

    def print_summary(self, lines: Mapping[str, str], title: str = "Summary") -> None:
        """Print a short final table on this sink's console (nothing when disabled)."""
        if self.enabled:
            print_summary(lines, self.console, title)

    def say(self, line: str) -> None:
        """Print one line of the run's own (nothing when disabled)."""
        if self.enabled:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self, status: str = "FINISHED") -> None:
        """Show the last line and end the live bar. Never raises: the run calls this
        directly (not through `MultiSink`) before its report, and a display that fails
        must not cost the report; the failure is one warning line."""
        if not self.enabled:
            return
        try:
            if self._progress is not None:
                try:
                    self._update_bar()
                finally:  # the terminal leaves live mode whatever the last update did
                    progress, self._progress = self._progress, None
                    progress.stop()
            elif self._unprinted:
                self._print_line()
            if status == "FAILED":  # a stop signal's KILLED is said by the run, in words
                self.console.print(f"run {status}", markup=False, highlight=False)
        except Exception as e:
            cause = " ".join(str(e).split()) or type(e).__name__
            _log.warning("console progress display failed (%s: %s); the run goes on",
                         type(e).__name__, cause)
            _log.debug("console progress display failed", exc_info=True)
