"""Stage 2: the arms. Stock Triton path, CUDA sources (*.cu) and their runtime build."""
