/* cuda-alloc.cu - the CUDA backend's caching device allocator: cuda_mem_alloc / cuda_mem_free (cuda-impl.h), also the
 * backend's buffer alloc/free hooks, and cuda_mem_stats (cuda-alloc.h).
 *
 * One pool per device, each behind its own mutex. A request is rounded up (to 512 B below 1 MiB, to 2 MiB from
 * 1 MiB on) and served from the pool's free blocks by best fit: the smallest cached block at least that large,
 * taken whole (blocks are never split or merged), and only if it is at most twice the rounded request, so a small
 * request does not pin a large block. Otherwise cudaMalloc; if that runs out of memory, every cached free block of
 * the device is cudaFree'd and cudaMalloc is tried once more before the request fails with ENG_STATUS_OUT_OF_MEMORY.
 * Once warm, serving a request makes no CUDA call.
 *
 * Invariants: every block is one whole cudaMalloc allocation (so 256-byte aligned); a block is either in the pool's
 * `used` map (handed out) or in its `free_blocks` list (cached), never both; in_use and cached are the sums of the
 * rounded sizes of those two sets; peak is the largest in_use seen.
 *
 * Assumption (documented contract): cuda_mem_free returns a block to the cache at once, with no stream ordering.
 * That is correct because callers free a block only when no queued work still uses it: the plan frees buffers after
 * it synchronised its context, kernels free their state in free_state after the plan's last sync, and
 * cuda_ctx_workspace synchronises its stream before freeing the old workspace. A caller that frees a block still in
 * use by queued work would let another stream reuse it while the kernel runs.
 *
 * Pools are created on first use and never destroyed (no static destructors run at process exit while another
 * thread may still free a block); their blocks go back to the driver with the process.
 */
#include "cuda-impl.h"
#include "cuda-alloc.h"

#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <stdint.h>
#include <stdio.h>
#include <unordered_map>

#define CUDA_POOL_MAX_DEVICES 64
#define CUDA_POOL_SMALL (1u << 20)     /* requests below this round to CUDA_POOL_SMALL_ROUND */
#define CUDA_POOL_SMALL_ROUND 512u
#define CUDA_POOL_LARGE_ROUND (2u << 20)

namespace {

struct cuda_pool {
    std::mutex mu;
    std::multimap<size_t, void *> free_blocks; /* cached: size -> block */
    std::unordered_map<void *, size_t> used;   /* handed out: block -> size */
    size_t in_use = 0, cached = 0, peak = 0;
};

std::atomic<cuda_pool *> pools[CUDA_POOL_MAX_DEVICES];
std::mutex pools_mu;

/* The pool of `dev`, created on first use; NULL if dev is out of range or memory is short. */
cuda_pool *pool_get(int dev, bool create) {
    if (dev < 0 || dev >= CUDA_POOL_MAX_DEVICES) return NULL;
    cuda_pool *p = pools[dev].load(std::memory_order_acquire);
    if (p || !create) return p;
    std::lock_guard<std::mutex> g(pools_mu);
    p = pools[dev].load(std::memory_order_relaxed);
    if (!p) {
        p = new (std::nothrow) cuda_pool;
        pools[dev].store(p, std::memory_order_release);
    }
    return p;
}

/* Makes `dev` current on this thread for the scope, restoring the previous device after. */
struct device_scope {
    int prev = -1;
    cudaError_t err = cudaSuccess;
    explicit device_scope(int dev) {
        if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
        if (prev != dev) err = cudaSetDevice(dev);
        if (err != cudaSuccess) (void)cudaGetLastError();
    }
    ~device_scope() {
        int cur = -1;
        if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) (void)cudaSetDevice(prev);
    }
};

/* n rounded up to the pool's granularity; 0 when that would overflow. */
size_t round_size(size_t n) {
    if (n == 0) n = 1;
    size_t r = n < CUDA_POOL_SMALL ? CUDA_POOL_SMALL_ROUND : CUDA_POOL_LARGE_ROUND;
    if (n > SIZE_MAX - r) return 0;
    return (n + r - 1) / r * r;
}

void fmt_bytes(char *buf, size_t cap, size_t b) {
    if (b >= (size_t)1 << 30) snprintf(buf, cap, "%.2f GiB", (double)b / (double)(1u << 30));
    else if (b >= (size_t)1 << 20) snprintf(buf, cap, "%.1f MiB", (double)b / (double)(1u << 20));
    else snprintf(buf, cap, "%zu bytes", b);
}

/* cudaFree every cached block of p. Caller holds p->mu and has made the pool's device current. */
void release_cached_locked(cuda_pool *p) {
    for (auto &kv : p->free_blocks)
        if (cudaFree(kv.second) != cudaSuccess) (void)cudaGetLastError();
    p->free_blocks.clear();
    p->cached = 0;
}

} // namespace

