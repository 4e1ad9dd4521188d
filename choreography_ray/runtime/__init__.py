"""The actors that run jobs on Ray: manager, job, step hosts and recovery."""
