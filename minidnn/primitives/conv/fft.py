"""The ``fft`` algorithm: convolution as a product of spectra, one complex GEMM per frequency bin.

Zero-pad every image plane and every (dilated) filter onto one F1 × F2 grid and Fourier-transform them: the
convolution becomes, at each frequency f, a product summed over channels, i.e. a complex matrix product,
followed by an inverse transform and a crop. The cost no longer grows with the filter size (Vasilache et al.).

    forward          Y[n,k,f]  = Σ_c X[n,c,f] · conj(W[k,c,f])    cross-correlation    y  = Y[:P, :Q]
    backward-data    dX[n,c,f] = Σ_k dY[n,k,f] · W[k,c,f]         convolution          dx = dX[p:p+H, p:p+W]
    backward-filter  dW[k,c,f] = Σ_n conj(dY[n,k,f]) · X[n,c,f]   cross-correlation    dw = dW[0:d·(R−1)+1:d, ...]

x lies at (pad_h, pad_w) on its grid, dy and the filter at (0, 0), the filter's taps d apart for dilation d.
The transforms are circular, so the grid must be large enough that no result wraps onto another: H + pad
rows suffice (what runs past the bottom wraps onto the zeros above x, so one band of zeros serves as both
paddings), and at least P, to hold every output; each side is then rounded up to a size whose prime factors
are 2, 3, 5 and 7, which FFTs do fast.

* Data (x, dy, and the results y, dx) goes through 2-D real FFTs (cuFFT on the GPU, NumPy on the CPU), then, as
  in fbfft, a copy to frequency-major layout (bins, G, N, C/G) so that each bin's matrices are contiguous; the
  conjugation is folded into that copy.
* A filter has only R·S non-zero taps, so its spectrum is a direct DFT of the taps, two small GEMMs per call,
  W = E_h · w · E_wᵀ with E[f, t] = exp(−2πi·f·t·d/F), written straight into frequency-major layout; the
  weight gradient is likewise the inverse DFT evaluated at the R×S taps only. Padding the K·C/G filters to the
  grid and FFT-ing them would cost K·C/G full planes, the largest array of all at small batches.
* Each product is one ``blas.gemm_batched`` call over (bin, group). The inverse FFT is unnormalised; its
  1/(F1·F2) is folded into the filter's DFT matrix (forward, backward-data) or into dw's (backward-filter).

Workspace, every direction alike, each array 256-byte aligned: for the data input and the data output
(N·C and N·K planes) the real planes, their spectra and the frequency-major copy, F1·F2 reals and
2·F1·(F2/2 + 1) complex values per plane; for the filter side K·C/G · (R·S + R·(F2/2 + 1) + F1·(F2/2 + 1))
complex values (the taps, the DFT along one axis, the frequency-major spectrum). cuFFT's own small work areas
live with its cached plans, as cuBLAS keeps its workspace.

Numerics: float32 runs in complex64, float64 in complex128; the transforms' error grows like log(F1·F2), not
with R·S, so FFT is about as exact as direct im2col + GEMM (measured: docs/convolution.md, FFT, Measured).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import numpy as np

from ... import backend
from .. import blas
from .gemm import repeated
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, store_filter_gradient, workspace_array

ALIGNMENT = 256  # bytes: cuFFT and cuBLAS read aligned arrays fastest, complex128 needs at least 16
PLAN_CACHE_SIZE = 16  # cuFFT plans kept (each holds a work area), as CuPy's own plan cache


def smooth_size(n: int) -> int:
    """The smallest integer >= n whose only prime factors are 2, 3, 5 and 7."""
    while True:
        rest = n
        for prime in (2, 3, 5, 7):
            while rest % prime == 0:
                rest //= prime
        if rest == 1:
            return n
        n += 1


@dataclasses.dataclass(frozen=True)
class Grid:
    """The FFT grid, height × width; a real FFT keeps height × half frequency bins (half = width/2 + 1)."""

    height: int
    width: int

    @property
    def size(self) -> int:
        return self.height * self.width

    @property
    def half(self) -> int:
        return self.width // 2 + 1

    @property
    def bins(self) -> int:
        return self.height * self.half


def grid(problem: ConvProblem) -> Grid:
    """The smallest grid on which no result wraps onto another, each side rounded up to a 7-smooth size:
    max(H + pad, P) rows (and likewise columns). x sits at offset pad, so whatever runs past the bottom wraps
    onto the zeros above x; the outputs need P distinct rows. The filter needs no room of its own: its DFT is
    taken tap by tap, and taps beyond the grid wrap harmlessly onto the same zeros."""
    (ph, pw) = problem.padding
    return Grid(smooth_size(max(problem.H + ph, problem.P)), smooth_size(max(problem.W + pw, problem.Q)))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class _Carver:
    """Consecutive aligned arrays laid over one workspace buffer."""

    def __init__(self, workspace: Any) -> None:
        self.workspace, self.offset = workspace, 0

    def take(self, shape: tuple[int, ...], dtype: Any) -> Any:
        array = workspace_array(self.workspace, shape, dtype, self.offset)
        self.offset += _aligned(array.nbytes)
        return array


# ----------------------------------------------------------------------------------------------
# Real FFTs into given arrays: NumPy on the CPU, cuFFT plans on the GPU
# ----------------------------------------------------------------------------------------------
def real_fft(planes: Any, spectra: Any) -> None:
    """spectra (count, F1, F2/2 + 1) = rfft2(planes (count, F1, F2)), unnormalised."""
    if backend.get_array_module(planes) is np:
        np.fft.rfft2(planes, out=spectra)
    else:
        from cupy.cuda import cufft  # noqa: PLC0415 - GPU only

        _plan(planes, "R2C", planes.shape[-2:]).fft(planes, spectra, cufft.CUFFT_FORWARD)


def inverse_real_fft(spectra: Any, planes: Any) -> None:
    """planes (count, F1, F2) = F1·F2 · irfft2(spectra): the unnormalised inverse. Overwrites ``spectra``."""
    if backend.get_array_module(spectra) is np:
        # Two 1-D passes, the first in place, as cuFFT's C2R works: np.fft.irfft2 ignores ``out`` (NumPy 2.4).
        np.fft.ifft(spectra, axis=-2, norm="forward", out=spectra)
        np.fft.irfft(spectra, n=planes.shape[-1], axis=-1, norm="forward", out=planes)
    else:
        from cupy.cuda import cufft  # noqa: PLC0415 - GPU only

        _plan(spectra, "C2R", planes.shape[-2:]).fft(spectra, planes, cufft.CUFFT_INVERSE)


_plans: collections.OrderedDict = collections.OrderedDict()


def _plan(array: Any, kind: str, grid_shape: tuple[int, int]) -> Any:
    """A cuFFT plan for 2-D transforms of ``array``'s last two axes (``kind`` "R2C" or "C2R"); the cache drops
    the least recently used."""
    cupy = backend.cupy()
    key = (array.shape, array.dtype.str, kind, tuple(grid_shape), cupy.cuda.Device().id)
    plan = _plans.pop(key, None)
    if plan is None:
        from cupyx.scipy.fftpack import get_fft_plan  # noqa: PLC0415 - GPU only

        plan = get_fft_plan(array, shape=tuple(grid_shape), axes=(-2, -1), value_type=kind)
    _plans[key] = plan
    if len(_plans) > PLAN_CACHE_SIZE:
        _plans.popitem(last=False)
    return plan


# ----------------------------------------------------------------------------------------------
# DFTs of the R×S filter taps, as small matrices
# ----------------------------------------------------------------------------------------------
def tap_dft(size: int, frequencies: int, taps: int, dilation: int) -> np.ndarray:
    """E[f, t] = exp(−2πi·f·t·dilation/size) for f < frequencies, t < taps (complex128): tap t's DFT row."""
    phase = (np.arange(frequencies)[:, None] * np.arange(taps)[None, :] * dilation) % size  # exact integers
    return np.exp(-2j * np.pi * phase / size)


