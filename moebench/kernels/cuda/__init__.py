"""moebench's own Hopper (sm_90a) CUDA arms: their sources (*.cu, *.cuh), their host code
(weight layouts, launch policies, checks) and their runtime build (NVRTC, the compile cache,
launches)."""
