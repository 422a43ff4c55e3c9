"""Where a stage's ranks run: in the stage task's process, as a torchrun job or as Ray actors (launch, launch_ray),
what each rank reports (rank_events), the process group and sharding (distributed), and what this host can run
(host)."""
