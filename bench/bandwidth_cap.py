"""``python -m bench.bandwidth_cap``: holding a job at a bandwidth cap on the emulator's kernel.
The simulation, which the tests share, is nodesim.bandwidth_cap; this is the benchmark's command."""

import sys

from nodesim.bandwidth_cap import main

if __name__ == "__main__":
    sys.exit(main())
