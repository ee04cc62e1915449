"""A daemon built again from its parts but some: what tests use instead of setting
attributes on a Daemon once built (imported from here, not from a conftest: each tier's
conftest.py is a module named ``conftest``, and which one an import finds depends on what
the worker collected first)."""

import dataclasses


def rebuilt(daemon, **parts):
    """``daemon`` built again from its parts but ``parts`` (a co-location, an overrides' store
    with the test's clock ...), as the wiring would have built it: nothing is set on a Daemon
    once built. The new daemon starts afresh (it has not ticked)."""
    from noded.loop.daemon import Daemon

    return Daemon(daemon.config, dataclasses.replace(daemon.parts, **parts), clock=daemon.clock,
                  extra_info=daemon.extra_info)
