"""The runtime layer's shared pieces: the one boolean env parser, the byte formatter, warn-once."""
import warnings

import pytest

from torch_neuronx.runtime import env_flag, env_number, format_bytes, warn_once

VARIABLE = "TORCH_NEURONX_TEST_FLAG"


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True), (" On ", True),
                                            ("0", False), ("False", False), ("no", False), ("OFF", False)])
def test_env_flag_reads_the_same_words_for_every_variable(monkeypatch, value, expected):
    monkeypatch.setenv(VARIABLE, value)
    assert env_flag(VARIABLE, default=not expected) is expected


@pytest.mark.parametrize("default", [True, False])
def test_env_flag_unset_or_empty_is_the_default(monkeypatch, default):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert env_flag(VARIABLE, default) is default
    monkeypatch.setenv(VARIABLE, "  ")
    assert env_flag(VARIABLE, default) is default


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "tru"])
def test_env_flag_refuses_anything_else_naming_the_variable_and_the_words(monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ValueError) as caught:
        env_flag(VARIABLE, default=True)
    message = str(caught.value)
    assert message.startswith(f"{VARIABLE}={value!r} is not a boolean")
    assert all(word in message for word in ("1", "true", "yes", "on", "0", "false", "no", "off"))
    assert "default (on)" in message


def test_env_number_warns_once_and_keeps_the_default(monkeypatch):
    monkeypatch.setenv(VARIABLE, "-3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert env_number(VARIABLE, 7) == 7
        assert env_number(VARIABLE, 7) == 7
    assert len(caught) == 1 and f"{VARIABLE}='-3'" in str(caught[0].message)
    monkeypatch.setenv(VARIABLE, "2.5")
    assert env_number(VARIABLE, 1.0, float) == 2.5


@pytest.mark.parametrize("nbytes,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
                                         (5 * 2**20, "5.00 MiB"), (25568477184, "23.81 GiB"),
                                         (3 * 2**40, "3.00 TiB"), (-2048, "-2.00 KiB")])
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


def test_warn_once_warns_once_per_key():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_once(("test_runtime", 1), "first")
        assert not warn_once(("test_runtime", 1), "again")
        assert warn_once(("test_runtime", 2), "other", UserWarning)
    assert [(w.category, str(w.message)) for w in caught] == [(RuntimeWarning, "first"), (UserWarning, "other")]


def test_one_frame_walker_tells_the_users_frames_from_librarys():
    import json as stdlib_module

    import torch

    from torch_neuronx.runtime import frames

    assert frames.is_library(torch.__file__) and frames.is_library(frames.__file__)
    assert frames.is_library("<frozen importlib._bootstrap>") and not frames.is_library(__file__)
    assert not frames.is_library(stdlib_module.__file__) and frames.is_library(stdlib_module.__file__, stdlib=True)
    assert not frames.is_library("<string>") and frames.is_library("<string>", pseudo=True)

    def called_by_this_test():
        return next(frames.outward())  # the caller's caller: this test

    assert called_by_this_test().f_code is test_one_frame_walker_tells_the_users_frames_from_librarys.__code__
