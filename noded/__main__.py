import sys

from noded.commands.cli import main

sys.exit(main())
