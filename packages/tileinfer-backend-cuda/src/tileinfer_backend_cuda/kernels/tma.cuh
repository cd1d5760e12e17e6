// Hopper's bulk tensor copies (TMA) and the mbarriers that await them (sm_90).
//
// A tensor map (cuTensorMapEncodeTiled, ops/tensor_map.py) describes a global tensor and the box
// one copy brings into shared memory; a copy's bytes complete a phase of an mbarrier on which
// one thread declared them (mbar_expect_bytes), and the threads that read the box wait for that
// phase (mbar_wait, parity 0, 1, 0, ... for the barrier's successive fills).
#pragma once

__device__ __forceinline__ void mbar_init(u32 bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(arrivals)
                 : "memory");
}
// The barriers' initialisation, made visible to the copies (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// This thread's arrival, with `bytes` more to come from copies before the phase completes.
__device__ __forceinline__ void mbar_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, int parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// The box of a 2-d tensor map at (inner coordinate c0, outer c1) into shared memory at dst,
// counted on barrier `bar`; the map lives in global memory (64-byte aligned).
__device__ __forceinline__ void tma_load_2d(u32 dst, const void* map, int c0, int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// A tensor map passed by value, a kernel's `const __grid_constant__` argument (CUtensorMap's 128
// bytes): the argument's own address is then one tma_load_2d may name.
struct alignas(64) TensorMapArg {
    unsigned long long words[16];
};
