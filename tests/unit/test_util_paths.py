"""noded.util.paths: whether something is at a path, absent only where the kernel says so
(ENOENT, ENOTDIR); every other error raised, where os.path's answers are False. (EACCES
needs a process without CAP_DAC_OVERRIDE: tests/system/test_hostile_subtrees.py and
test_memory_faults.py run noded's code so; here the kernel's ELOOP stands for any error.)"""

import errno
import os

import pytest

from noded.util import paths


def test_what_is_there_and_what_is_not(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert paths.exists(str(f)) and paths.lexists(str(f)) and not paths.isdir(str(f))
    assert paths.isdir(str(tmp_path)) and paths.exists(str(tmp_path))
    assert not paths.exists(str(tmp_path / "nowhere")) and not paths.lexists(str(tmp_path / "nowhere"))
    assert not paths.isdir(str(f / "below"))  # ENOTDIR: nothing there
    assert not paths.exists(str(tmp_path / "dangling")) and paths.lexists(str(tmp_path / "dangling"))


def test_an_error_is_raised_where_os_path_says_nothing_is_there(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    below = str(loop / "memory.high")  # a path through a symlink loop: ELOOP
    assert not os.path.exists(below) and not os.path.isdir(below) and not os.path.lexists(below)
    for check in (paths.exists, paths.isdir, paths.lexists):
        with pytest.raises(OSError) as e:
            check(below)
        assert e.value.errno == errno.ELOOP
