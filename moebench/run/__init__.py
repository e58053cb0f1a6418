"""The run pipeline: plan (the request split into workload, protocol and arm plan), prepare
(fixtures, arms, parity, placements), the determinism step, measure (timing stage), assemble,
partial results and resume, noise floors, variants, sweeps and their distribution over ranks,
and `bench`, the library entry point."""
