"""Image sets: the idx reader and padding, CIFAR archives, Fashion-MNIST from a .deb, the synthetic set.

Everything is offline: tiny idx files, a tiny CIFAR-format tar.gz and a tiny Debian package
are built in tmp_path, and the manifests are pointed at them.  One test reads the real
Fashion-MNIST when it is in the cache (``make data PROFILE=cpu``) and is skipped otherwise.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import lzma
import pickle
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dalign_repro.config import PROFILES, REPO_ROOT
from dalign_repro.data import images
from dalign_repro.data.images import IDX_FILES, ImageFormatError, load_images, pad_to_rgb32, read_idx, write_idx
from dalign_repro.data.manifest import (
    ChecksumError,
    DataMissingError,
    Manifest,
    default_cache_dir,
    fetch,
    load_manifest,
    sha256_file,
    verify_file,
)


def _idx_bytes(array: np.ndarray) -> bytes:
    """An idx file written by hand (not by write_idx), so the reader is checked against the format itself."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _tiny_mnist(folder: Path, n_train: int = 12, n_test: int = 5) -> dict:
    """Four gzipped idx files in ``folder``; returns the manifest ``files`` checks for them."""
    rng = np.random.default_rng(0)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28)), "train_labels": np.arange(n_train) % 10,
              "test_images": rng.integers(0, 256, (n_test, 28, 28)), "test_labels": np.arange(n_test) % 10}
    folder.mkdir(parents=True, exist_ok=True)
    checks = {}
    for field, filename in IDX_FILES.items():
        raw = _idx_bytes(arrays[field])
        (folder / filename).write_bytes(gzip.compress(raw))
        checks[filename] = {"idx_sha256": hashlib.sha256(raw).hexdigest(), "idx_size": len(raw)}
    return checks


def _patch_manifest(monkeypatch, **manifests: Manifest):
    real = images.load_manifest
    monkeypatch.setattr(images, "load_manifest", lambda name: manifests.get(name) or real(name))


# ---------------------------------------------------------------- idx reader and padding


def test_read_idx_and_padding(tmp_path):
    images_array = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 251
    (tmp_path / "img.gz").write_bytes(gzip.compress(_idx_bytes(images_array)))
    (tmp_path / "lab").write_bytes(_idx_bytes(np.array([7, 0, 9])))  # an uncompressed idx file reads too
    x = read_idx(tmp_path / "img.gz", ndim=3)
    assert x.dtype == torch.uint8 and x.shape == (3, 28, 28) and np.array_equal(x.numpy(), images_array)
    assert read_idx(tmp_path / "lab", ndim=1).tolist() == [7, 0, 9]
    padded = pad_to_rgb32(x)
    assert padded.shape == (3, 3, 32, 32) and padded.dtype == torch.uint8
    assert torch.equal(padded[:, 0, 2:30, 2:30], x) and torch.equal(padded[:, 0], padded[:, 2])
    border = padded.clone()
    border[:, :, 2:30, 2:30] = 0
    assert int(border.sum()) == 0
    # write_idx gives the same bytes (gzip mtime 0: reproducible), and the reader round-trips it
    write_idx(tmp_path / "again.gz", images_array)
    assert gzip.decompress((tmp_path / "again.gz").read_bytes()) == _idx_bytes(images_array)
    assert (tmp_path / "again.gz").read_bytes() == write_idx(tmp_path / "twice.gz", images_array).read_bytes()


def test_read_idx_rejects_bad_files(tmp_path):
    good = _idx_bytes(np.zeros((2, 28, 28)))
    cases = {"magic.gz": b"\x00\x00\x0d\x03" + good[4:],   # float type code, not unsigned bytes
             "rank.gz": _idx_bytes(np.zeros(5)),            # labels where images are expected
             "short.gz": good[:-10],                        # truncated
             "empty.gz": b""}
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(gzip.compress(raw))
        with pytest.raises(ImageFormatError) as info:
            read_idx(tmp_path / name, ndim=3)
        assert str(tmp_path / name) in str(info.value)
    assert "magic number 00000d03" in str(pytest.raises(ImageFormatError, read_idx, tmp_path / "magic.gz", ndim=3).value)
    assert "truncated" in str(pytest.raises(ImageFormatError, read_idx, tmp_path / "short.gz", ndim=3).value)
    (tmp_path / "notgz.gz").write_bytes(b"this is not gzip")
    assert "gzip" in str(pytest.raises(ImageFormatError, read_idx, tmp_path / "notgz.gz", ndim=3).value)
    (tmp_path / "ok.gz").write_bytes(gzip.compress(good))
    with pytest.raises(ChecksumError, match="decompressed sha256"):
        read_idx(tmp_path / "ok.gz", ndim=3, sha256="0" * 64, size=len(good))


