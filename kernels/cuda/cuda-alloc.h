/* cuda-alloc.h - what the CUDA caching allocator (cuda-alloc.cu) exports beyond cuda-impl.h's cuda_mem_alloc /
 * cuda_mem_free: its counters, and a way to hand its cached blocks back to the driver. Thread-safe. */
#ifndef KRN_CUDA_ALLOC_H
#define KRN_CUDA_ALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Bytes of device `dev` handed out and not yet freed (in_use), held free in the cache (cached), and the most ever
 * in use at once (peak); sizes as rounded by the allocator. All 0 for a device it has not seen. Any pointer may be
 * NULL. */
void cuda_mem_stats(int dev, size_t *in_use, size_t *cached, size_t *peak);
/* cudaFree every cached free block of device `dev` (blocks in use stay). Costs a device synchronisation. */
void cuda_mem_release_cached(int dev);
#ifdef __cplusplus
}
#endif

#endif
