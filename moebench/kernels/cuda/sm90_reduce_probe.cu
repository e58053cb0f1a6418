// sm90_reduce_probe.cu: `moebench probe --op reduce`, the ceiling of the combine's instruction.
//
// The fused arms end in 16-byte red.global.add.noftz.v4.bf16x2 into the output, one per eight
// columns of a token slot; at prefill M that traffic (slots x K x 2 bytes) is larger than every
// other the call moves. This kernel does nothing else: `passes` sweeps over a BF16 buffer of
// `chunks` 16-byte chunks, thread i taking chunks i, i + threads, ..., each sweep adding 1.0 to
// every element (the buffer is a target, its values are not read back by the probe). A buffer
// that fits in L2 gives the reductions' L2 rate, a larger one adds the HBM round trips.
//
// The host launches it two ways: 8 CTAs of 256 threads an SM on every SM (the default), or
// (`--sms N`) N CTAs of 1024 threads, each with more than half an SM's shared memory, so that
// no two share an SM: the rate of N SMs, which tells an SM's own limit from the GPU's.

extern "C" __global__ void __launch_bounds__(1024)
moebench_probe_reduce(unsigned short* __restrict__ out, long long chunks, int passes)
{
    const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const unsigned one = 0x3f803f80u;  // BF16 1.0, twice
    for (int p = 0; p < passes; ++p)
        for (long long i = first; i < chunks; i += threads)
            asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %1, %1, %1};"
                         :: "l"(out + 8 * i), "r"(one) : "memory");
}
