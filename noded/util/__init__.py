"""Small utilities with no opinion about the loop: durations and ages, rate limits, the one
YAML loader, /proc/PID/stat, and logging for systemd."""
