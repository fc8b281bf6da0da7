"""Where the hf rollout lets torch.compile cache its artefacts
(``polyrl_rollout_hf.compile_cache``): the user's private folder, never one that others can
write, and a folder the user chose."""

from __future__ import annotations

import os
import stat

from polyrl_rollout_hf.compile_cache import ENV, cache_root, use_compile_cache


def test_the_users_private_folder_keyed_by_torch_version(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not" / "there"))  # created too
    monkeypatch.delenv(ENV, raising=False)
    folder = use_compile_cache()
    assert folder == str(cache_root()) == os.environ[ENV]
    assert folder.startswith(str(tmp_path / "not" / "there" / "polyrl" / "inductor"))
    assert torch.__version__.split("+")[0] in folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_folder_others_can_write_is_not_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(ENV, raising=False)
    shared = cache_root()
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    folder = use_compile_cache()
    assert folder != str(shared) and "polyrl-inductor-" in folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert "writable by others" in caplog.text


def test_a_folder_the_user_chose_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert use_compile_cache() == str(tmp_path / "mine")
