"""Stage 3: L2 flush, CUPTI tracer, clock sampling, paired-round scheduler."""
