// strided_dgrad.cu's phase_filters and implicit_gemm_wgmma.cu's phase kernel run on the CPU (prelude.h): the
// filter pass on words written by drive.py, compared there with the NumPy twin; the phase kernel with forward_tile
// stood in by a recorder of each CTA's (phase, tile, filter offset), a CTA run as 4 threads.
#include "prelude.h"
#include <fstream>
#include <map>
#include <mutex>
#include "strided_dgrad.cu"
#include "nhwc.h"
typedef uint16_t Element;
#define THREADS 256
#define FORWARD_CTAS_PER_SM 2
#define __launch_bounds__(a, b)
std::mutex record_lock;
std::map<std::pair<int, int>, int> visits;  // (a phase, keyed out_first·1000 + R·10 + S; tile) -> CTAs
std::vector<long long> offsets_seen;
const Element* filters_base;
void forward_tile(const Element*, const Element* w, Element*, const NhwcShape& s, const int tile) {
    std::lock_guard<std::mutex> lock(record_lock);
    if (threadIdx.x != 0) return;
    visits[{s.out_first * 1000 + s.R * 10 + s.S, tile}] += 1;
    offsets_seen.push_back(w - filters_base);
}
#include "phases_kernel.h"

template <typename T>
std::vector<T> read(std::ifstream& f, size_t n) {
    std::vector<T> v(n);
    f.read((char*)v.data(), n * sizeof(T));
    return v;
}

int main(int argc, char** argv) {
    std::ifstream f(argv[1], std::ios::binary);
    auto ints = read<int32_t>(f, 9);  // K C R S u v groups word_bytes out_words
    auto strides = read<int64_t>(f, 4);
    PhaseOffsets offsets; f.read((char*)&offsets, sizeof offsets);
    int K = ints[0], C = ints[1], R = ints[2], S = ints[3], u = ints[4], v = ints[5], groups = ints[6];
    size_t w_words = (size_t)K * C * R * S;  // a C-contiguous or permuted buffer of that many words
    auto w = read<uint32_t>(f, w_words);
    std::vector<uint32_t> out(ints[8], 7u);
    run_grid({(unsigned)((C * R * S + 31) / 32), (unsigned)((K + 31) / 32), 1}, 256, [&] {
        phase_filters_4(w.data(), out.data(), K, C, R, S, u, v, groups, strides[0], strides[1], strides[2], strides[3],
                        offsets);
    });
    std::ofstream o(argv[2], std::ios::binary); o.write((char*)out.data(), out.size() * 4);
    // The phase kernel's choice of phase and tile, from a Phases argument.
    static_assert(sizeof(Phases) == 360, "Phases is 360 bytes");
    Phases phases; f.read((char*)&phases, sizeof phases);
    int grid_x = phases.first_tile[phases.count];
    std::vector<Element> filters(1);
    filters_base = filters.data();
    run_grid({(unsigned)grid_x, 1, 1}, 4,
             [&] { implicit_gemm_wgmma_phases(nullptr, filters.data(), nullptr, phases); });
    std::ofstream p(argv[3]);
    for (auto& [key, n] : visits) p << key.first << " " << key.second << " " << n << "\n";
    std::ofstream q(argv[4]);
    for (auto o : offsets_seen) q << o << "\n";
}
