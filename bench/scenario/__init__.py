"""End-to-end scenarios (``python -m bench.scenario``): ``calibrate`` measures the node
peak noded reads; ``contention`` runs a victim beside the stressor, without and with
noded, on this machine's real cpusets (``cpuset_node``) and on the simulated node
(``sim_node``); ``contention`` builds the matrix and table, ``plot`` the figure."""