# ---------------------------------------------------------------- CIFAR


def _tiny_cifar(root: Path, *, hundred: bool = False, n: int = 4) -> Path:
    """A tar.gz in the layout and pickle format of cifar-10/100-python, ``n`` images per batch."""
    rng = np.random.default_rng(1)
    folder, archive = ("cifar-100-python", "cifar-100-python.tar.gz") if hundred else \
        ("cifar-10-batches-py", "cifar-10-python.tar.gz")
    members = {}
    batches = ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for index, batch in enumerate(batches):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        data[:, 0], data[:, 1024], data[:, 2048] = index, 100 + index, 200 + index  # R, G, B of pixel (0, 0)
        content = {b"batch_label": batch.encode(), b"data": data, b"filenames": [b"x.png"] * n}
        if hundred:
            content.update({b"fine_labels": [99 - i for i in range(n)], b"coarse_labels": [0] * n})
        else:
            content[b"labels"] = [(index + i) % 10 for i in range(n)]
        members[f"{folder}/{batch}"] = pickle.dumps(content, protocol=2)
    meta = {b"fine_label_names": [b"c"] * 100} if hundred else {b"label_names": [b"c"] * 10}
    members[f"{folder}/{'meta' if hundred else 'batches.meta'}"] = pickle.dumps(meta, protocol=2)
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / archive, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return root / archive


def _manifest_for(name: str, archive: Path, **overrides) -> Manifest:
    real = load_manifest(name)
    fields = dict(sha256=sha256_file(archive), size=archive.stat().st_size,
                  md5=hashlib.md5(archive.read_bytes()).hexdigest(), sources=())
    fields.update(overrides)
    return replace(real, **fields)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_archive_in_root_loads_offline(tmp_path, monkeypatch, name):
    archive = _tiny_cifar(tmp_path / "root", hundred=name == "cifar100")
    _patch_manifest(monkeypatch, **{name: _manifest_for(name, archive)})
    data = load_images(name, root=tmp_path / "root", offline=True)
    n_train = 4 if name == "cifar100" else 20
    assert data.train_images.shape == (n_train, 3, 32, 32) and data.test_images.shape == (4, 3, 32, 32)
    assert data.train_images.dtype == torch.uint8 and data.train_labels.dtype == torch.int64
    assert data.train_images[0, :, 0, 0].tolist() == [0, 100, 200]  # channel-major rows, as CIFAR stores them
    assert data.test_images[0, :, 0, 0].tolist() == ([1, 101, 201] if name == "cifar100" else [5, 105, 205])
    if name == "cifar100":  # fine labels, not coarse
        assert data.num_classes == 100 and data.train_labels.tolist() == [99, 98, 97, 96]
    else:
        assert data.num_classes == 10 and data.train_labels[:4].tolist() == [0, 1, 2, 3]
    assert data.summary["files"][archive.name]["md5"] == hashlib.md5(archive.read_bytes()).hexdigest()
    assert len(data.mean) == 3 and all(0 < s < 1 for s in data.std)
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == [archive.name]  # nothing extracted


def test_cifar_checksum_mismatch_stops_before_reading(tmp_path, monkeypatch):
    archive = _tiny_cifar(tmp_path / "root")
    _patch_manifest(monkeypatch, cifar10=_manifest_for("cifar10", archive, md5="0" * 32))
    with pytest.raises(ChecksumError, match="md5") as info:
        load_images("cifar10", root=tmp_path / "root", offline=True)
    assert str(archive) in str(info.value) and "Delete it and fetch it again" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == [archive.name]  # nothing extracted or half-written


