"""The arms: the arm API (api), the stock path (stock), our CUDA arms (cuda), and above them the
registry of built-in and external arms, `--build` specs and the build arms, and the oracle checks
of arms on fresh inputs (verify)."""
