"""The one size memory soft limits come in: what right-sizing's memory split rounds to and
the only values the memory actuator writes (so a value it did not write can be told apart)."""

#: Limits are written in steps of this many bytes, so that process memory that moves a little
#: does not rewrite (and durably record) a limit every tick.
QUANTUM = 256 << 20
