"""The knobs a tick turns, as the controllers see them: what each controller reads
(``Reading``), what it may propose per knob (``Proposals``) and the one shape every
controller has (``Controller``). Below the controllers (they propose in these words and
know no other controller) and below the loop (its planners merge the proposals, one plan
per knob, and the actuators apply each plan: a knob's one writer)."""
