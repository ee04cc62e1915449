"""The commands: `noded` and its subcommands (run, check-config, calibrate), and the wiring
that builds a daemon from a config. Everything a process does before and around the loop."""
