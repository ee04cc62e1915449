"""The local admin interface: a Unix socket (JSON lines) and `nodectl`."""
