"""The allocator tuning applies on glibc (this project's machines) and is harmless to repeat."""

from __future__ import annotations

import platform

import pytest

from headrace.tuning import tune_allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuning_applies_on_glibc_and_can_be_repeated() -> None:
    assert tune_allocator() is True
    assert tune_allocator() is True
