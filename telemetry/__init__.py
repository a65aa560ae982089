"""What the worker and the scheduler share for operators, and nothing else: the log format. It
imports nothing of ours, so both can use it and still meet only in `protocol`."""
