"""Which sequences run in the next step: sequences, the paged KV block manager and the scheduler (torch-free)."""