@functools.lru_cache(maxsize=256)
def filter_dft(shape: Grid, taps: tuple[int, int], dilation: tuple[int, int], conjugate: bool, dtype: np.dtype,
               device: backend.Device) -> tuple[Any, Any]:
    """(E_h / (F1·F2), E_w): W = E_h · w · E_wᵀ is w's spectrum on the grid, scaled by the inverse FFT's
    1/(F1·F2); conjugated for cross-correlation. Shapes (F1, R) and (F2/2 + 1, S), on ``device``."""
    rows = tap_dft(shape.height, shape.height, taps[0], dilation[0]) / shape.size
    cols = tap_dft(shape.width, shape.half, taps[1], dilation[1])
    if conjugate:
        rows, cols = rows.conj(), cols.conj()
    return tuple(backend.to_device(m.astype(dtype), device) for m in (rows, cols))


@functools.lru_cache(maxsize=256)
def inverse_filter_dft(shape: Grid, taps: tuple[int, int], dilation: tuple[int, int], dtype: np.dtype,
                       device: backend.Device) -> tuple[Any, Any]:
    """(D_h, D_w): the real inverse 2-D DFT of a half spectrum Z evaluated at the taps is Re(D_w · (D_h · Z)):
    D_h[r, f] = exp(+2πi·f·r·d/F1) / (F1·F2); D_w[s, f] = exp(+2πi·f·s·d/F2) · (1 for f = 0 and the Nyquist
    bin, 2 for the others, whose mirror images the half spectrum leaves out). Shapes (R, F1) and (S, F2/2 + 1)."""
    rows = tap_dft(shape.height, shape.height, taps[0], dilation[0]).conj().T / shape.size
    weights = np.full(shape.half, 2.0)
    weights[0] = 1.0
    if shape.width % 2 == 0:
        weights[-1] = 1.0
    cols = tap_dft(shape.width, shape.half, taps[1], dilation[1]).conj().T * weights
    return tuple(backend.to_device(m.astype(dtype), device) for m in (rows, cols))