extern "C" eng_status cuda_mem_alloc(int device, size_t nbytes, void **out) {
    *out = NULL;
    if (device < 0 || device >= CUDA_POOL_MAX_DEVICES)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda:%d: no such device for the allocator (0..%d)", device,
                       CUDA_POOL_MAX_DEVICES - 1);
    size_t size = round_size(nbytes);
    if (size == 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: cannot allocate %zu bytes (size overflows)", device, nbytes);
    cuda_pool *p = pool_get(device, true);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory creating the allocator's pool", device);

    std::lock_guard<std::mutex> g(p->mu);
    auto it = p->free_blocks.lower_bound(size);
    if (it != p->free_blocks.end() && it->first / 2 <= size) {
        void *blk = it->second;
        size_t bsize = it->first;
        try {
            p->used.emplace(blk, bsize);
        } catch (...) {
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory in the allocator's bookkeeping", device);
        }
        p->free_blocks.erase(it);
        p->cached -= bsize;
        p->in_use += bsize;
        if (p->in_use > p->peak) p->peak = p->in_use;
        *out = blk;
        return ENG_STATUS_OK;
    }

    device_scope ds(device);
    if (ds.err != cudaSuccess)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda:%d: cannot select the device: %s (%s)", device,
                       cudaGetErrorString(ds.err), cudaGetErrorName(ds.err));
    void *blk = NULL;
    cudaError_t e = cudaMalloc(&blk, size);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it, or the next kernel's CUDA_LAUNCHED would report it */
        release_cached_locked(p);
        blk = NULL;
        e = cudaMalloc(&blk, size);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e != cudaErrorMemoryAllocation) {
            char w[64];
            snprintf(w, sizeof w, "cudaMalloc of %zu bytes", size);
            return cuda_error(device, w, e); /* a sticky error left by earlier work loses the device */
        }
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) (void)cudaGetLastError();
        char want[32];
        fmt_bytes(want, sizeof want, size);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of memory allocating %s (free %.2f GiB of %.1f GiB; "
                       "this process holds %.2f GiB in use)", device, want, (double)fr / (double)(1u << 30),
                       (double)tot / (double)(1u << 30), (double)p->in_use / (double)(1u << 30));
    }
    try {
        p->used.emplace(blk, size);
    } catch (...) {
        if (cudaFree(blk) != cudaSuccess) (void)cudaGetLastError();
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory in the allocator's bookkeeping", device);
    }
    p->in_use += size;
    if (p->in_use > p->peak) p->peak = p->in_use;
    *out = blk;
    return ENG_STATUS_OK;
}

/* Moves blk from used to the cache of p (the pool of device dev) if p handed it out; false if not. Takes p->mu. */
static bool pool_give_back(cuda_pool *p, int dev, void *blk) {
    std::lock_guard<std::mutex> g(p->mu);
    auto it = p->used.find(blk);
    if (it == p->used.end()) return false;
    size_t size = it->second;
    p->used.erase(it);
    p->in_use -= size;
    try {
        p->free_blocks.emplace(size, blk);
        p->cached += size;
    } catch (...) {
        /* no host memory to cache it: give it back to the driver instead */
        device_scope ds(dev);
        if (cudaFree(blk) != cudaSuccess) (void)cudaGetLastError();
    }
    return true;
}

extern "C" void cuda_mem_free(int device, void *ptr) {
    if (!ptr) return;
    cuda_pool *p = pool_get(device, false);
    if (p && pool_give_back(p, device, ptr)) return;
    /* freed with the wrong device index: find the pool that owns it */
    for (int d = 0; d < CUDA_POOL_MAX_DEVICES; d++) {
        cuda_pool *q = pool_get(d, false);
        if (q && q != p && pool_give_back(q, d, ptr)) return;
    }
    fprintf(stderr, "tensord: cuda:%d: cuda_mem_free(%p): not a block of the CUDA allocator (ignored)\n", device, ptr);
}

extern "C" void cuda_mem_stats(int dev, size_t *in_use, size_t *cached, size_t *peak) {
    size_t u = 0, c = 0, pk = 0;
    cuda_pool *p = pool_get(dev, false);
    if (p) {
        std::lock_guard<std::mutex> g(p->mu);
        u = p->in_use;
        c = p->cached;
        pk = p->peak;
    }
    if (in_use) *in_use = u;
    if (cached) *cached = c;
    if (peak) *peak = pk;
}

extern "C" void cuda_mem_release_cached(int dev) {
    cuda_pool *p = pool_get(dev, false);
    if (!p) return;
    std::lock_guard<std::mutex> g(p->mu);
    device_scope ds(dev);
    if (ds.err != cudaSuccess) return;
    release_cached_locked(p);
}
