"""Dense FP8 tensor-core peaks by GPU name, from the vendor's datasheets: the compute floor
of a shape is its FLOPs over this peak.

Keys are the names CUDA reports (`torch.cuda.get_device_name`, provenance.gpu.name), matched
exactly: an H200 NVL or an H100 NVL is another board with other clocks and another peak, so
a name not listed here has no compute floor (views show —), never a neighbour's number.

Sources. NVIDIA's datasheets give the FP8 Tensor Core figure with 2:4 structured sparsity
and say the dense figure is half of it ("* With sparsity"; "specifications 1/2 lower
without sparsity"):
- NVIDIA H100 Tensor Core GPU datasheet: H100 SXM FP8 Tensor Core 3,958 teraFLOPS*,
  H100 PCIe 3,026 teraFLOPS*.
- NVIDIA H200 Tensor Core GPU datasheet: H200 SXM FP8 Tensor Core 3,958 TFLOPS*.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    """One board's dense FP8 tensor-core peak and where the number comes from."""

    gpu_name: str
    fp8_dense_flops_per_s: float
    source: str

    @property
    def tflops(self) -> float:
        return self.fp8_dense_flops_per_s / 1e12


H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet"
H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet"

FP8_DENSE_PEAKS: dict[str, DevicePeak] = {p.gpu_name: p for p in (
    # H200 SXM: 3,958 TFLOPS with sparsity -> 1,979 dense
    DevicePeak("NVIDIA H200", 1979e12, f"{H200_DATASHEET}, H200 SXM: 3,958 TFLOPS with sparsity, half dense"),
    # H100 SXM5 80 GB as CUDA names it: 3,958 with sparsity -> 1,979 dense
    DevicePeak("NVIDIA H100 80GB HBM3", 1979e12, f"{H100_DATASHEET}, H100 SXM: 3,958 TFLOPS with sparsity, half dense"),
    # H100 PCIe: 3,026 with sparsity -> 1,513 dense
    DevicePeak("NVIDIA H100 PCIe", 1513e12, f"{H100_DATASHEET}, H100 PCIe: 3,026 TFLOPS with sparsity, half dense"),
)}


def fp8_dense_peak(gpu_name: str | None) -> DevicePeak | None:
    """The datasheet peak of the board named `gpu_name`, or None for a board not listed."""
    return FP8_DENSE_PEAKS.get(gpu_name.strip()) if gpu_name else None
