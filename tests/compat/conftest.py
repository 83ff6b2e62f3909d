"""Every compat test starts from Caffe2's fresh-process state: one empty "default" workspace, no scopes, no net,
step or optimizer names used yet."""
import pytest

from stepnet.compat.state import reset


@pytest.fixture(autouse=True)
def fresh_caffe2_state():
    reset()
    yield
    reset()
