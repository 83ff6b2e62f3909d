"""ONNX's own backend test cases (their inputs and expected outputs come with the onnx package) on stepnet's
Caffe2 ONNX backend, through Caffe2's onnx_backend_test.py and tools/onnx_node_tests.py: a set of long-standing
cases of the ops Caffe2's backend converts must pass (the whole set, which changes with the onnx version, is the
tool's job; docs/caffe2.md has its counts)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("tabulate")   # (onnx's backend-test report plugin, which Caffe2's file loads, needs it)
ROOT = Path(__file__).resolve().parents[2]
DOCS_COMMAND = "python tools/onnx_node_tests.py"   # docs/caffe2.md; here on some of the cases
CASES = ["add", "averagepool_2d_default", "batchnorm_example", "concat_2d_axis_0", "conv_with_strides_padding",
         "gemm_default_zero_bias", "gru_defaults", "lstm_defaults", "matmul_2d", "maxpool_2d_default", "relu",
         "reshape_negative_dim", "sigmoid", "softmax_example", "tanh", "transpose_default"]


def test_long_standing_node_cases_pass_against_onnx_s_own_outputs():
    expression = " or ".join(f"test_{c}_cpu" for c in CASES)
    out = subprocess.run([sys.executable, "tools/onnx_node_tests.py", "-k", expression], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    passed, failed, skipped = (int(w) for w in re.findall(r"(\d+) \w+", out.stdout.strip().splitlines()[-1]))
    assert (failed, skipped) == (0, 0) and passed >= len(CASES), out.stdout[-3000:]   # (-k matches each case's
    # PyTorch-model namesakes too)
