"""The commands beside a run: doctor and calibrate, probe (one kernel timed as a run times an
arm), profile, build (NVRTC compiles of CUDA sources), verify (parity and determinism checks)."""