def test_cifar_missing_offline_says_what_and_where(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_OFFLINE", "1")  # offline=None reads it
    for name, filename, size in (("cifar10", "cifar-10-python.tar.gz", "170498071"),
                                 ("cifar100", "cifar-100-python.tar.gz", "169001437")):
        with pytest.raises(DataMissingError) as info:
            load_images(name, root=tmp_path)
        message = str(info.value)
        assert filename in message and size in message and str(tmp_path / filename) in message
        assert f"torchvision {name.upper()}: skipped (offline)" in message


# ---------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_checks_files_against_manifest(tmp_path, monkeypatch):
    checks = _tiny_mnist(tmp_path / "fashion-mnist")
    # The real manifest's checksums reject the tiny files: never proceeds.
    with pytest.raises(ChecksumError, match="delete it and fetch it again"):
        load_images("fashion-mnist", root=tmp_path, offline=True)
    real = load_manifest("fashion_mnist")
    _patch_manifest(monkeypatch, fashion_mnist=replace(real, extra={**real.extra, "files": checks}))
    data = load_images("fashion-mnist", root=tmp_path, offline=True)
    assert data.train_images.shape == (12, 3, 32, 32) and data.test_labels.dtype == torch.int64
    assert data.summary["stands_in_for"].startswith("CIFAR-10") and data.summary["license"].startswith("MIT")
    assert all(entry["verified"] for entry in data.summary["files"].values())


def _fake_deb(path: Path, member_dir: str, files: dict[str, bytes]) -> Path:
    """A Debian package in miniature: an ar archive of debian-binary, control.tar.xz and data.tar.xz."""
    def tar_xz(entries: dict[str, bytes]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, payload in entries.items():
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        return lzma.compress(buffer.getvalue())

    members = {"debian-binary": b"2.0\n", "control.tar.xz": tar_xz({"./control": b"Package: fake\n"}),
               "data.tar.xz": tar_xz({f"./{member_dir}/{n}": b for n, b in files.items()})}
    out = bytearray(b"!<arch>\n")
    for name, payload in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(payload):<10}`\n".encode() + payload
        out += b"\n" if len(payload) % 2 else b""
    path.write_bytes(bytes(out))
    return path


def test_fashion_mnist_from_a_deb_in_root(tmp_path, monkeypatch):
    checks = _tiny_mnist(tmp_path / "made")
    gz = {f: (tmp_path / "made" / f).read_bytes() for f in checks}
    real = load_manifest("fashion_mnist")
    root = tmp_path / "root"
    root.mkdir()
    deb = _fake_deb(root / real.filename, real.extra["deb_member_dir"], gz)
    fake = replace(real, sha256=sha256_file(deb), size=deb.stat().st_size, sources=(),
                   extra={**real.extra, "files": checks})
    bad = {**checks, "t10k-labels-idx1-ubyte.gz": {"idx_sha256": "0" * 64, "idx_size": 1}}
    _patch_manifest(monkeypatch, fashion_mnist=replace(fake, extra={**fake.extra, "files": bad}))
    with pytest.raises(ChecksumError, match="nothing was written"):
        load_images("fashion-mnist", root=root, offline=True)
    assert not any((root / "fashion-mnist").glob("*")) and sorted(p.name for p in root.iterdir()) \
        in ([real.filename], [real.filename, "fashion-mnist"])
    _patch_manifest(monkeypatch, fashion_mnist=fake)
    data = load_images("fashion-mnist", root=root, offline=True)
    assert data.train_images.shape == (12, 3, 32, 32) and data.summary["package"]["sha256"] == fake.sha256
    assert {p.name: p.read_bytes() for p in (root / "fashion-mnist").iterdir()} == gz


def test_fashion_mnist_missing_offline(tmp_path, monkeypatch):
    real = load_manifest("fashion_mnist")
    _patch_manifest(monkeypatch, fashion_mnist=replace(real, sources=real.sources[1:]))  # the apt-get source only
    with pytest.raises(DataMissingError) as info:
        load_images("fashion-mnist", root=tmp_path, offline=True)
    message = str(info.value)
    assert real.filename in message and "30,900,652 bytes" in message and str(tmp_path) in message
    assert "train-images-idx3-ubyte.gz" in message and "skipped (offline)" in message
    assert not any(p.name.startswith(".deb-") for p in tmp_path.iterdir())  # the temp folder is gone


def test_real_fashion_mnist_if_cached():
    folder = default_cache_dir() / "fashion-mnist"
    if not all((folder / f).is_file() for f in IDX_FILES.values()):
        pytest.skip(f"Fashion-MNIST is not in {folder}; `make data PROFILE=cpu` puts it there")
    data = load_images("fashion-mnist", offline=True)
    assert data.train_images.shape == (60000, 3, 32, 32) and data.test_images.shape == (10000, 3, 32, 32)
    assert torch.bincount(data.train_labels).tolist() == [6000] * 10
    assert torch.bincount(data.test_labels).tolist() == [1000] * 10
    # Fashion-MNIST's pixel mean is 0.286 on 28x28; zero padding to 32x32 scales it by 784/1024.
    assert data.mean == pytest.approx((0.2860 * 784 / 1024,) * 3, abs=1e-3)
    assert data.std[0] == pytest.approx(0.3318, abs=1e-3)


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_read_through_idx(tmp_path):
    a = load_images("synthetic", root=tmp_path / "a")
    b = load_images("synthetic", root=tmp_path / "b")
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert a.train_images.shape == (2000, 3, 32, 32) and a.test_images.shape == (600, 3, 32, 32)
    assert torch.bincount(a.train_labels).tolist() == [200] * 10 and a.num_classes == 10
    folder = tmp_path / "a" / "synthetic-v1"
    assert a.summary["location"] == str(folder)
    for filename in IDX_FILES.values():  # the same files, byte for byte
        assert (folder / filename).read_bytes() == (tmp_path / "b" / "synthetic-v1" / filename).read_bytes()
    assert torch.equal(read_idx(folder / IDX_FILES["train_images"], ndim=3), a.train_images[:, 0, 2:30, 2:30])
    assert not list(folder.glob(".*"))  # no temporary files left
    again = load_images("synthetic", root=tmp_path / "a")  # read back, not regenerated
    assert torch.equal(again.test_images, a.test_images)


def test_synthetic_is_learnable_in_a_few_steps(tmp_path):
    data = load_images("synthetic", root=tmp_path)
    mean, std = torch.tensor(data.mean).view(1, 3, 1, 1), torch.tensor(data.std).view(1, 3, 1, 1)
    x_train = (data.train_images.float() / 255 - mean) / std
    x_test = (data.test_images.float() / 255 - mean) / std
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 5, padding=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        batch = torch.randint(0, len(x_train), (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x_train[batch]), data.train_labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == data.test_labels).float().mean().item()
    assert accuracy > 0.3, f"accuracy {accuracy:.2f} after 30 steps; chance is 0.10"


# ---------------------------------------------------------------- manifests and the fetch script


def test_image_manifests_agree_with_torchvision():
    from torchvision.datasets import CIFAR10, CIFAR100, FashionMNIST

    for name, cls, size in (("cifar10", CIFAR10, 170498071), ("cifar100", CIFAR100, 169001437)):
        m = load_manifest(name)
        assert (m.filename, m.md5, m.size) == (cls.filename, cls.tgz_md5, size)
        assert m.extra["archive_dir"] == cls.base_folder
        assert [s.kind for s in m.sources] == ["path", "torchvision"]
    m = load_manifest("fashion_mnist")
    assert {f: spec["upstream_gz_md5"] for f, spec in m.extra["files"].items()} == dict(FashionMNIST.resources)
    assert m.sha256 == "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0" and m.size == 30900652
    assert [s.kind for s in m.sources] == ["path", "deb"]


def test_manifest_md5_and_new_source_kinds(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"some bytes")
    base = dict(name="blob", filename="blob.bin", sha256=sha256_file(f), size=f.stat().st_size)
    assert verify_file(f, Manifest(**base, md5=hashlib.md5(b"some bytes").hexdigest())) == f
    with pytest.raises(ChecksumError, match="has md5"):
        verify_file(f, Manifest(**base, md5="f" * 32))
    with pytest.raises(ValueError, match="md5 must be 32 hex digits"):
        Manifest(**base, md5="xyz")
    m = Manifest.from_dict({**base, "md5": "A" * 32, "sources": [{"deb": "pkg=1.0"}, {"torchvision": "CIFAR10"}]})
    assert m.md5 == "a" * 32 and [s.kind for s in m.sources] == ["deb", "torchvision"] and "md5" not in m.extra
    with pytest.raises(DataMissingError) as info:
        fetch(m, tmp_path / "cache", offline=True)
    assert "deb pkg=1.0: skipped (offline)" in str(info.value) and "apt-get download pkg=1.0" in str(info.value)
    assert "torchvision CIFAR10: skipped (offline)" in str(info.value)


def test_fetch_script_covers_every_profile():
    spec = importlib.util.spec_from_file_location("fetch_data", REPO_ROOT / "scripts" / "fetch_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.NEEDS) == set(PROFILES)
    assert "synthetic" in module.NEEDS["smoke"] and "fashion-mnist" in module.NEEDS["cpu"]
    assert {"cifar10", "cifar100"} <= set(module.NEEDS["gpu"]) and module.NEEDS["paper"] == module.NEEDS["gpu"]
