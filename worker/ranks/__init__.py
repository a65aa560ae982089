"""What every rank runs: the process group (distributed), the lockstep commands and generation
(lockstep), and who makes what in a round (sharing). Uses the model; knows nothing of the queue."""
