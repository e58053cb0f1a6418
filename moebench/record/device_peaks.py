"""Dense FP8 tensor-core peaks and HBM bandwidths by GPU name, from the vendor's datasheets: the
compute floor of a shape is its FLOPs over this peak; the HBM bandwidth stands beside the read
floor a run measures (the floor itself is measured, never the datasheet's).

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


# ---------------------------------------------------------------------------- HBM bandwidth
#
# The boards' memory bandwidth as their datasheets give it, shown beside the measured read floor
# (moebench.timing.read_floor): the measured rate is what this card reads, the datasheet's what it is
# sold at; a floor far below the datasheet says the card or its clocks are not what they seem.
# Sources:
# - NVIDIA H100 Tensor Core GPU datasheet: GPU memory bandwidth, H100 SXM 3.35TB/s, H100 PCIe 2TB/s.
# - NVIDIA H200 Tensor Core GPU datasheet: GPU memory bandwidth, H200 SXM 4.8TB/s.
# - NVIDIA H800 Tensor Core GPU datasheet: GPU memory bandwidth, H800 SXM 3.35TB/s.
H800_DATASHEET = "NVIDIA H800 Tensor Core GPU datasheet"


@dataclass(frozen=True)
class HbmBandwidth:
    """One board's datasheet memory bandwidth and where the number comes from."""

    gpu_name: str
    bytes_per_s: float
    source: str


HBM_DATASHEET: dict[str, HbmBandwidth] = {b.gpu_name: b for b in (
    HbmBandwidth("NVIDIA H100 80GB HBM3", 3.35e12, f"{H100_DATASHEET}, H100 SXM: 3.35TB/s"),
    HbmBandwidth("NVIDIA H100 PCIe", 2.0e12, f"{H100_DATASHEET}, H100 PCIe: 2TB/s"),
    HbmBandwidth("NVIDIA H200", 4.8e12, f"{H200_DATASHEET}, H200 SXM: 4.8TB/s"),
    HbmBandwidth("NVIDIA H800", 3.35e12, f"{H800_DATASHEET}, H800 SXM: 3.35TB/s"),
)}


def hbm_datasheet(gpu_name: str | None) -> HbmBandwidth | None:
    """The datasheet bandwidth of the board named `gpu_name` (exactly, as CUDA names it), or None."""
    return HBM_DATASHEET.get(gpu_name.strip()) if gpu_name else None
