"""Worker groups: Ray actors, one per device, that host the engines and run SPMD calls."""
