"""Where things are, whichever tier folder a test sits in."""

import os

#: tests/
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the checkout's root (the Makefile, scenarios/, integrations/, ...)
REPO_ROOT = os.path.dirname(TESTS_DIR)
