"""A hand-written numpy char-rnn training step (one-layer LSTM, BPTT), the baseline of char_rnn.py.

It is written as a careful numpy programmer would write it, in float32, every buffer allocated once and every
step's arithmetic into them (out=): the input of all timesteps projected at once (its rows gathered where the
input is one-hot, as char-rnn's is, else one GEMM), each step's gates with one GEMM plus vectorised activations
(sigmoid as 0.5·tanh(x/2) + 0.5), the backward pass one GEMM per step for the recurrent gradient and the weight
gradients one GEMM each after the loop. Softmax + cross entropy use the fused gradient (p − onehot)/N.

Parameters are keyed by ROLES, the suffixes of the blob names that stepnet.builders.rnn.lstm and ModelBuilder.fc
give them, in their layouts (gate order i, f, o, g; FC weights out × in), so the same initial values can be
loaded into both. The update rules are Caffe2's (SGD: param += lr·grad with lr = −base·γ^⌊iter/stepsize⌋;
Adam with its bias correction at t = iteration + 1). All sequences run their full length (no seq_lengths).
"""
from __future__ import annotations

import math

import numpy as np

F32 = np.float32
ROLES = ("i2h_w", "i2h_b", "gates_t_w", "gates_t_b", "output_w", "output_b")


def init_params(V: int, H: int, seed: int = 0) -> dict:
    """Xavier-uniform weights and zero biases, by role."""
    rng = np.random.default_rng(seed)

    def xavier(out, inp):
        s = math.sqrt(3.0 / inp)
        return rng.uniform(-s, s, (out, inp)).astype(F32)
    return {"i2h_w": xavier(4 * H, V), "i2h_b": np.zeros(4 * H, F32),
            "gates_t_w": xavier(4 * H, H), "gates_t_b": np.zeros(4 * H, F32),
            "output_w": xavier(V, H), "output_b": np.zeros(V, F32)}


def _sigmoid_(x):
    """x := sigmoid(x) in place, as 0.5·tanh(x/2) + 0.5."""
    x *= F32(0.5)
    np.tanh(x, out=x)
    x *= F32(0.5)
    x += F32(0.5)
    return x


