"""moebench: is this MoE kernel faster than that one, on this GPU, and by how much?"""

__version__ = "0.1.0"

# The library entry point. Imported here, after __version__, so that `moebench.bench` is the
# function (a plain `import moebench.bench` would otherwise leave the submodule in its place).
from moebench.bench import bench  # noqa: E402

__all__ = ["bench", "__version__"]
