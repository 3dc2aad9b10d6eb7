"""kernels/packages.py: the one "does it import" / "which version" helper of the kernels
(CuTe DSL, FlyDSL)."""

from rope_kernels.kernels import qkv_cute, qkv_flydsl
from rope_kernels.kernels.packages import imports, installed_version


def test_imports_is_all_or_nothing():
    assert imports("json", "json.decoder")
    assert not imports("json", "rope_kernels_no_such_module")
    assert not imports("rope_kernels_no_such_module")


def test_installed_version_is_empty_where_not_installed():
    import pytest as pytest_module

    assert installed_version("pytest") == pytest_module.__version__
    assert installed_version("rope-kernels-no-such-distribution") == ""


def test_the_kernels_ask_it():
    """qkv_cute and qkv_flydsl answer through it (they each carried their own copy)."""
    assert qkv_cute.available() == imports("cutlass", "cutlass.cute")
    assert qkv_cute.cutlass_dsl_version() == installed_version("nvidia-cutlass-dsl")
    assert qkv_flydsl.available() == imports("flydsl")
    assert qkv_flydsl.flydsl_version() == installed_version("flydsl")
