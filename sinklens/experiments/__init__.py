"""Experiments built on the library: the demo, the paper's replication on the shipped twins,
the controlled study, the twins' scoring and their presets. Nothing below imports this package."""
