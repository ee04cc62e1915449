"""``python -m bench.rightsize``: right-sizing on one simulated node against an oracle. The
simulation, which the tests share, is nodesim.rightsize_node; this is the benchmark's command."""

import sys

from nodesim.rightsize_node import main

if __name__ == "__main__":
    sys.exit(main())
