"""The operator registry is closed: every family listed once, records complete when made, the registry frozen
once stepnet.ops is imported, and tests change records only through its two hooks (patched, temporary)."""
from pathlib import Path

import pytest

import stepnet.ops
from stepnet.core.errors import UnknownOpError
from stepnet.ops import FAMILIES, REGISTRY
from stepnet.ops.registry import Registry, op

OPS_DIR = Path(stepnet.ops.__file__).parent
# machinery, shared helpers: no ops
NOT_FAMILIES = {"__init__", "registry", "binding", "base", "window", "boxes", "rotated_boxes", "int8_base",
                "control_grad", "op_files"}


def test_every_family_is_listed_once():
    modules = {p.stem for p in OPS_DIR.glob("*.py")} - NOT_FAMILIES
    assert sorted(FAMILIES) == sorted(modules)
    assert len(set(FAMILIES)) == len(FAMILIES)
    assert {s.family for s in REGISTRY.schemas()} == set(FAMILIES)


def test_the_registry_is_frozen_once_imported():
    assert REGISTRY.frozen
    with pytest.raises(RuntimeError, match="cannot register operator LateOp: the registry is frozen"):
        op("LateOp")(lambda xp, x: x)
    assert "LateOp" not in REGISTRY


def test_records_cannot_be_changed_after_import():
    assert not hasattr(Registry, "update") and not hasattr(Registry, "unregister")


def test_ops_modules_do_not_import_gradients():
    """Gradient makers need only ops/base.py: no module of the package imports stepnet.passes.gradients, lazily
    or not."""
    for path in OPS_DIR.glob("*.py"):
        text = path.read_text()
        assert "from ..gradients" not in text and "stepnet.passes.gradients" not in text, path.name


def test_patched_swaps_fields_and_restores_the_record():
    relu = REGISTRY.get("Relu")
    with REGISTRY.patched("Relu", shape=None) as outer:
        assert REGISTRY.get("Relu") is outer and outer.shape is None and outer.kernel is relu.kernel
        with pytest.raises(ZeroDivisionError):
            with REGISTRY.patched("Relu", kernel=lambda xp, x: 1 / 0):
                assert REGISTRY.get("Relu").shape is None
                raise ZeroDivisionError
        assert REGISTRY.get("Relu") is outer
    assert REGISTRY.get("Relu") is relu
    with pytest.raises(TypeError):
        with REGISTRY.patched("Relu", no_such_field=1):
            pass
    with pytest.raises(UnknownOpError):
        with REGISTRY.patched("NoSuchOp", shape=None):
            pass


def test_temporary_registers_a_throwaway_op_even_when_frozen():
    with REGISTRY.temporary("TmpOp", lambda xp, x: x, inputs=(1, 2), aliases=("TmpOpAlias",)) as schema:
        assert REGISTRY.get("TmpOp") is schema and schema.inputs == (1, 2)
        assert REGISTRY.get("TmpOpAlias").type == "TmpOpAlias"
        with pytest.raises(ValueError, match="registered twice"):
            with REGISTRY.temporary("Relu", lambda xp, x: x):
                pass
    assert "TmpOp" not in REGISTRY and "TmpOpAlias" not in REGISTRY
    assert REGISTRY.get("Relu").family == "activation"


def test_the_fixtures_undo_their_changes(patched, broken, temporary_op):
    relu = REGISTRY.get("Relu")
    broken("Relu", lambda xp, x: x)
    patched("Relu", shape=None)
    temporary_op("FixtureOp", lambda xp, x: x)
    assert REGISTRY.get("Relu").kernel is not relu.kernel and REGISTRY.get("Relu").shape is None
    assert "FixtureOp" in REGISTRY


def test_after_the_fixtures_everything_is_back():
    """Runs after test_the_fixtures_undo_their_changes (pytest keeps file order)."""
    from stepnet.ops.activation import _unary  # noqa: F401  (the module that made Relu's record)
    relu = REGISTRY.get("Relu")
    assert relu.kernel.__name__ == "relu" and relu.shape is not None
    assert "FixtureOp" not in REGISTRY
