"""The polynomial fits of kernels/cpu/float_lanes.h, made again: exp on |r| <= ln2 / 2, the
normal distribution's lower tail Phi(-a) exp(a^2 / 2) in t = 4 / (4 + a), and tanh below 0.625.

Each fit is weighted least squares on Chebyshev nodes against mpmath (40 digits), reweighted
by Lawson's rule (weights times the error, normalized) until it is close to minimax; the tail's
fit is also evaluated in float32 Horner steps with t rounded to float32, as the kernels evaluate
it. Prints each fit's coefficients (constant term first) and its maximum error.

    /usr/bin/python3 tools/float_lanes_fit.py     (numpy and mpmath)
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40


def fit(f, lo, hi, degree, points=3000, rounds=60):
    """Coefficients c[0..degree] of sum c[j] x^j near the minimax fit of f on [lo, hi], and its
    largest absolute error on the nodes."""
    k = np.arange(points)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / points)
    ys = np.array([float(f(mp.mpf(float(x)))) for x in xs])
    a = np.stack([xs**j for j in range(degree + 1)], 1)
    w = np.ones(points)
    for _ in range(rounds):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], ys * sw, rcond=None)
        err = np.abs(a @ c - ys)
        w = w * err
        w /= w.sum()
    return c, err.max()


def show(name, c, note):
    print(f"{name}: {note}")
    print("  " + ", ".join(f"{float(np.float32(x)):.9g}" for x in c))


def main():
    # exp(r) = 1 + r + r^2 P(r): P fitted to (exp(r) - 1 - r) / r^2; the error of P times r^2
    # relative to exp(r) at the interval's ends bounds exp's.
    half_ln2 = float(mp.log(2) / 2)
    c, err = fit(lambda r: (mp.exp(r) - 1 - r) / r**2 if r != 0 else mp.mpf(0.5),
                 -half_ln2, half_ln2, 4)
    show("exp_lanes P", c, f"relative error of exp <= {err * half_ln2**2 / np.exp(-half_ln2):.2e}")

    # Phi(-a) exp(a^2 / 2) = t Q(t), t = 4 / (4 + a): Q fitted on t in (0, 1].
    k = 4.0

    def q_of_t(t):
        a = k * (1 - t) / t
        return mp.erfc(a / mp.sqrt(2)) * mp.exp(a * a / 2) / 2 / t

    c, err = fit(q_of_t, 1e-6, 1.0, 9)
    q_min = min(float(q_of_t(mp.mpf(t))) for t in np.linspace(1e-6, 1, 50))
    c32 = c.astype(np.float32)
    a = np.concatenate([np.linspace(0, 20, 20001), [30, 100, 1e3, 1e5]]).astype(np.float32)
    t = (np.float32(k) / (np.float32(k) + a)).astype(np.float32)
    q = np.float32(c32[-1])
    for coefficient in c32[::-1][1:]:
        q = (q * t + coefficient).astype(np.float32)
    h = (t * q).astype(np.float32)
    exact = np.array([float(mp.erfc(mp.mpf(float(x)) / mp.sqrt(2)) *
                            mp.exp(mp.mpf(float(x))**2 / 2) / 2) for x in a])
    show("normal_tail Q", c, f"fit relative error {err / q_min:.2e}, "
         f"in float32 {np.max(np.abs(h / exact - 1)):.2e}")

    # tanh(a) = a + a^3 R(a^2) for a < 0.625: R fitted on s = a^2.
    b = 0.625
    c, err = fit(lambda s: (mp.tanh(mp.sqrt(s)) - mp.sqrt(s)) / mp.sqrt(s)**3 if s > 0
                 else mp.mpf(-1) / 3, 0.0, b * b, 4)
    show("tanh_lanes R", c, f"relative error of tanh <= {err * b * b / (float(mp.tanh(b)) / b):.2e}")


if __name__ == "__main__":
    main()
