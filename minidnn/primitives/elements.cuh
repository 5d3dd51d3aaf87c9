// The element type of kernels that have a half-precision build: with HALF undefined, elem_t is scalar_t and
// both conversions are the identity; with HALF = 1 (float16) or 2 (bfloat16), and SCALAR float, elements are
// 16-bit words, read as their exact float values and written rounded to nearest even (half.cuh) from the
// float of what the kernel computed. Include after scalar_t is defined.
#ifdef HALF
#include "half.cuh"
typedef u16 elem_t;
__device__ __forceinline__ float element_value(const elem_t word) {
    return HALF == 2 ? bfloat16_value(word) : float16_value(word);
}
template <typename T>
__device__ __forceinline__ elem_t element_of(const T value) {
    const float rounded = (float)value;
    const u32 bits = __float_as_uint(rounded);
    return HALF == 2 ? bfloat16_word(bits) : float16_word(bits, rounded);
}
#else
typedef scalar_t elem_t;
__device__ __forceinline__ scalar_t element_value(const elem_t value) { return value; }
template <typename T>
__device__ __forceinline__ elem_t element_of(const T value) { return (elem_t)value; }
#endif

// V consecutive elements, read or written as one access: kernels that have a build moving VECTOR elements
// (16 bytes: 8 half words, 4 floats, 2 doubles) at a time launch it where their arrays are 16-byte aligned
// (_cuda.elements_per_access), and one of single elements (V = 1) elsewhere. Why: a thread that keeps one 2-
// or 4-byte load in flight leaves the memory system mostly idle (far fewer bytes in flight per SM than its
// latency times its bandwidth); a 16-byte access moves 4-8 times as much per load.
#define VECTOR (16 / (int)sizeof(elem_t))
template <int V>
struct __align__(V * sizeof(elem_t)) Pack {
    elem_t e[V];
};

template <int V>
__device__ __forceinline__ const Pack<V>* packs(const elem_t* a) {
    return reinterpret_cast<const Pack<V>*>(a);
}
template <int V>
__device__ __forceinline__ Pack<V>* packs(elem_t* a) {
    return reinterpret_cast<Pack<V>*>(a);
}

// A flat array of n elements in a grid-stride loop: body.template run<V>(i) for the packs i < n / V, then
// body.template run<1>(i) for the n % V elements left (i their element index). The body does the same
// arithmetic element by element whatever V, so both builds give the same results.
template <int V, typename Body>
__device__ __forceinline__ void by_packs(const int n, const Body& body) {
    const int G = blockDim.x * gridDim.x, first = blockIdx.x * blockDim.x + threadIdx.x, count = n / V;
    for (int i = first; i < count; i += G) body.template run<V>(i);
    for (int i = count * V + first; i < n; i += G) body.template run<1>(i);
}

// by_packs' bodies for an element-wise map of one array or two: y = op(a) or op(a, b), on the element words
// (op widens and rounds as it needs), pack by pack. y may be a or b (in place): each pack is read before the
// same thread writes it, hence no __restrict__.
template <typename Op>
struct Map {
    const elem_t* a;
    elem_t* y;
    Op op;
    template <int V>
    __device__ __forceinline__ void run(const int i) const {
        Pack<V> p = packs<V>(a)[i];
#pragma unroll
        for (int u = 0; u < V; ++u) p.e[u] = op(p.e[u]);
        packs<V>(y)[i] = p;
    }
};
template <typename Op>
struct Map2 {
    const elem_t *a, *b;
    elem_t* y;
    Op op;
    template <int V>
    __device__ __forceinline__ void run(const int i) const {
        const Pack<V> q = packs<V>(b)[i];
        Pack<V> p = packs<V>(a)[i];
#pragma unroll
        for (int u = 0; u < V; ++u) p.e[u] = op(p.e[u], q.e[u]);
        packs<V>(y)[i] = p;
    }
};
