"""What the tests share that is not a fixture: the one home of the tests' helpers (the
fixtures are in tests/conftest.py, and those bench's tests share too in support/plugin.py).
Every tier imports from here (``from support.waiting import wait_for``); tests/ is on the
path as the folder of the root conftest (bench/tests/conftest.py puts it there for bench's)."""
