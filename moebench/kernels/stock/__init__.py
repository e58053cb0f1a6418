"""The stock fused-MoE path exactly as the serving engines run it (Triton kernels, the engines'
configs and their tables) and SGLang's own kernels as its referee."""
