"""The control loop: the tick (sample, decide, apply, result), what operators set beside it
(control, overrides), what it counts over its life, and the metrics made from its results."""
