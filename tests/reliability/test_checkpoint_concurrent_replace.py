"""Loading ``best/`` while another process replaces it again and again: every load sees
the old or the new checkpoint, whole; none reports damage that is not there."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlloop.checkpoint import load_checkpoint, save_replacing, verify_checkpoint

from ._cli import cli_environ

N = 50_000  # floats per tensor: reads long enough for replaces to land in the middle
REPLACES = 100

WRITER = textwrap.dedent("""
    import sys
    import torch
    import rlloop.checkpoint.store as store
    from rlloop.checkpoint import save_replacing

    torch.set_num_threads(1)
    path, n, replaces, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if how == "two renames":  # the path taken where renameat2(RENAME_EXCHANGE) is missing
        store._exchange = lambda a, b: False
    for i in range(1, replaces + 1):
        save_replacing(path, {"w": {"a": torch.full((n,), float(i)),
                                    "b": torch.full((n,), -float(i))}, "i": i})
""")


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder in memory where there is one: with fsync free, replaces come every few
    milliseconds, so many of them land in the middle of a read."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="rlloop-test-") as path:
        yield Path(path)


def state(i: int) -> dict[str, object]:
    return {"w": {"a": torch.full((N,), float(i)), "b": torch.full((N,), -float(i))}, "i": i}


@pytest.mark.parametrize("how", ["exchange", "two renames"])
def test_reads_during_replaces_see_old_or_new(fast_dir: Path, how: str) -> None:
    best = fast_dir / "best"
    save_replacing(best, state(0))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(best), str(N), str(REPLACES),
                               how], env=cli_environ(), stderr=subprocess.PIPE, text=True)
    loads, seen = 0, set[int]()
    try:
        while writer.poll() is None:
            ckpt = load_checkpoint(best)  # raises on any "damaged" report
            i = ckpt.components["i"]
            a, b = ckpt.components["w"]["a"], ckpt.components["w"]["b"]
            assert a.shape == b.shape == (N,), f"load {loads}: shapes mixed"
            assert bool((a == i).all()) and bool((b == -i).all()), f"load {loads}: values mixed"
            verify_checkpoint(best)
            loads, seen = loads + 1, seen | {i}
    finally:
        if writer.poll() is None:
            writer.kill()
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert load_checkpoint(best).components["i"] == REPLACES
    assert loads > 20 and len(seen) > 10, (loads, len(seen))  # it really raced the writer
