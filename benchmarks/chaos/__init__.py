"""`make chaos`: a whole stack as separate processes takes jobs while its parts are killed,
restarted and frozen, and every job and webhook is judged against a run without faults
(run.py)."""
