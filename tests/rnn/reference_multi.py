"""Independent float64 numpy references: a stacked LSTM (reference.py's LSTM and BPTT layer by layer), a GRU
and a basic RNN written from their equations (gru_cell.py / rnn_cell.BasicRNNCell semantics), and central
differences over those numpy functions for the gradients of the GRU and basic RNN."""
import numpy as np

from .reference import lstm_backward, lstm_forward, sigmoid


def multi_lstm_forward(X, layers, seq=None, forget_bias=0.0, drop_states=False):
    """layers: [(h0, c0, Wi, bi, Wg, bg)] from the input side; each layer's i2h reads the layer below's h_all.
    Returns [(h_all, c_all, cache, layer input)] per layer."""
    out, x = [], np.asarray(X, np.float64)
    for h0, c0, Wi, bi, Wg, bg in layers:
        h_all, c_all, cache = lstm_forward(x, h0, c0, Wi, bi, Wg, bg, seq, forget_bias, drop_states)
        out.append((h_all, c_all, cache, x))
        x = h_all
    return out


def multi_lstm_backward(layers, fwd, up, drop_states=False):
    """up: gradients of the last layer's (h_all, h_last, c_all, c_last) (None = 0). Returns dX and, per layer,
    (dWi, dbi, dWg, dbg, dh0, dc0)."""
    h_all = fwd[-1][0]
    up = [np.zeros_like(h_all if k % 2 == 0 else h_all[-1:]) if u is None else np.asarray(u, np.float64)
          for k, u in enumerate(up)]
    dh_all, dh_last, dc_all, dc_last = up[0], up[1][0], up[2], up[3][0]
    per_layer = [None] * len(layers)
    for k in reversed(range(len(layers))):
        _, _, Wi, _, Wg, _ = layers[k]
        _, _, cache, x = fwd[k]
        dx, dWi, dbi, dWg, dbg, dh0, dc0 = lstm_backward(x, Wi, Wg, cache, dh_all, dh_last, dc_all, dc_last,
                                                         drop_states)
        per_layer[k] = (dWi, dbi, dWg, dbg, dh0, dc0)
        # the layer below receives gradient only through its h_all (the input of this layer's i2h)
        dh_all, dh_last, dc_all, dc_last = dx, np.zeros(x.shape[1:]), np.zeros_like(dx), np.zeros(x.shape[1:])
    return dh_all, per_layer


def _valid(seq, t, N):
    return np.ones((N, 1), bool) if seq is None else (t < np.asarray(seq))[:, None]


def gru_forward(X, h0, Wi, bi, Wr, br, Wu, bu, Wo, bo, seq=None, drop_states=False, linear_before_reset=False):
    """X: T x N x D. i2h = X Wi^T + bi split into reset/update/output parts; per step
    r = σ(h Wr^T + br + x_r), u = σ(h Wu^T + bu + x_u), o = tanh((r·h) Wo^T + bo + x_o) (or r·(h Wo^T + bo)
    + x_o with linear_before_reset), h' = u·h + (1 − u)·o; rows past their length keep h (or 0)."""
    X = np.asarray(X, np.float64)
    T, N, _ = X.shape
    H = Wr.shape[0]
    i2h = X @ Wi.T + bi
    h = np.broadcast_to(np.asarray(h0, np.float64).reshape(-1, H), (N, H))
    hs = []
    for t in range(T):
        xr, xu, xo = i2h[t, :, :H], i2h[t, :, H:2 * H], i2h[t, :, 2 * H:]
        r = sigmoid(h @ Wr.T + br + xr)
        u = sigmoid(h @ Wu.T + bu + xu)
        pre = r * (h @ Wo.T + bo) if linear_before_reset else (r * h) @ Wo.T + bo
        o = np.tanh(pre + xo)
        new = u * h + (1 - u) * o
        h = np.where(_valid(seq, t, N), new, 0.0 if drop_states else h)
        hs.append(h)
    return np.stack(hs)


def basic_rnn_forward(X, h0, Wi, bi, Wh, bh, seq=None, drop_states=False, activation="tanh"):
    """h' = act(h Wh^T + bh + X_t Wi^T + bi), masked like Caffe2's BasicRNNCell."""
    X = np.asarray(X, np.float64)
    T, N, _ = X.shape
    H = Wh.shape[0]
    act = np.tanh if activation == "tanh" else (lambda v: np.maximum(v, 0.0))
    h = np.broadcast_to(np.asarray(h0, np.float64).reshape(-1, H), (N, H))
    hs = []
    for t in range(T):
        new = act(h @ Wh.T + bh + X[t] @ Wi.T + bi)
        h = np.where(_valid(seq, t, N), new, 0.0 if drop_states else h)
        hs.append(h)
    return np.stack(hs)


def numeric_grads(f, values: dict, weights, eps=1e-6):
    """Central differences of L = Σ_k <f(**values)[k], weights[k]> for every array in values (float64)."""
    values = {k: np.array(v, np.float64) for k, v in values.items()}

    def loss(vals):
        outs = f(**vals)
        return sum(float((o * w).sum()) for o, w in zip(outs, weights, strict=False) if w is not None)

    grads = {}
    for name, x in values.items():
        g = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            plus = loss(values)
            x[i] = old - eps
            minus = loss(values)
            x[i] = old
            g[i] = (plus - minus) / (2 * eps)
        grads[name] = g
    return grads
