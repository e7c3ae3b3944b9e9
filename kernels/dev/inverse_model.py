#!/usr/bin/env python3
"""inverse_model.py: numpy models of the chunk kernels' (I + A)^-1 for a strictly lower 64 x 64 A
(kernels/chunk/wy_math.cuh), used offline before a design runs on a GPU.

  inverse_model.py storage    recursive doubling (wy_diag_blocks_by_warp + wy_invert_tf32_levels) on
                              the kernel's own storage: diagonal blocks in place, X's off-diagonal
                              blocks transposed into a's upper triangle, each level reading what the
                              levels before it wrote; every Ai element handed over once, against
                              inv(I + A) in double (exact arithmetic, so only the index use is tested)
  inverse_model.py accuracy   block rows (wy_invert_tf32) against recursive doubling with the kernels'
                              rounding points: fp32 forward substitution for the diagonal blocks, tf32
                              operands (round to nearest, ties away) with fp32 sums for every product,
                              then Ai = X diag(beta) in bf16; chunks of unit keys with decays and betas
"""
import sys
import numpy as np


def unit_lower_a(rng, strong):
    """A = beta_r 2^(Gk_r - Gk_c) <k_r, k_c> below the diagonal, unit keys: a chunk's A."""
    k = rng.uniform(-1, 1, (64, 128))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    g = np.where(rng.uniform(size=64) < 0.25, 0.0, -rng.uniform(0, 0.5 if strong else 0.1, 64))
    gk = np.cumsum(g) / np.log(2)
    beta = rng.uniform(0, 2 if strong else 1, 64)
    a = np.tril(beta[:, None] * np.exp2(gk[:, None] - gk[None, :]) * (k @ k.T), -1)
    return a.astype(np.float32), beta


def storage(trials=20):
    rng = np.random.default_rng(1)
    for _ in range(trials):
        A = np.tril(rng.normal(0, 0.3, (64, 64)), -1)
        a = A.copy()
        X = np.full((64, 64), np.nan)  # what the emit callbacks receive
        for b in range(4):  # warp b: diagonal block b in place (forward substitution, a column a lane)
            s = slice(16 * b, 16 * b + 16)
            xb = np.linalg.inv(np.eye(16) + a[s, s])
            a[s, s] = xb
            X[s, s] = xb
        # level 32, warp w: X_10 (w = 0, 1) or X_32 (w = 2, 3), 8 columns each, read in place
        out = []
        for w in range(4):
            d0 = 32 * (w >> 1); r0 = d0 + 16; n0 = d0 + 8 * (w & 1)
            Y = a[r0:r0 + 16, d0:d0 + 16] @ a[d0:d0 + 16, n0:n0 + 8]
            out.append((r0, n0, -(a[r0:r0 + 16, r0:r0 + 16] @ Y)))
        for r0, n0, t in out:  # stored after the level (the barrier): transposed into the upper triangle
            a[n0:n0 + 8, r0:r0 + 16] = t.T
            X[r0:r0 + 16, n0:n0 + 8] = t

        def x_at(kk, n):  # wy_x_at: in place in the diagonal blocks, transposed left of them
            return a[kk, n] if (kk >> 4) == (n >> 4) else a[n, kk]

        out = []
        for w in range(4):  # level 64, warp w: X_LL's columns [8 w, 8 w + 8)
            n0 = 8 * w; kb = 16 * (w >> 1)
            Y = np.array([[sum(a[32 + r, kk] * x_at(kk, n0 + n) for kk in range(kb, 32)) for n in range(8)]
                          for r in range(32)])
            xlr = np.zeros((32, 32))
            for r in range(32):
                for kk in range(32):
                    R, Kc = 32 + r, 32 + kk
                    if (R >> 4) == (Kc >> 4):
                        xlr[r, kk] = a[R, Kc]  # X_22, X_33 in place
                    elif (R >> 4) > (Kc >> 4):
                        xlr[r, kk] = a[Kc, R]  # X_32, transposed
            out.append((n0, -(xlr @ Y)))
        for n0, t in out:
            a[n0:n0 + 8, 32:64] = t.T
            X[32:64, n0:n0 + 8] = t
        ref = np.linalg.inv(np.eye(64) + A)
        blk = np.array([[(c >> 4) <= (r >> 4) for c in range(64)] for r in range(64)])
        assert not np.isnan(X[blk]).any(), "an element left of the diagonal blocks was never handed over"
        err = np.abs(X[blk] - ref[blk]).max()
        assert err < 1e-9, f"doubling storage: max error {err}"
        assert np.allclose(ref[~blk], 0)
    print(f"storage: {trials} random A, every element handed over once, max error < 1e-9")