# ----------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------
class FFT(ConvAlgorithm):
    name = "fft"

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return problem.stride == (1, 1)

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        shape, real, complex_ = grid(problem), problem.itemsize, 2 * problem.itemsize
        filters, R, S = problem.K * (problem.C // problem.groups), problem.R, problem.S
        total = 0
        for planes in (problem.N * problem.C, problem.N * problem.K):  # the data input and output
            total += _aligned(planes * shape.size * real) + 2 * _aligned(planes * shape.bins * complex_)
        for values in (R * S, R * shape.half, shape.bins):  # the filter's taps, half-transform, spectrum
            total += _aligned(filters * values * complex_)
        return total

    # ---- data: real planes <-> frequency-major spectra ----------------------------------------
    @staticmethod
    def _data_spectra(source: Any, rows: slice, cols: slice, shape: Grid, groups: int, order: tuple[int, ...],
                      carve: _Carver, conjugate: bool = False) -> Any:
        """source (N, channels, h, w) placed at (rows, cols) on zero planes, rfft2, then copied to the layout
        ``order`` of (N, G, channels/G, bins), e.g. (3, 1, 0, 2) for (bins, G, N, channels/G); conjugated if asked."""
        xp = backend.get_array_module(source)
        N, channels = source.shape[:2]
        planes = carve.take((N, channels, shape.height, shape.width), source.dtype)
        planes.fill(0)
        planes[:, :, rows, cols] = source
        spectra = carve.take((N * channels, shape.height, shape.half), np.result_type(source.dtype, np.complex64))
        real_fft(planes.reshape(N * channels, shape.height, shape.width), spectra)
        view = spectra.reshape(N, groups, channels // groups, shape.bins).transpose(order)
        copy = carve.take(view.shape, spectra.dtype)
        if conjugate:
            xp.conjugate(view, out=copy)
        else:
            copy[...] = view
        return copy

    @staticmethod
    def _data_result(product: Any, shape: Grid, rows: slice, cols: slice, carve: _Carver, out: Any) -> None:
        """product (bins, G, N, channels/G) -> spatial-major spectra, inverse rfft2, out = the planes' [rows, cols]."""
        view = product.transpose(2, 1, 3, 0)  # N, G, channels/G, bins
        spectra = carve.take(view.shape, product.dtype)
        spectra[...] = view
        N, channels = out.shape[:2]
        planes = carve.take((N, channels, shape.height, shape.width), out.dtype)
        inverse_real_fft(spectra.reshape(N * channels, shape.height, shape.half),
                         planes.reshape(N * channels, shape.height, shape.width))
        out[...] = planes[:, :, rows, cols]

    # ---- filters: taps <-> frequency-major spectra, by DFT matrices ----------------------------
    @staticmethod
    def _filter_spectra(w: Any, problem: ConvProblem, shape: Grid, carve: _Carver, correlate: bool) -> Any:
        """W / (F1·F2) as (bins, G, C/G, K/G) with W conjugated when ``correlate`` (forward), else as
        (bins, G, K/G, C/G) (backward-data): the layouts their products take without transposes."""
        G, R, S = problem.groups, problem.R, problem.S
        Kg, Cg = problem.K // G, problem.C // G
        complex_dtype = np.result_type(w.dtype, np.complex64)
        order = (3, 4, 0, 2, 1) if correlate else (3, 4, 0, 1, 2)  # (G, Kg, Cg, R, S) -> (R, S, G, ·, ·)
        taps = carve.take((R, S, G, Kg, Cg), complex_dtype)
        taps.reshape(R, S, G, *((Cg, Kg) if correlate else (Kg, Cg)))[...] = w.reshape(G, Kg, Cg, R, S).transpose(order)
        rows, cols = filter_dft(shape, (R, S), problem.dilation, correlate, complex_dtype, backend.device_of(w))
        filters = G * Kg * Cg
        half_transformed = carve.take((R, shape.half, filters), complex_dtype)
        blas.gemm_batched(repeated(cols, R), taps.reshape(R, S, filters), half_transformed)
        spectra = carve.take((shape.height, shape.half, filters), complex_dtype)
        blas.gemm(rows, half_transformed.reshape(R, -1), spectra.reshape(shape.height, -1))
        return spectra.reshape(shape.bins, G, *((Cg, Kg) if correlate else (Kg, Cg)))

    @staticmethod
    def _filter_taps(product: Any, problem: ConvProblem, shape: Grid, carve: _Carver, out: Any,
                     accumulate: bool) -> None:
        """product (bins, G, K/G, C/G), the weight gradient's spectrum -> its inverse DFT at the R×S taps, into out."""
        R, S = problem.R, problem.S
        filters = product[0].size
        rows, cols = inverse_filter_dft(shape, (R, S), problem.dilation, product.dtype, backend.device_of(product))
        half_transformed = carve.take((R, shape.half, filters), product.dtype)
        blas.gemm(rows, product.reshape(shape.height, -1), half_transformed.reshape(R, -1))
        taps = carve.take((R, S, filters), product.dtype)
        blas.gemm_batched(repeated(cols, R), half_transformed, taps)
        store_filter_gradient(taps.real.reshape(R, S, *out.shape[:2]).transpose(2, 3, 0, 1), out, accumulate)

    # ---- the three directions --------------------------------------------------------------------
    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        shape, carve, G = grid(problem), _Carver(workspace), problem.groups
        (ph, pw), batch = problem.padding, shape.bins * G
        x_freq = self._data_spectra(x, slice(ph, ph + problem.H), slice(pw, pw + problem.W), shape, G, (3, 1, 0, 2),
                                    carve)                                             # bins, G, N, C/G
        w_freq = self._filter_spectra(w, problem, shape, carve, correlate=True)       # bins, G, C/G, K/G
        y_freq = carve.take((shape.bins, G, problem.N, problem.K // G), x_freq.dtype)
        blas.gemm_batched(x_freq.reshape(batch, *x_freq.shape[2:]), w_freq.reshape(batch, *w_freq.shape[2:]),
                          y_freq.reshape(batch, *y_freq.shape[2:]))
        self._data_result(y_freq, shape, slice(0, problem.P), slice(0, problem.Q), carve, out)

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        shape, carve, G = grid(problem), _Carver(workspace), problem.groups
        (ph, pw), batch = problem.padding, shape.bins * G
        dy_freq = self._data_spectra(dy, slice(0, problem.P), slice(0, problem.Q), shape, G, (3, 1, 0, 2),
                                     carve)                                            # bins, G, N, K/G
        w_freq = self._filter_spectra(w, problem, shape, carve, correlate=False)      # bins, G, K/G, C/G
        dx_freq = carve.take((shape.bins, G, problem.N, problem.C // G), dy_freq.dtype)
        blas.gemm_batched(dy_freq.reshape(batch, *dy_freq.shape[2:]), w_freq.reshape(batch, *w_freq.shape[2:]),
                          dx_freq.reshape(batch, *dx_freq.shape[2:]))
        self._data_result(dx_freq, shape, slice(ph, ph + problem.H), slice(pw, pw + problem.W), carve, out)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        shape, carve, G = grid(problem), _Carver(workspace), problem.groups
        (ph, pw), batch = problem.padding, shape.bins * G
        x_freq = self._data_spectra(x, slice(ph, ph + problem.H), slice(pw, pw + problem.W), shape, G, (3, 1, 0, 2),
                                    carve)                                             # bins, G, N, C/G
        dy_freq = self._data_spectra(dy, slice(0, problem.P), slice(0, problem.Q), shape, G, (3, 1, 2, 0), carve,
                                     conjugate=True)                                   # bins, G, K/G, N
        dw_freq = carve.take((shape.bins, G, problem.K // G, problem.C // G), x_freq.dtype)
        blas.gemm_batched(dy_freq.reshape(batch, *dy_freq.shape[2:]), x_freq.reshape(batch, *x_freq.shape[2:]),
                          dw_freq.reshape(batch, *dw_freq.shape[2:]))
        self._filter_taps(dw_freq, problem, shape, carve, out, accumulate)


register(FFT())
