"""Production peers: MoE layers built on libraries the serving engines use beside Triton (cuBLAS
block-scaled FP8 GEMMs through torch), as arms beside ours. Optional: each says in one line why it
cannot run where it cannot."""