def tf32(x):
    x = np.asarray(x, np.float32).copy()
    b = x.view(np.uint32)
    b[:] = ((b.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return x


def bf16(x):
    x = np.asarray(x, np.float32).copy()
    b = x.view(np.uint32)
    b[:] = ((b.astype(np.uint64) + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return x


def mm(a, b):
    """tf32 operands, fp32 sums in k order (m16n8k8's operands and accumulator)."""
    a, b = tf32(a), tf32(b)
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for kk in range(a.shape[1]):
        out = (out + np.outer(a[:, kk], b[kk, :])).astype(np.float32)
    return out


def diag_blocks(A):
    X = np.zeros((64, 64), np.float32)
    for b in range(4):
        s = slice(16 * b, 16 * b + 16)
        for c in range(16):
            x = np.zeros(16, np.float32)
            for r in range(16):
                v = np.float32(1.0 if r == c else 0.0)
                for q in range(r):
                    v = np.float32(v - np.float32(A[s, s][r, q] * x[q]))
                x[r] = v
            X[s, 16 * b + c] = x
    return X


def block_rows(A):
    X = diag_blocks(A)
    for rb in range(1, 4):
        r0 = 16 * rb
        for cb in range(rb):
            Y = mm(A[r0:r0 + 16, 16 * cb:r0], X[16 * cb:r0, 16 * cb:16 * cb + 16])
            X[r0:r0 + 16, 16 * cb:16 * cb + 16] = -mm(X[r0:r0 + 16, r0:r0 + 16], Y)
    return X


def doubling(A):
    X = diag_blocks(A)
    for d0 in (0, 32):
        Y = mm(A[d0 + 16:d0 + 32, d0:d0 + 16], X[d0:d0 + 16, d0:d0 + 16])
        X[d0 + 16:d0 + 32, d0:d0 + 16] = -mm(X[d0 + 16:d0 + 32, d0 + 16:d0 + 32], Y)
    Y = mm(A[32:64, 0:32], X[0:32, 0:32])
    X[32:64, 0:32] = -mm(X[32:64, 32:64], Y)
    return X


def accuracy(trials=40):
    rng = np.random.default_rng(7)
    res = {'block rows': ([], []), 'doubling': ([], [])}
    for t in range(trials):
        A, beta = unit_lower_a(rng, t % 2 == 0)
        exact = np.linalg.inv(np.eye(64) + A.astype(np.float64))
        for name, f in (('block rows', block_rows), ('doubling', doubling)):
            X = f(A)
            x_rms = np.linalg.norm(X - exact) / np.linalg.norm(exact)
            ai = bf16(X * beta[None, :].astype(np.float32)).astype(np.float64)
            ai_ref = exact * beta[None, :]
            res[name][0].append(x_rms)
            res[name][1].append(np.linalg.norm(ai - ai_ref) / np.linalg.norm(ai_ref))
    for name, (xr, ar) in res.items():
        print(f"{name:10s} over {trials} chunks, rel RMS against the exact inverse: X (fp32) median {np.median(xr):.2e} "
              f"worst {max(xr):.2e}; Ai (bf16) median {np.median(ar):.2e} worst {max(ar):.2e}")


if __name__ == '__main__':
    {'storage': storage, 'accuracy': accuracy}[sys.argv[1] if len(sys.argv) > 1 else 'storage']()
