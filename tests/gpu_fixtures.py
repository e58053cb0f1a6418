"""Fixtures on the GPU, built once a process for every GPU test module that asks."""

import functools

from moebench.fixtures import ShapeRegistry, build_fixture


@functools.lru_cache(maxsize=None)
def cuda_fixture(name: str):
    return build_fixture(ShapeRegistry().resolve(name)).to("cuda")
