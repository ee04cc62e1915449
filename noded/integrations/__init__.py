"""How noded fits the cluster engines its users schedule with (Slurm)."""
