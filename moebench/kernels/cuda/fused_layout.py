"""The fused kernel's weight layout: each expert's FP8 weights re-ordered once (untimed) so
that every CTA of sm90_fused_moe.cu streams one contiguous range, tile by tile in mma
fragment order (the kernel's header comment has the details). Same bytes, another order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moebench.errors import UserError

LAYOUT = "fused-v1"  # bump when prepare_fused_weights changes the order it writes
GROUP = 128  # FP8 block-scale granularity (weights 128x128, activations 1x128)
# CTAs per work item: clusters of 8 x 16 or 4 x 32 intermediate columns = one requant group,
# or one CTA with the whole group (no SwiGLU exchange between CTAs).
CLUSTERS = (8, 4, 1)
# Clusters of 4 by default: faster than clusters of 8 at the four reference fixtures on the
# H200 (results/h200/experiments/cuda-fused-clusters-*.json.gz).
DEFAULT_CLUSTER = 4
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class FusedWeights:
    """Expert weights in the kernel's layout (same bytes, another order) and their scales."""

    w1: torch.Tensor  # [E, N, K] uint8, re-laid gate/up codes
    w1_scale: torch.Tensor  # [E, N/128, K/128] fp32, unchanged
    w2: torch.Tensor  # [E, K, I] uint8, re-laid down codes
    w2_scale: torch.Tensor  # [E, K/128, I/128] fp32, unchanged
    cluster: int  # the cluster size the order is for (CTAs per work item)
    layout: str = LAYOUT

    @property
    def E(self) -> int:
        return self.w1.shape[0]

    @property
    def N(self) -> int:
        return self.w1.shape[1]

    @property
    def K(self) -> int:
        return self.w1.shape[2]

    @property
    def I(self) -> int:  # noqa: E743
        return self.N // 2

    @property
    def device(self) -> torch.device:
        return self.w1.device


def _codes(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in (FP8, torch.uint8):
        raise UserError(f"{name} must be float8_e4m3fn codes, got {t.dtype}")
    return t.contiguous().view(torch.uint8)


def prepare_fused_weights(w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor,
                          w2_scale: torch.Tensor, cluster: int = DEFAULT_CLUSTER) -> FusedWeights:
    """Re-lay gate/up [E,N,K] and down [E,K,I] FP8 weights for the fused kernel run with
    clusters of `cluster` CTAs (untimed). With C = 128/cluster columns a CTA:

    w1: row n = h1*I + 128g + C*c + 16u + 8q + r (h1 0 gate / 1 up, c the CTA of the cluster,
        u its 16-row tile), column k = 128kb + 32t + 8s + 4h + j; written as
        [E, g, c, kb, (h1 u), s, r, t, h, q, j]: per CTA 2*C*K contiguous bytes, per
        (kb, m-tile, s) one 512-byte mma A tile whose lane r*4+t holds rows (r, r+8) x bytes
        (8s + 4h + j) of its 32-byte k slice.
    w2: row = c*K/cluster + 16m + 8q + r, column i = 128g + 32t + 8s + 4h + j; written as
        [E, g, c, m, s, r, t, h, q, j]: per CTA 128*K/cluster contiguous bytes.
    """
    if cluster not in CLUSTERS:
        raise UserError(f"cluster={cluster} must be one of {', '.join(map(str, CLUSTERS))}")
    w1b, w2b = _codes(w1, "w1"), _codes(w2, "w2")
    if w1b.dim() != 3 or w2b.dim() != 3:
        raise UserError(f"w1 must be [E, N, K] and w2 [E, K, I], got {tuple(w1.shape)} and {tuple(w2.shape)}")
    E, N, K = w1b.shape
    I = N // 2  # noqa: E741
    if K % GROUP or K < GROUP:
        raise UserError(f"K={K} must be a positive multiple of {GROUP}")
    if N % (2 * GROUP) or N < 2 * GROUP:
        raise UserError(f"N={N} must be a positive multiple of {2 * GROUP}")
    if tuple(w2b.shape) != (E, K, I):
        raise UserError(f"w2 must be [E, K, I] = {(E, K, I)}, got {tuple(w2.shape)}")
    _check_scale(w1_scale, (E, N // GROUP, K // GROUP), "w1_scale")
    _check_scale(w2_scale, (E, K // GROUP, I // GROUP), "w2_scale")
    G, KB, U = I // GROUP, K // GROUP, GROUP // cluster // 16
    a = w1b.view(E, 2, G, cluster, U, 2, 8, KB, 4, 4, 2, 4)  # e h1 g c u q r kb t s h j
    a = a.permute(0, 2, 3, 7, 1, 4, 9, 6, 8, 10, 5, 11)  # e g c kb h1 u s r t h q j
    b = w2b.view(E, cluster, K // cluster // 16, 2, 8, G, 4, 4, 2, 4)  # e c m q r g t s h j
    b = b.permute(0, 5, 1, 2, 7, 4, 6, 8, 3, 9)  # e g c m s r t h q j
    return FusedWeights(a.contiguous().view(E, N, K), w1_scale.float().contiguous(),
                        b.contiguous().view(E, K, I), w2_scale.float().contiguous(), cluster)


def _check_scale(t: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    if t.dtype != torch.float32:
        raise UserError(f"{name} must be float32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise UserError(f"{name} must be {list(shape)}, got {list(t.shape)}")
