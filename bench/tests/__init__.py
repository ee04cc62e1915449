"""bench's own tests, in the suite's tiers (a package of bench's: their modules and conftest are
bench.tests.*, so none shadows a module of tests/, whose root conftest the suite imports as
``conftest``)."""
