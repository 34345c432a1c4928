"""A problem's candidate configs: its backend's search space, which to time and in what
order, and pruning by deviceless compile."""
