"""``python -m bench.window_odds``: windows per comparison that issue #23's goals need under
the curve generator's window noise. The arithmetic is nodesim.window_odds."""

import sys

from nodesim.window_odds import main

if __name__ == "__main__":
    sys.exit(main())
