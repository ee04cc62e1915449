"""A reload of a config file that an editor or `cat > file` is rewriting in place: a file
that changed while it was read, or less than the settle time before, is not taken; the
reload is read again at the next round, and given up (the running config kept) after
RELOAD_PATIENCE_S. The wall clock (against the file's ctime) and the daemon's clock are
fakes here; the files and their stat are real."""

import logging
import os

import pytest

from noded.commands.run import _reload
from noded.config import Config, ConfigError, load_config, parse_config
from noded.loop.daemon import RELOAD_PATIENCE_S, Daemon
from noded.loop.parts import Parts
from noded.util.settled import SETTLE_S, Unsettled, unsettled_reason

COMPLETE = b"contention:\n  threshold: 0.8\n  release_threshold: 0.3\n  hold_s: 4\n"
# the same file cut short at a line's end: still valid YAML, its later keys at their defaults
TRUNCATED = COMPLETE[:COMPLETE.index(b"  release_threshold")]
SETTLED = SETTLE_S + 1e-3


class Reloading:
    """A daemon whose reloader is `noded run`'s, on a config file under tmp_path; the wall
    clock set relative to the file's last change, and the daemon's clock."""

    def __init__(self, tmp_path):
        self.path = tmp_path / "noded.yaml"
        # the directories start_check looks at, under tmp_path
        self.base = f"state_dir: {tmp_path}/state\nruntime_dir: {tmp_path}/run\nnvml: false\n".encode()
        self.path.write_bytes(self.base)
        self.wall, self.mono = 0.0, 100.0
        self.read = []  # the configs the reloader returned

        def reloader():
            config = _reload(str(self.path), lambda c: (c, "the test's"), now=lambda: self.wall)
            if config is not None:
                self.read.append(config)
            return config

        self.daemon = Daemon(load_config(str(self.path)), Parts(None, reloader=reloader), clock=lambda: self.mono)

    def after_change(self, s: float) -> None:
        """The wall clock ``s`` after the file's last change (a float of the epoch's seconds
        is exact to about 0.3 µs: SETTLED is the settle time and a little)."""
        self.wall = os.stat(self.path).st_ctime_ns / 1e9 + s

    def rewrite_in_place(self, data: bytes) -> None:
        """What `cat > file` and most editors' save do: the same inode, truncated, written."""
        ino = os.stat(self.path).st_ino
        with open(self.path, "r+b") as f:
            f.truncate(0)
            f.write(self.base + data)
        assert os.stat(self.path).st_ino == ino

    def sighup_after_saving(self, data: bytes, age_s: float) -> None:
        """The operator's habit: the file rewritten in place, ``age_s`` ago, then a SIGHUP
        and the loop's first try."""
        self.rewrite_in_place(data)
        self.after_change(age_s)
        self.daemon.request_reload()
        self.daemon.reload_if_due()

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)


@pytest.fixture
def reloading(tmp_path):
    return Reloading(tmp_path)


def test_a_file_rewritten_in_place_within_the_settle_time_is_not_applied_until_it_settles(reloading, caplog):
    h = reloading
    running = h.daemon.config
    h.sighup_after_saving(b"contention: {threshold: 0.9}\n", 0.3)
    assert h.daemon.config is running and h.read == []
    # rewritten again while the reload waits: the settle time counts from this change
    h.rewrite_in_place(b"contention: {threshold: 0.85}\n")
    h.after_change(SETTLE_S - 0.01)
    h.mono += 1
    h.daemon.reload_if_due()  # no new SIGHUP: the deferred reload is tried again
    assert h.daemon.config is running and h.read == []
    h.after_change(SETTLED)
    h.mono += 1
    h.daemon.reload_if_due()
    assert h.daemon.config.contention.threshold == 0.85 and len(h.read) == 1
    assert "config reloaded (once the file had been unchanged for 1 s: deferred 2 times, 2.0 s)" in caplog.text
    h.daemon.reload_if_due()  # over: not read again
    assert len(h.read) == 1


def test_a_truncated_but_valid_file_completed_within_the_settle_time_ends_with_the_complete_config(reloading):
    h = reloading
    cut = parse_config(h.base + TRUNCATED, str(h.path)).contention  # the cut file parses: later keys at defaults
    assert (cut.threshold, cut.release_threshold, cut.hold_s) == \
        (0.8, Config().contention.release_threshold, Config().contention.hold_s)
    running = h.daemon.config
    seen = []
    h.rewrite_in_place(TRUNCATED)  # the editor's first write
    h.daemon.request_reload()
    for at in (0.0, 0.5, 0.9):
        h.after_change(at)
        h.mono += 0.5
        h.daemon.reload_if_due()
        seen.append(h.daemon.config)
    h.append(COMPLETE[len(TRUNCATED):])  # its second write, 0.9 s later
    for at in (0.0, 0.5, SETTLED):
        h.after_change(at)
        h.mono += 0.5
        h.daemon.reload_if_due()
        seen.append(h.daemon.config)
    assert seen[:-1] == [running] * 5
    complete = seen[-1].contention
    assert (complete.threshold, complete.release_threshold, complete.hold_s) == (0.8, 0.3, 4.0)
    assert [c.contention.release_threshold for c in h.read] == [0.3]  # the cut file was never taken


