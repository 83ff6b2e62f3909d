"""How Caffe2's Python API registers the function of a Python operator (core.CreatePythonOperator, net.Python)
in stepnet's table of this process (stepnet.ops.python_op), and what the op then carries: its token.

f and grad_f are functions (inputs, outputs) or, for net.Python, (func, args, kwargs) builder tuples: a builder
is registered as one and called once per op instance, as Caffe2 calls its pickled builder, but it stays in this
process; a python_func_type is a class whose instance python_func_type(f) gives `forward` and `backward`. With
pass_workspace the function gets Caffe2's workspace object (workspace.C.Workspace) as its third argument.
"""
from __future__ import annotations

import functools

from ..ops.python_op import register_function, register_gradient_function
from . import c_api


def _with_workspace(func):
    """func(inputs, outputs, C.Workspace) called as the op calls it: with stepnet's workspace."""
    @functools.wraps(func)
    def call(inputs, outputs, ws):
        return func(inputs, outputs, c_api.Workspace(ws))
    return call


def _built(builder: tuple):
    func, args, kwargs = builder
    return func(*args, **kwargs)


def register(f, grad_f=None, python_func_type=None, pass_workspace: bool = False) -> str:
    """Caffe2's _RegisterPythonImpl: register f (and grad_f) and return the op's token. Builder tuples are
    called here, once."""
    if python_func_type:
        obj = python_func_type(f)
        f, grad_f = obj.forward, obj.backward
    else:
        f = _built(f) if isinstance(f, tuple) else f
        grad_f = _built(grad_f) if isinstance(grad_f, tuple) else grad_f
    token = register_function(_with_workspace(f) if pass_workspace else f, pass_workspace)
    if grad_f:
        register_gradient_function(token, grad_f)
    return token


def _builder(builder: tuple, pass_workspace: bool):
    """A zero-argument function making the op instance's function from a (func, args, kwargs) tuple."""
    if not (isinstance(builder, tuple) and len(builder) == 3):
        raise ValueError("Expected builder tuple (func, args, kwargs)")
    func, args, kwargs = builder[0], tuple(builder[1]), dict(builder[2])

    def build():
        made = func(*args, **kwargs)
        return _with_workspace(made) if pass_workspace else made
    build.__name__ = getattr(func, "__name__", "builder")
    return build


def op_arguments(f, grad_f=None, python_func_type=None, pass_workspace: bool = False) -> dict:
    """The arguments net.Python gives its Python ops: a token, and pass_workspace for builders."""
    if not isinstance(f, tuple):
        return {"token": register(f, grad_f, python_func_type, pass_workspace=pass_workspace)}
    if grad_f and not isinstance(grad_f, tuple):
        raise ValueError("A tuple has to be passed to both f and grad_f or neither.")
    token = register_function(_builder(f, pass_workspace), pass_workspace, builder=True)
    if grad_f:
        register_gradient_function(token, _builder(grad_f, pass_workspace), builder=True,
                                   pass_workspace=pass_workspace)
    return {"token": token, "pass_workspace": bool(pass_workspace)}


def net_python(net, f, grad_f=None, python_func_type=None, pass_workspace: bool = False, grad_output_indices=None,
               grad_input_indices=None):
    """Caffe2's Net.Python: f registered now; returns add(inputs, outputs, **kwargs) adding a Python op to net."""
    args = op_arguments(f, grad_f, python_func_type, pass_workspace)
    args.update(grad_output_indices=list(grad_output_indices or []), grad_input_indices=list(grad_input_indices or []))
    add_op = type(net).__getattr__(net, "Python")   # the op adder (net.Python is this method)

    def add(*a, **kwargs):
        return add_op(*a, **{**kwargs, **args})
    return add
