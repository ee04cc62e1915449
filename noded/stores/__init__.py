"""What noded must not forget across restarts, each in its own file in the state directory:
the originals it changed, baselines, the node's calibration, locks, and the directory itself."""
