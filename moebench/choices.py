"""Names and defaults the command line offers before it loads any stage: importable without
torch, Triton or CUDA, so `moebench COMMAND --help` answers at once. Each stage that uses one
imports it from here (the one definition)."""

FLUSH_MODES = ("read", "write", "none")  # moebench.timing.flush: what each one leaves in L2
DETERMINISM_RUNS = 10  # `run --determinism`: a cheap check beside the timing (`verify --determinism` runs 20)
# The default protocol varies where every arm's buffers land (measured: docs/measurement.md, "Placement"):
# each arm prepared DEFAULT_PLACEMENTS times where memory allows, every row turning through the copies,
# each copy the same number of samples of a row (so a row is the same blend of placements every round).
DEFAULT_PLACEMENTS = 16
DEFAULT_SAMPLES = 32
# Rounds are cheap (a Q8 round of four arms times in well under a second) and the ratio's interval, and
# so the A/A floor, narrows as their square root: 20 resolve about half of what 5 did.
DEFAULT_ROUNDS = 20
DEFAULT_PLACEMENT_MODE = "samples"
ORDERS = ("shuffled", "alternating")
NO_AA = "none"  # `--aa none`: no A/A copy, no noise floor measured
REF_AA = "ref"  # `--aa ref` (the command line's default): the A/A copy is the reference arm's
REL_L2_THRESHOLD = 1e-2  # parity: FP8 requant boundaries flip a few codes; a correct kernel lands far below

PROBE_OPS = {
    # op: (kernel pattern for the audit and for ncu -k regex:..., tensors read, tensors written)
    "add": (r"Functor\w*_add", 2, 1),
    "mul": ("MulFunctor", 1, 1),
    "spin": ("spin_kernel", 0, 0),
    "empty": ("spin_kernel", 0, 0),
    "reduce": ("moebench_probe_reduce", 0, 0),  # bytes: the reductions' (REDUCE_PASSES x the buffer)
    "wgmma": ("moebench_probe_wgmma", 0, 0),  # FLOPs: the wgmma's (WGMMA_STEPS K steps a CTA)
    "wgmma-step": ("moebench_probe_wgmma_step", 0, 0),
    "gate-up-l2": ("moebench_prefill_gate_up", 0, 0),  # FLOPs: the blocks' GEMM (2 x 64 x 2I x K each)
}
COMPARE_FORMAT_NAMES = ("table", "markdown", "json")  # moebench.views.compare_view.COMPARE_FORMATS
# `moebench tune`: the engines' tuners' batch sizes (SGLang's get_default_batch_sizes, vLLM's the same
# up to 4096): the M keys of every table they ship, and the tune's Ms unless --ms names others.
ENGINE_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
TUNE_PASSES = 2  # rounds of moves from the shipped config (moebench.tasks.tune_space)
