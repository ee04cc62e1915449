"""Clocks a test holds: a wall clock that stands still until the test moves it."""


class WallClock:
    """The wall clock at a fixed moment (2023-11-14); ``t`` is what the test moves."""

    def __init__(self):
        self.t = 1_700_000_000.0

    def __call__(self):
        return self.t