class CharRNN:
    """Buffers for one (T, B, V, H) shape, allocated once; step() runs forward, backward and the update."""

    def __init__(self, params: dict, T: int, B: int, optimizer: str = "sgd", base_lr: float = 0.1,
                 stepsize: int = 1, gamma: float = 0.9999, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8):
        self.p = {k: np.array(v, dtype=F32, copy=True) for k, v in params.items()}
        H = self.p["gates_t_w"].shape[1]
        self.T, self.B, self.H = T, B, H
        self.optimizer, self.base_lr, self.stepsize, self.gamma = optimizer, base_lr, stepsize, gamma
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.iteration = 0
        self.grads: dict = {}                           # of the last step, before its update
        self.moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.p.items()}
        self.acts = np.empty((T, B, 4 * H), F32)       # i, f, o after sigmoid, g after tanh
        self.c = np.empty((T + 1, B, H), F32)
        self.h = np.empty((T + 1, B, H), F32)
        self.tanh_c = np.empty((T, B, H), F32)
        self.dgates = np.empty((T, B, 4 * H), F32)
        self.xg = np.empty((T * B, 4 * H), F32)
        self.scratch = {name: np.empty((B, H), F32) for name in ("ig", "dh", "dc", "gg")}
        self.sig = np.empty((B, 3 * H), F32)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, x, h0, c0):
        """Hidden states T×B×H of the LSTM over the one-hot input x (T×B×V)."""
        T, B, H, p = self.T, self.B, self.H, self.p
        x2 = x.reshape(T * B, -1)
        ids = x2.argmax(axis=1)
        if np.array_equal(x2[np.arange(T * B), ids], np.ones(T * B, F32)) and x2.sum() == T * B:
            np.take(p["i2h_w"].T, ids, axis=0, out=self.xg)   # one-hot rows: the input GEMM's rows, gathered
        else:
            np.matmul(x2, p["i2h_w"].T, out=self.xg)
        xg = self.xg
        xg += p["i2h_b"] + p["gates_t_b"]
        xg = xg.reshape(T, B, 4 * H)
        wt, ig = p["gates_t_w"].T, self.scratch["ig"]
        self.h[0], self.c[0] = h0.reshape(B, H), c0.reshape(B, H)
        for t in range(T):
            a = self.acts[t]
            np.matmul(self.h[t], wt, out=a)
            a += xg[t]
            _sigmoid_(a[:, :3 * H])
            np.tanh(a[:, 3 * H:], out=a[:, 3 * H:])
            c = self.c[t + 1]
            np.multiply(a[:, H:2 * H], self.c[t], out=c)
            np.multiply(a[:, :H], a[:, 3 * H:], out=ig)
            c += ig
            np.tanh(c, out=self.tanh_c[t])
            np.multiply(a[:, 2 * H:3 * H], self.tanh_c[t], out=self.h[t + 1])
        return self.h[1:]

    # ------------------------------------------------------------------------------------------ backward
    def backward(self, x, dh_all):
        """Parameter gradients (dict) from dLoss/dh for every step (T×B×H)."""
        T, B, H, p = self.T, self.B, self.H, self.p
        wh = p["gates_t_w"]
        dh_next = np.zeros((B, H), F32)
        dc_next = np.zeros((B, H), F32)
        dh, dc, gg, sig = self.scratch["dh"], self.scratch["dc"], self.scratch["gg"], self.sig
        for t in range(T - 1, -1, -1):
            a, tc, dg = self.acts[t], self.tanh_c[t], self.dgates[t]
            i, f, o, g = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            np.add(dh_all[t], dh_next, out=dh)
            np.multiply(tc, tc, out=dc)
            np.subtract(F32(1), dc, out=dc)
            dc *= o
            dc *= dh
            dc += dc_next
            np.multiply(dc, g, out=dg[:, :H])                       # d i
            np.multiply(dc, self.c[t], out=dg[:, H:2 * H])          # d f
            np.multiply(dh, tc, out=dg[:, 2 * H:3 * H])             # d o
            np.multiply(dc, i, out=dg[:, 3 * H:])                   # d g
            s = a[:, :3 * H]
            np.subtract(F32(1), s, out=sig)
            sig *= s
            dg[:, :3 * H] *= sig
            np.multiply(g, g, out=gg)
            np.subtract(F32(1), gg, out=gg)
            dg[:, 3 * H:] *= gg
            np.multiply(dc, f, out=dc_next)
            np.matmul(dg, wh, out=dh_next)
        d2 = self.dgates.reshape(T * B, 4 * H)
        db = d2.sum(axis=0)
        return {"gates_t_w": d2.T @ self.h[:-1].reshape(T * B, H), "gates_t_b": db,
                "i2h_w": d2.T @ x.reshape(T * B, -1), "i2h_b": db.copy()}

    # ------------------------------------------------------------------------------------------ step
    def step(self, x, target, h0, c0) -> float:
        """One training step on one-hot x (T×B×V) and int targets (T·B); returns the pre-update loss."""
        T, B, H, p = self.T, self.B, self.H, self.p
        hs = self.forward(x, h0, c0).reshape(T * B, H)
        logits = hs @ p["output_w"].T
        logits += p["output_b"]
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        n = T * B
        rows = np.arange(n)
        loss = float(-np.log(np.maximum(logits[rows, target], F32(1e-20))).mean())
        dlogits = logits
        dlogits[rows, target] -= 1
        dlogits *= F32(1.0 / n)
        grads = self.backward(x, (dlogits @ p["output_w"]).reshape(T, B, H))
        grads["output_w"] = dlogits.T @ hs
        grads["output_b"] = dlogits.sum(axis=0)
        self.grads = grads
        self.update(grads)
        return loss

    def update(self, grads: dict) -> None:
        self.iteration += 1
        it = self.iteration
        if self.optimizer == "sgd":
            lr = F32(-self.base_lr * self.gamma ** (it // self.stepsize))
            for k, g in grads.items():
                self.p[k] += lr * g
            return
        b1, b2 = F32(self.beta1), F32(self.beta2)
        t = it + 1                                   # Caffe2's Adam counts from iteration + 1
        corr = math.sqrt(1.0 - float(b2) ** t) / (1.0 - float(b1) ** t)
        step = F32(-self.base_lr * corr)
        for k, g in grads.items():
            m1, m2 = self.moments[k]
            m1 *= b1
            m1 += (1 - b1) * g
            m2 *= b2
            m2 += (1 - b2) * (g * g)
            self.p[k] += step * m1 / (np.sqrt(m2) + F32(self.epsilon))
