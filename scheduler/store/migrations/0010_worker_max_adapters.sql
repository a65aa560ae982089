-- How many LoRA adapters a worker takes (its registration's limits.max_adapters; NULL: it said no
-- limits, and may be given anything): a claim never gives a task with adapters to a worker that
-- takes none, which would fail it (a fleet of fp8 workers without adapters beside bf16 ones with).
ALTER TABLE workers ADD COLUMN max_adapters INTEGER;