def test_a_file_that_keeps_changing_is_given_up_after_the_patience_and_the_running_config_kept(reloading, caplog):
    h = reloading
    running = h.daemon.config
    caplog.set_level(logging.INFO, logger="noded.loop.daemon")
    h.daemon.request_reload()
    tries = 0
    while h.mono < 100 + RELOAD_PATIENCE_S:
        h.rewrite_in_place(b"contention: {threshold: 0.%d}\n" % (70 + tries % 25))
        h.after_change(0.1)
        h.daemon.reload_if_due()
        tries += 1
        h.mono += 1
        assert h.daemon.config is running
    h.daemon.reload_if_due()
    records = [r for r in caplog.records if r.name == "noded.loop.daemon"]
    assert [r.levelname for r in records] == ["INFO"] * tries + ["ERROR"]
    assert records[0].getMessage().startswith(f"config reload deferred (try 1): {h.path}: it changed 0.10 s ago")
    given_up = records[-1].getMessage()
    assert given_up.startswith(f"config reload given up after {tries + 1} tries over 30 s, keeping the running "
                               f"config: {h.path}: it changed "), given_up
    assert "rename it into place" in given_up
    h.after_change(SETTLED)
    h.mono += 1
    h.daemon.reload_if_due()  # given up: nothing is read until the next SIGHUP
    assert h.daemon.config is running and h.read == []
    h.daemon.request_reload()
    h.daemon.reload_if_due()
    assert h.daemon.config.contention.threshold != running.contention.threshold and len(h.read) == 1


def test_a_sighup_while_a_reload_is_deferred_starts_its_patience_again(reloading):
    h = reloading
    h.sighup_after_saving(b"contention: {threshold: 0.9}\n", 0.1)
    h.mono += RELOAD_PATIENCE_S - 1
    h.daemon.request_reload()
    h.daemon.reload_if_due()
    h.mono += 2  # past the first SIGHUP's patience, not the second's
    h.after_change(SETTLED)
    h.daemon.reload_if_due()
    assert h.daemon.config.contention.threshold == 0.9


def test_a_settled_file_that_fails_to_parse_keeps_the_running_config_whole_and_says_where(reloading, caplog):
    h = reloading
    running = h.daemon.config
    h.sighup_after_saving(b"contention:\n  threshold: 0.9\n  treshold: 0.8\n", 0.2)
    assert "refused" not in caplog.text  # deferred first: a writer may not be done
    h.after_change(SETTLED)
    h.daemon.reload_if_due()
    assert h.daemon.config is running and h.read == []
    line = h.base.count(b"\n") + 3
    assert f"config reload refused, keeping the running config: {h.path}:{line}: contention.treshold: unknown key" \
        in caplog.text, caplog.text


# ------------------------------------------------------------ the rule itself, on real files' stat


def test_a_file_changed_while_it_was_read_is_unsettled(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(TRUNCATED)
    before = os.stat(f)
    far = before.st_ctime_ns + 10 ** 10
    assert unsettled_reason(before, before, before, far, SETTLE_S) is None
    with open(f, "ab") as out:
        out.write(COMPLETE[len(TRUNCATED):])
    after = os.stat(f)
    assert unsettled_reason(before, after, after, far, SETTLE_S) == \
        f"it changed while it was read (size {len(TRUNCATED)} -> {len(COMPLETE)} bytes)"
    # rewritten in place to the same size: the times tell
    with open(f, "r+b") as out:
        out.write(b"C")
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with its mtime put back: its ctime moved
    again = os.stat(f)
    assert again.st_size == after.st_size and again.st_mtime_ns == before.st_mtime_ns
    assert unsettled_reason(after, again, again, far, SETTLE_S) == "it changed while it was read"


def test_a_file_replaced_or_removed_while_it_was_read_is_unsettled(tmp_path):
    f, new = tmp_path / "c.yaml", tmp_path / "c.yaml.new"
    f.write_bytes(COMPLETE)
    read = os.stat(f)
    far = read.st_ctime_ns + 10 ** 10
    new.write_bytes(COMPLETE)
    os.rename(new, f)  # an editor that writes elsewhere and renames: the old file was read whole, but is gone
    assert unsettled_reason(read, read, os.stat(f), far, SETTLE_S) == "another file took its name while it was read"
    assert unsettled_reason(read, read, None, far, SETTLE_S) == "it was removed or renamed while it was read"


def test_a_change_is_settled_only_once_the_settle_time_has_passed_since_it(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(COMPLETE)
    st = os.stat(f)
    at = st.st_ctime_ns
    assert unsettled_reason(st, st, st, at + 900_000_000, 1.0) == \
        "it changed 0.90 s ago, less than the 1 s it must stay unchanged (a writer may not be done)"
    assert unsettled_reason(st, st, st, at + 1_000_000_000, 1.0) is None
    assert unsettled_reason(st, st, st, at - 2_000_000_000, 1.0) == \
        "its last change is 2.00 s in the future (the clock went back?)"


def test_an_mtime_set_back_does_not_make_a_fresh_write_look_settled(tmp_path):
    """``touch -d`` (or an editor keeping the mtime) cannot make a change look old: the
    ctime is the kernel's."""
    f = tmp_path / "c.yaml"
    f.write_bytes(TRUNCATED)
    os.utime(f, (1, 1))
    st = os.stat(f)
    with pytest.raises(Unsettled, match="it changed 0.20 s ago"):
        load_config(str(f), settle_s=SETTLE_S, now=lambda: st.st_ctime_ns / 1e9 + 0.2)


def test_an_unsettled_file_is_not_parsed_and_a_settled_bad_one_is_refused_as_ever(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"contention: [\n")  # half written: not even YAML
    ctime = os.stat(f).st_ctime_ns / 1e9
    with pytest.raises(Unsettled) as e:
        load_config(str(f), settle_s=SETTLE_S, now=lambda: ctime + 0.5)
    assert e.value.path == str(f) and str(e.value).startswith(f"{f}: it changed 0.50 s ago")
    with pytest.raises(ConfigError):
        load_config(str(f), settle_s=SETTLE_S, now=lambda: ctime + SETTLED)
