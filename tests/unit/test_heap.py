"""noded's start freezes what it built, so each tick's collections walk only what it allocated."""

import gc

import pytest

from noded.util.heap import settle_heap


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the other tests of this worker see the collector as they found it


def test_what_was_built_before_is_never_walked_again_and_what_comes_after_is(unfrozen):
    built = [object()]  # a container: tracked by the collector
    assert any(o is built for o in gc.get_objects())
    frozen = settle_heap()
    # frozen objects can only leave the permanent generation by dying (another thread of this
    # worker, a test's leftover, may drop some between the two counts): never more of them
    assert frozen >= 1 and 0 < gc.get_freeze_count() <= frozen
    assert not any(o is built for o in gc.get_objects())  # in the permanent generation
    later = [object()]
    assert any(o is later for o in gc.get_objects())  # a tick's objects are collected as ever
