#!/usr/bin/env python3
"""chunk_model.py: numpy model of the CUDA chunk op's stages (kernels/chunk/) and of its fused kernel,
with the same bf16 rounding points, used offline to check the device's intermediates stage by stage
and the accuracy of a design before it is written.

  chunk_model.py golden FILE...   model vs a golden file's o_ref / final_state_ref / chunk_states_ref
  chunk_model.py dump FILE...     model vs a dump of chunk_stages --dump (cumsums, keys, w, v_new,
                                  chunk-entry states, o, final and chunk states), per stage
  chunk_model.py fused FILE...    the fused kernel's rounding points (fused.cuh) vs a golden file
  chunk_model.py splitN FILE...   the same with the exact in-GPU split, segments of N chunks (local
                                  pass, transfer pass, fp32 fix-up, main pass), also vs unsplit
  chunk_model.py corrN FILE...    the split in the Hopper kernel's order since the twenty-seventh
                                  session: the local and transfer passes with their outputs (o^G and
                                  O^F, 16-bit), the fp32 fix-up, then o = bf(o^G + bf(O^F) bf(S_j))
                                  instead of the main pass, also vs unsplit
"""
import json, struct, sys
import numpy as np

R = np.float32(1.4426950216)  # GDP_RCP_LN2


def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__':
            out[k] = v
            continue
        s, e = v['data_offsets']
        raw = data[s:e]
        dt = v['dtype']
        if dt == 'BF16':
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == 'F32':
            a = np.frombuffer(raw, np.float32)
        else:
            a = np.frombuffer(raw, np.int32)
        out[k] = a.reshape(v['shape']).copy()
    return out


