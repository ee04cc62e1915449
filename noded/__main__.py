import sys

from noded.cli import main

sys.exit(main())
