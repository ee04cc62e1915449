"""``python -m bench.allocator_search``: the allocator's search over generated curves. The
simulation, which the tests share, is nodesim.allocator_search; this is the benchmark's command."""

import sys

from nodesim.allocator_search import main

if __name__ == "__main__":
    sys.exit(main())
