"""The model on one rank: loading, the speed switches, context parallelism, generating batches of
jobs. Knows nothing of ranks' coordination, the queue or storage."""