def bf(x):
    """fp32 -> bf16 (round to nearest even) -> fp32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return u.astype(np.uint32).view(np.float32)


def seq_cumsum(x):
    """chunk-local inclusive sums in fp32, index order, restarted every 64, times RCP_LN2."""
    out = np.zeros(len(x), np.float32)
    s = np.float32(0)
    for j, xv in enumerate(x):
        if j % 64 == 0:
            s = np.float32(0)
        s = np.float32(s + xv)
        out[j] = s * R
    return out


def head_inputs(q, k, v, g, beta, bos, L, h, M, l2):
    """One (sequence, head)'s inputs as the kernels see them: g per token, the expanded stream's
    chunk-local base-2 cumsum Gk (copy 0 of a token carries its g), keys and queries normalized
    and rounded if asked, values and beta, all fp32."""
    gs = g[bos:bos + L, h].astype(np.float32)
    gi = np.zeros(L * M, np.float32)
    gi[0::M] = gs
    Gk = seq_cumsum(gi)
    kk = k[bos * M:(bos + L) * M, h].astype(np.float32)
    qq = q[bos:bos + L, h].astype(np.float32)
    vv = v[bos * M:(bos + L) * M, h].astype(np.float32)
    bb = beta[bos * M:(bos + L) * M, h].astype(np.float32)
    if l2:
        kk = bf(kk / np.sqrt((kk * kk).sum(1, keepdims=True) + np.float32(1e-6)))
        qq = bf(qq / np.sqrt((qq * qq).sum(1, keepdims=True) + np.float32(1e-6)))
    return gs, Gk, kk, qq, vv, bb


def model(q, k, v, g, beta, h0, cu, M, scale, l2):
    """All stages; returns dict of outputs and intermediates in the workspace layouts (unpadded)."""
    T, H, K = q.shape
    V = v.shape[2]
    N = len(cu) - 1
    r = dict(o=np.zeros((T, H, V), np.float32), final=np.zeros((N, H, K, V), np.float32),
             gq=np.zeros((T, H), np.float32), gk=np.zeros((T * M, H), np.float32),
             kn=np.zeros((T * M, H, K), np.float32), w=np.zeros((T * M, H, K), np.float32),
             vnew=np.zeros((T * M, H, V), np.float32), h={})
    for i in range(N):
        bos, L = int(cu[i]), int(cu[i + 1] - cu[i])
        for h in range(H):
            gs, Gk, kk, qq, vv, bb = head_inputs(q, k, v, g, beta, bos, L, h, M, l2)
            Gq = seq_cumsum(gs)
            r['gq'][bos:bos + L, h] = Gq
            r['gk'][bos * M:(bos + L) * M, h] = Gk
            r['kn'][bos * M:(bos + L) * M, h] = kk
            W = np.zeros((L * M, K), np.float32)
            U = np.zeros((L * M, V), np.float32)
            for c in range(0, L * M, 64):
                n = min(64, L * M - c)
                kc, g_, b_ = kk[c:c + n], Gk[c:c + n], bb[c:c + n]
                A = np.tril((kc @ kc.T) * np.exp2(g_[:, None] - g_[None, :]) * b_[:, None], -1)
                Ai = bf(np.linalg.inv(np.eye(n) + A.astype(np.float64)).astype(np.float32))
                W[c:c + n] = bf(Ai @ bf(kc * (b_ * np.exp2(g_))[:, None]))
                U[c:c + n] = bf(Ai @ bf(vv[c:c + n] * b_[:, None]))
            r['w'][bos * M:(bos + L) * M, h] = W
            S = h0[i, h].astype(np.float32).copy() if h0 is not None else np.zeros((K, V), np.float32)
            hs = []
            VN = np.zeros_like(U)
            for ct in range((L * M + 63) // 64):
                c = ct * 64
                n = min(64, L * M - c)
                if ct % M == 0:
                    hs.append(S.copy())
                vn = U[c:c + n] - bf(W[c:c + n]) @ bf(S)
                VN[c:c + n] = bf(vn)
                gl = Gk[c + n - 1]
                vd = bf(vn * np.exp2(gl - Gk[c:c + n])[:, None])
                S = S * np.exp2(gl) + kk[c:c + n].T @ vd
            r['vnew'][bos * M:(bos + L) * M, h] = VN
            r['final'][i, h] = S
            r['h'][(i, h)] = hs
            for ctok, hc in enumerate(hs):
                t0 = ctok * 64
                n = min(64, L - t0)
                qc, gq = qq[t0:t0 + n], Gq[t0:t0 + n]
                acc = (qc @ bf(hc)) * np.exp2(gq)[:, None]
                D = np.tril(np.exp2(gq[:, None] - gq[None, :]))
                for m in range(M):
                    rows = np.arange(t0, t0 + n) * M + m
                    P = bf((qc @ kk[rows].T) * D)
                    acc += P @ VN[rows]
                r['o'][bos + t0:bos + t0 + n, h] = bf(acc * np.float32(scale))
    return r


def fused_head(qq, kk, vv, bb, Gk, S0, L, M, scale, seg_starts=None):
    """The fused kernel's rounding points (kernels/chunk/fused.cuh) for one (sequence, head):
    per expanded chunk, S16 = bf(S), Ai = bf((I + A)^-1 diag beta), X' = bf(V - 2^Gk K S16),
    v_new = Ai X', the outputs of the tokens whose last copy lies in the chunk from S16 and the
    masked decayed scores P = bf(...), S = 2^gl S + K^T bf(2^(gl - Gk) v_new).
    seg_starts: if given, the chunk index each segment starts at and the state to start it from
    (the split's main pass); returns (o rows by token, chunk states, final state, per-segment
    exit states)."""
    o = np.zeros((L, vv.shape[1]), np.float32)
    S = S0.astype(np.float32).copy()
    hs, exits = [], []
    nch = (L * M + 63) // 64
    starts = dict(seg_starts or {})
    for c in range(nch):
        if c in starts:
            if c > 0:
                exits.append(S.copy())
            S = starts[c].astype(np.float32).copy()
        lo = c * 64
        n = min(64, L * M - lo)
        if c % M == 0:
            hs.append(S.copy())
        kc, g_, b_ = kk[lo:lo + n], Gk[lo:lo + n], bb[lo:lo + n]
        S16 = bf(S)
        A = np.tril((kc @ kc.T) * np.exp2(g_[:, None] - g_[None, :]) * b_[:, None], -1)
        X = np.linalg.inv(np.eye(n) + A.astype(np.float64)).astype(np.float32)
        Ai = bf(X * b_[None, :])
        Xp = bf(vv[lo:lo + n] - np.exp2(g_)[:, None] * (kc @ S16))
        vn = Ai @ Xp
        VN = bf(vn)
        gl = g_[n - 1]
        vd = bf(vn * np.exp2(gl - g_)[:, None])
        tf, tl = lo // M, min(L - 1, (lo + n - M) // M)
        for t in range(tf, tl + 1):
            rt = t * M + M - 1 - lo
            p_ = bf((qq[t] @ kc[:rt + 1].T) * np.exp2(g_[rt] - g_[:rt + 1]))
            o[t] = bf(np.float32(scale) * (np.exp2(g_[rt]) * (qq[t] @ S16) + p_ @ VN[:rt + 1]))
        S = S * np.exp2(gl) + kc.T @ vd
    exits.append(S.copy())
    return o, hs, S, exits


def fused_model(q, k, v, g, beta, h0, cu, M, scale, l2, seg=0, corrected=False):
    """The fused kernel over every sequence and head; seg > 0: the exact split with segments of
    seg chunks (local pass from zero, transfer pass from I with V = 0, fp32 fix-up in segment
    order, main pass from the fixed entry states); corrected: no main pass, the outputs of segment
    j >= 1 corrected instead, bf(o^G + bf(O^F) bf(S_j)) with fp32 sums (hop_correct_kernel)."""
    T, H, K = q.shape
    V = v.shape[2]
    N = len(cu) - 1
    r = dict(o=np.zeros((T, H, V), np.float32), final=np.zeros((N, H, K, V), np.float32), h={})
    for i in range(N):
        bos, L = int(cu[i]), int(cu[i + 1] - cu[i])
        for h in range(H):
            _, Gk, kk, qq, vv, bb = head_inputs(q, k, v, g, beta, bos, L, h, M, l2)
            S0 = h0[i, h].astype(np.float32) if h0 is not None else np.zeros((K, V), np.float32)
            nch = (L * M + 63) // 64
            if seg > 0 and nch > seg:
                firsts = list(range(0, nch, seg))
                # local pass: each segment from 0 (the first from h0); transfer pass: from I, V = 0
                oG, _, _, R = fused_head(qq, kk, vv, bb, Gk, S0, L, M, scale,
                                         {c: (S0 if c == 0 else np.zeros((K, V), np.float32)) for c in firsts})
                I = np.eye(K, dtype=np.float32)
                oF, _, _, P = fused_head(qq, kk, np.zeros((L * M, K), np.float32), bb, Gk, I, L, M, scale,
                                         {c: I for c in firsts})
                starts, Sj = {0: S0}, R[0]
                for j in range(1, len(firsts)):
                    starts[firsts[j]] = Sj
                    Sj = (P[j].astype(np.float64) @ Sj.astype(np.float64)).astype(np.float32) + R[j]
                if corrected:
                    o, hs, S = oG.copy(), [], Sj
                    for j in range(1, len(firsts)):
                        lo, hi = firsts[j] * 64, (firsts[j + 1] * 64 if j + 1 < len(firsts) else L * M)
                        t = np.array([t for t in range(L) if lo <= t * M + M - 1 < hi], dtype=np.int64)
                        o[t] = bf(oG[t] + bf(oF[t]) @ bf(starts[firsts[j]]))
                else:
                    o, hs, S, _ = fused_head(qq, kk, vv, bb, Gk, S0, L, M, scale, starts)
            else:
                o, hs, S, _ = fused_head(qq, kk, vv, bb, Gk, S0, L, M, scale)
            r['o'][bos:bos + L, h] = o
            r['final'][i, h] = S
            r['h'][(i, h)] = hs
    return r


def rel(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    nb = np.linalg.norm(b)
    return np.linalg.norm(a - b) / nb if nb > 0 else np.linalg.norm(a - b)


def states_table(r, co, H, K, V, rows):
    cs = np.zeros((rows, H, K, V), np.float32)
    for (i, h), hs in r['h'].items():
        for c, s in enumerate(hs):
            cs[co[i] + c, h] = s
    return cs


def main():
    mode, files = sys.argv[1], sys.argv[2:]
    for f in files:
        d = load(f)
        q, k, v, g, beta = d['q'][0], d['k'][0], d['v'][0], d['g'][0], d['beta'][0]
        cu, co = d['cu_seqlens'], d['chunk_offsets']
        T, H, K = q.shape
        V = v.shape[2]
        M = k.shape[0] // T
        if mode in ('golden', 'fused') or mode.startswith('split') or mode.startswith('corr'):
            meta = d['__metadata__']
            scale = float(meta['scale'])
            l2 = str(meta['use_qk_l2norm_in_kernel']).lower() == 'true'
        else:
            scale, l2 = 1.0 / np.sqrt(K), True
        end, nreal = int(cu[-1]), int(co[-1])
        name = f.split('/')[-1]
        if mode == 'fused' or mode.startswith('split') or mode.startswith('corr'):
            corrected = mode.startswith('corr')
            seg = int(mode[4:] if corrected else mode[5:]) if mode != 'fused' else 0
            r = fused_model(q, k, v, g, beta, d['initial_state'], cu, M, scale, l2, seg, corrected)
            line = '%s %s: o %.2e final %.2e' % (mode, name, rel(r['o'][:end], d['o_ref'][0][:end]),
                                                 rel(r['final'], d['final_state_ref']))
            if not corrected:
                cs = states_table(r, co, H, K, V, d['chunk_states_ref'].shape[0])
                line += ' chunk states %.2e' % rel(cs[:nreal], d['chunk_states_ref'][:nreal])
            if seg > 0:
                u = fused_model(q, k, v, g, beta, d['initial_state'], cu, M, scale, l2, 0)
                line += '; vs unsplit: o %.2e final %.2e' % (rel(r['o'][:end], u['o'][:end]), rel(r['final'], u['final']))
            print(line)
            continue
        r = model(q, k, v, g, beta, d['initial_state'], cu, M, scale, l2)
        if mode == 'golden':
            cs = states_table(r, co, H, K, V, d['chunk_states_ref'].shape[0])
            print('%s: o %.2e final %.2e chunk states %.2e' % (
                name, rel(r['o'][:end], d['o_ref'][0][:end]), rel(r['final'], d['final_state_ref']),
                rel(cs[:nreal], d['chunk_states_ref'][:nreal])))
            continue
        TM = T * M
        ends = [(int(cu[i]) * M, int(cu[i + 1]) * M) for i in range(len(cu) - 1)]
        mask = np.zeros(TM, bool)
        for a, b in ends:
            mask[a:b] = True
        hs = states_table(r, co, H, K, V, nreal)
        dev_h = d['ws_h'][:nreal, :, :K, :V]
        checks = [
            ('Gq', d['ws_gq'][:end], r['gq'][:end]), ('Gk', d['ws_gk'][mask], r['gk'][mask]),
            ('keys', d['ws_kn'][mask][:, :, :K], r['kn'][mask]), ('w', d['ws_w'][mask][:, :, :K], r['w'][mask]),
            ('v_new', d['ws_vnew'][mask][:, :, :V], r['vnew'][mask]), ('h (bf16)', dev_h, bf(hs)),
            ('chunk states', d['chunk_states'][:nreal], hs), ('final state', d['final_state'], r['final']),
            ('o', d['o'][0][:end], r['o'][:end]),
        ]
        print('%s (T=%d H=%d K=%d V=%d M=%d):' % (name, T, H, K, V, M))
        for label, a, b in checks:
            print('  %-14s rel %.2e  max|d| %.2e  nonfinite %d' % (
                label, rel(a, b), float(np.max(np.abs(a - b))) if a.size else 0.0, int(np.sum(~np.isfinite(a)))))
        tail = d['o'][0][end:]
        print('  o tail rows exactly 0: %s' % bool(np.all(tail == 0)))
        pad_w = d['ws_w'][mask][:, :, K:]
        print('  w / keys padding columns zero: %s' % bool(np.all(pad_w == 0) and np.all(d['ws_kn'][mask][:, :, K:] == 0)))


if __name__ == '__main__':
    main()
