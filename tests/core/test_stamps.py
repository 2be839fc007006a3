"""core.stamps: a stamped file's sha256 is taken from its stamp only while its identity is the one stamped; any
write (even one that puts the modification time back), replacement or copy makes it hashed again. The oracle is
hashlib over the file's bytes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from support.common import within

from tfm_export.core import stamps as stamps_module
from tfm_export.core.stamps import SETTLE_NS, Stamps, identity


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def stamped(tmp_path) -> tuple[Path, Path]:
    """A file and the stamps a recording made of it, written to disk."""
    file = tmp_path / "weights.bin"
    file.write_bytes(os.urandom(4096))
    recording = Stamps(recording=True)
    assert recording.sha256(file) == sha(file) and recording.hashed == 1
    recording.write(tmp_path / "stamps.json")
    return file, tmp_path / "stamps.json"


def test_a_stamped_file_is_not_read_again(stamped, monkeypatch):
    file, path = stamped
    expected = sha(file)
    stamps = Stamps.read(path)
    monkeypatch.setattr(stamps_module, "file_sha256", lambda p: pytest.fail(f"{p} was read"))
    assert stamps.sha256(file) == expected
    assert (stamps.hits, stamps.hashed) == (1, 0)


def test_writing_is_seen_even_with_the_modification_time_put_back(stamped):
    file, path = stamped
    st = file.stat()
    data = bytearray(file.read_bytes())
    data[7] ^= 0xFF
    file.write_bytes(bytes(data))
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))  # the size and mtime as stamped; ctime moved on
    stamps = Stamps.read(path)
    assert stamps.sha256(file) == sha(file) != json.loads(path.read_text())["files"][0][5]
    assert (stamps.hits, stamps.hashed) == (0, 1)


@pytest.mark.parametrize("how", ["copy2", "replace"])
def test_a_copy_or_a_replaced_file_is_hashed(stamped, how):
    file, path = stamped
    if how == "copy2":  # bytes and times kept, another inode
        shutil.copy2(file, file.with_name("copy.bin"))
        file = file.with_name("copy.bin")
    else:
        other = file.with_name("other.bin")
        other.write_bytes(os.urandom(4096))
        os.replace(other, file)
    stamps = Stamps.read(path)
    assert stamps.sha256(file) == sha(file) and stamps.hashed == 1


# The test's own floor, not the module's constant: the coarsest file time stamps the stamps must outlast (ext3 and
# HFS+ keep whole seconds), so a write in the same tick as the hashing can never leave the stamped identity unchanged
COARSEST_TICK_NS = 1_000_000_000


def test_stamps_wait_until_the_newest_file_settled(tmp_path):
    """Two files, the first long settled and the second just written: the stamps are saved only once the newest
    change is a whole coarse tick old."""
    old, new = tmp_path / "old.bin", tmp_path / "new.bin"
    old.write_bytes(b"x" * 100)
    time.sleep(COARSEST_TICK_NS / 1e9)
    new.write_bytes(b"y" * 100)
    recording = Stamps(recording=True)
    for file in (new, old):
        recording.sha256(file)
    recording.write(tmp_path / "stamps.json")
    assert time.time_ns() >= new.stat().st_ctime_ns + COARSEST_TICK_NS
    assert SETTLE_NS >= COARSEST_TICK_NS


def test_a_file_that_changes_while_it_is_hashed_is_not_stamped(tmp_path, monkeypatch):
    file = tmp_path / "moving.bin"
    file.write_bytes(b"a" * 100)
    real = stamps_module.file_sha256

    def changing(path):
        digest = real(path)
        path.write_bytes(b"b" * 100)
        return digest
    monkeypatch.setattr(stamps_module, "file_sha256", changing)
    recording = Stamps(recording=True)
    recording.sha256(file)
    assert recording.made == {}


@pytest.mark.parametrize("text", ["not json", '{"format": 99, "files": []}', '{"format": 1, "files": [[1, 2]]}',
                                  '{"format": 1, "files": 3}', "[]"])
def test_unreadable_stamps_mean_everything_is_hashed(tmp_path, text):
    (tmp_path / "stamps.json").write_text(text)
    file = tmp_path / "f"
    file.write_bytes(b"f")
    stamps = Stamps.read(tmp_path / "stamps.json")
    assert stamps.known == {} and stamps.sha256(file) == sha(file)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-large"])
def test_stamps_that_are_no_regular_file_or_too_large_are_not_read(tmp_path, kind):
    """A FIFO would block the read, /dev/zero would never end it: neither is read, nor a file past the limit."""
    path = tmp_path / "stamps.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_text(json.dumps({"format": 1, "files": []}) + " " * stamps_module.STAMPS_MAX_BYTES)
    assert within(30, lambda: Stamps.read(path)).known == {}


def test_missing_stamps_mean_everything_is_hashed(tmp_path):
    assert Stamps.read(tmp_path / "none.json").known == {}


def test_identity_names_device_inode_size_and_both_times(tmp_path):
    file = tmp_path / "f"
    file.write_bytes(b"abc")
    st = file.stat()
    assert identity(file) == (st.st_dev, st.st_ino, 3, st.st_mtime_ns, st.st_ctime_ns)
