"""What the worker and the scheduler share for operators, and nothing else: the log format, and
every thread's stack for a process about to exit because it stopped moving. It imports nothing of
ours, so both can use it and still meet only in `protocol`."""
