"""moebench: is this MoE kernel faster than that one, on this GPU, and by how much?"""

__version__ = "0.1.0"
