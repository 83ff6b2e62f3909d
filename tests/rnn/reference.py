"""An independent float64 numpy LSTM with backpropagation through time (Caffe2's LSTMUnit semantics, §4)."""
import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_forward(X, h0, c0, Wi, bi, Wg, bg, seq=None, forget_bias=0.0, drop_states=False):
    """X: T x N x D; h0, c0: N x H; Wi: 4H x D; Wg: 4H x H. Returns h_all, c_all (T x N x H) and a cache."""
    T, N, _ = X.shape
    H = Wg.shape[1]
    i2h = X @ Wi.T + bi
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    hs, cs, cache = [], [], []
    for t in range(T):
        gates = h @ Wg.T + bg + i2h[t]
        i = sigmoid(gates[:, :H])
        f = sigmoid(gates[:, H:2 * H] + forget_bias)
        o = sigmoid(gates[:, 2 * H:3 * H])
        g = np.tanh(gates[:, 3 * H:])
        c_new = f * c + i * g
        h_new = o * np.tanh(c_new)
        valid = np.ones((N, 1), bool) if seq is None else (t < np.asarray(seq))[:, None]
        keep_h = 0.0 if drop_states else h
        keep_c = 0.0 if drop_states else c
        cache.append((h, c, i, f, o, g, c_new, valid))
        h = np.where(valid, h_new, keep_h)
        c = np.where(valid, c_new, keep_c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs), np.stack(cs), cache


def lstm_backward(X, Wi, Wg, cache, dh_all, dh_last, dc_all, dc_last, drop_states=False):
    """Gradients (dX, dWi, dbi, dWg, dbg, dh0, dc0) for upstream gradients of h_all, h_last, c_all, c_last."""
    T, N, _ = X.shape
    H = Wg.shape[1]
    dh_next, dc_next = dh_last.astype(np.float64).copy(), dc_last.astype(np.float64).copy()
    dWg = np.zeros_like(Wg, dtype=np.float64)
    dbg = np.zeros(4 * H)
    di2h = np.zeros((T, N, 4 * H))
    for t in reversed(range(T)):
        h_prev, c_prev, i, f, o, g, c_new, valid = cache[t]
        dh = dh_next + dh_all[t]
        dc = dc_next + dc_all[t]
        tc = np.tanh(c_new)
        dcn = dc + dh * o * (1 - tc ** 2)
        dgates = np.concatenate([dcn * g * i * (1 - i), dcn * c_prev * f * (1 - f), dh * tc * o * (1 - o),
                                 dcn * i * (1 - g ** 2)], axis=1) * valid
        carried = 0.0 if drop_states else 1.0
        dc_prev = np.where(valid, dcn * f, carried * dc)
        dh_prev = dgates @ Wg + np.where(valid, 0.0, carried * dh)
        dWg += dgates.T @ h_prev
        dbg += dgates.sum(axis=0)
        di2h[t] = dgates
        dh_next, dc_next = dh_prev, dc_prev
    dWi = np.einsum("tng,tnd->gd", di2h, X)
    dbi = di2h.sum(axis=(0, 1))
    dX = di2h @ Wi
    return dX, dWi, dbi, dWg, dbg, dh_next, dc_next
