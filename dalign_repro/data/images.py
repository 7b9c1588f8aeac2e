"""Image sets for the ResNet-20 width chapter, all as uint8 tensors ``(n, 3, 32, 32)``.

:func:`load_images` returns an :class:`ImageData` for one of:

* ``"cifar10"``, ``"cifar100"``: the paper's sets (Krizhevsky, 2009), 50,000 train and
  10,000 test 32x32 colour images, 10 classes or 100 fine classes; for research use with
  citation, not redistributed here.  The python archives (manifests
  ``data_manifests/cifar10.yaml``, ``cifar100.yaml``) are checked by sha256, size and the
  md5 torchvision records, before anything is read; the pickled batches are then read
  straight out of the tar.gz, never extracted.  With network the archive is downloaded
  from the location torchvision's ``CIFAR10``/``CIFAR100`` class names.
* ``"fashion-mnist"``: the cpu profile's offline default, standing in for CIFAR-10
  (Xiao et al., 2017, MIT licence): 60,000 train and 10,000 test 28x28 grayscale images
  of clothing, 10 classes, in four idx files (``train-images-idx3-ubyte.gz`` ...).  They
  come from the Debian package ``dataset-fashion-mnist`` (manifest
  ``data_manifests/fashion_mnist.yaml``; ``apt-get download`` needs no root), unpacked
  here in Python, or, with network, from torchvision's ``FashionMNIST`` files.  Each file
  is checked on every load by the sha256 and size of its decompressed bytes, which are
  the same whichever source gzipped them.
* ``"synthetic"``: the smoke profile's set, 2,000 train and 600 test 28x28 images in
  10 classes (oriented stripes, two periods, under a shifted Gaussian window, plus
  noise), generated from a fixed seed, written once as idx files into the cache and
  read back by the same reader as Fashion-MNIST.  A small ResNet learns it in tens of steps.

28x28 sets are zero-padded by 2 pixels on each side to 32x32 and repeated to 3
channels, so every set feeds the same CIFAR ResNet.  Files are looked for in ``root``
when given, else in the cache (:func:`~dalign_repro.data.manifest.default_cache_dir`);
whatever is obtained is put there, each file under a temporary name and renamed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dalign_core.environment import env_flag
from dalign_core.atomic import atomic_write_bytes
from dalign_repro.data.manifest import (
    ChecksumError,
    DataMissingError,
    check_reachable,
    default_cache_dir,
    fetch,
    load_manifest,
    sha256_file,
    verify_file,
)

__all__ = ["IMAGE_SETS", "ImageFormatError", "ImageData", "load_images", "read_idx", "write_idx", "pad_to_rgb32"]

IMAGE_SETS = ("fashion-mnist", "cifar10", "cifar100", "synthetic")
IDX_FILES = {  # ImageData field -> idx file name, in the layout of the MNIST family
    "train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}
DEBIAN_INSTALL_DIR = Path("/usr/share/datasets/fashion-mnist")  # where `apt install` puts them
SYNTHETIC = dict(n_train=2000, n_test=600, num_classes=10, seed=20240611, version=1)


class ImageFormatError(ValueError):
    """A file passed its checks but is not in the expected format (idx header, CIFAR batch layout, .deb)."""


@dataclass
class ImageData:
    """An image classification set; images are uint8 ``(n, 3, 32, 32)``, labels int64 ``(n,)``.

    ``mean`` and ``std`` are per-channel statistics of the train images scaled to [0, 1]
    (padding included, as the model sees them); ``summary`` holds JSON-ready provenance.
    """

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    summary: dict


def read_idx(path: str | os.PathLike, *, ndim: int, sha256: str | None = None,
             size: int | None = None) -> torch.Tensor:
    """Read an idx file of unsigned bytes (gzipped when the name ends in .gz) into a uint8 tensor.

    ``ndim`` is 3 for images ``(n, rows, cols)``, 1 for labels ``(n,)``.  When ``sha256``
    and ``size`` are given, the decompressed bytes are checked against them first.

    Raises:
        ChecksumError: the decompressed bytes differ from ``sha256`` or ``size``.
        ImageFormatError: wrong magic number, element type, rank, or length for its header.
    """
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ImageFormatError(f"{path}: not a readable gzip file ({err}); delete it and fetch it again") from err
    if size is not None and len(raw) != size:
        raise ChecksumError(f"{path}: decompressed to {len(raw)} bytes, the manifest expects {size}; "
                            "delete it and fetch it again")
    if sha256 is not None and (digest := hashlib.sha256(raw).hexdigest()) != sha256:
        raise ChecksumError(f"{path}: decompressed sha256 {digest}, the manifest expects {sha256}; "
                            "the file is corrupt or a different version: delete it and fetch it again")
    # Header: two zero bytes, type code 0x08 (unsigned byte), rank, then rank big-endian int32 sizes.
    if len(raw) < 4 or raw[0:2] != b"\0\0" or raw[2] != 0x08 or raw[3] != ndim:
        raise ImageFormatError(f"{path}: magic number {raw[:4].hex() or 'missing'} is not that of an idx file "
                             f"of unsigned bytes with {ndim} dimension(s) (expected 000008{ndim:02x})")
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != header + int(np.prod(dims)):
        raise ImageFormatError(f"{path}: header says shape {dims} ({header + int(np.prod(dims))} bytes) "
                             f"but the file holds {len(raw)} bytes: truncated or corrupt")
    return torch.frombuffer(bytearray(memoryview(raw)[header:]), dtype=torch.uint8).reshape(dims)


def write_idx(path: str | os.PathLike, array: np.ndarray | torch.Tensor) -> Path:
    """Write a uint8 array as a gzipped idx file, atomically and byte-for-byte reproducibly."""
    array = np.ascontiguousarray(np.asarray(array, dtype=np.uint8))
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return atomic_write_bytes(path, gzip.compress(header + array.tobytes(), mtime=0))


def pad_to_rgb32(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``(n, 28, 28)`` -> ``(n, 3, 32, 32)``: 2 zero pixels each side, gray repeated to 3 channels."""
    if images.ndim != 3 or tuple(images.shape[1:]) != (28, 28):
        raise ValueError(f"expected images of shape (n, 28, 28), got {tuple(images.shape)}")
    out = torch.zeros((images.shape[0], 3, 32, 32), dtype=torch.uint8)
    out[:, :, 2:30, 2:30] = images.unsqueeze(1)
    return out


def _channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 ``(n, c, h, w)`` images scaled to [0, 1].

    From each channel's histogram of the 256 byte values: exact, and quick on 60,000 images.
    """
    counts = torch.stack([torch.bincount(images[:, c].flatten(), minlength=256) for c in range(images.shape[1])])
    values = torch.arange(256, dtype=torch.float64) / 255.0
    counts = counts.to(torch.float64)
    mean = (counts * values).sum(1) / counts.sum(1)
    std = ((counts * values.square()).sum(1) / counts.sum(1) - mean.square()).clamp_min(0).sqrt()
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def _from_idx_folder(name: str, folder: Path, checks: dict, num_classes: int, summary: dict) -> ImageData:
    """Read the four idx files in ``folder`` (checked against ``checks[filename]`` when present)."""
    tensors, files = {}, {}
    for field, filename in IDX_FILES.items():
        spec = checks.get(filename, {})
        raw = read_idx(folder / filename, ndim=3 if field.endswith("images") else 1,
                       sha256=spec.get("idx_sha256"), size=spec.get("idx_size"))
        tensors[field] = pad_to_rgb32(raw) if field.endswith("images") else raw.to(torch.int64)
        files[filename] = ({"idx_sha256": spec["idx_sha256"], "idx_size": spec["idx_size"], "verified": True}
                           if spec else {"gz_sha256": sha256_file(folder / filename), "verified": False})
    for split in ("train", "test"):
        images, labels = tensors[f"{split}_images"], tensors[f"{split}_labels"]
        if len(images) != len(labels) or (len(labels) and int(labels.max()) >= num_classes):
            raise ImageFormatError(f"{folder}: {split} has {len(images)} images and {len(labels)} labels "
                                 f"(labels must number the images and lie below {num_classes})")
    mean, std = _channel_stats(tensors["train_images"])
    summary = {"name": name, "location": str(folder), "files": files, **summary,
               "n_train": len(tensors["train_labels"]), "n_test": len(tensors["test_labels"]),
               "num_classes": num_classes, "image_shape": [3, 32, 32], "mean": mean, "std": std,
               "preprocessing": "28x28 zero-padded by 2 pixels each side to 32x32, gray repeated to 3 channels"}
    return ImageData(name, num_classes=num_classes, mean=mean, std=std, summary=summary, **tensors)


def _deb_members(deb: Path, member_dir: str, names: list[str]) -> dict[str, bytes]:
    """Read files ``member_dir/<name>`` out of a Debian package (an ar archive holding data.tar.*)."""
    with open(deb, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise ImageFormatError(f"{deb}: not a Debian package (no ar archive header)")
        while len(header := fh.read(60)) == 60:
            entry, length = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58])
            if entry.startswith("data.tar"):
                data = fh.read(length)
                break
            fh.seek(length + length % 2, os.SEEK_CUR)  # ar pads members to even offsets
        else:
            raise ImageFormatError(f"{deb}: no data.tar member")
    wanted = {f"{member_dir.strip('/')}/{n}": n for n in names}
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar:
            key = member.name.removeprefix("./")
            if key in wanted and member.isfile():
                found[wanted[key]] = tar.extractfile(member).read()
    if missing := sorted(set(names) - set(found)):
        raise ImageFormatError(f"{deb}: has no {missing} under {member_dir}")
    return found


def _install_idx(target: Path, files: dict[str, bytes], checks: dict, origin: str) -> None:
    """Check each gzipped idx file's decompressed bytes, then write it into ``target`` atomically."""
    for filename, gz in files.items():
        raw, spec = gzip.decompress(gz), checks[filename]
        if len(raw) != spec["idx_size"] or hashlib.sha256(raw).hexdigest() != spec["idx_sha256"]:
            raise ChecksumError(f"{filename} from {origin} differs from data_manifests/fashion_mnist.yaml "
                                "(decompressed sha256 or size); nothing was written")
    for filename, gz in files.items():
        atomic_write_bytes(target / filename, gz)


def _torchvision_fashion(timeout: float = 60.0) -> dict[str, bytes]:
    """Download the four gz files from torchvision's FashionMNIST mirrors, checking torchvision's md5s."""
    from torchvision.datasets import FashionMNIST

    got = {}
    for filename, md5 in FashionMNIST.resources:
        url = FashionMNIST.mirrors[0] + filename
        check_reachable(url, 10.0)
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            got[filename] = resp.read()
        if hashlib.md5(got[filename]).hexdigest() != md5:
            raise ChecksumError(f"{url}: md5 differs from torchvision's FashionMNIST.resources")
    return got


def _fashion_mnist(root: Path | None, offline: bool) -> ImageData:
    manifest = load_manifest("fashion_mnist")
    checks, base = manifest.extra["files"], root if root is not None else default_cache_dir()
    target = base / "fashion-mnist"
    folders = [target, base, base / "FashionMNIST" / "raw"] if root is not None else [target, DEBIAN_INSTALL_DIR]
    summary = {"license": " ".join(manifest.license.split()),
               "stands_in_for": " ".join(str(manifest.extra["stands_in_for"]).split())}
    for folder in folders:
        if all((folder / f).is_file() for f in checks):
            return _from_idx_folder("fashion-mnist", folder, checks, 10, summary)
    failures = []
    base.mkdir(parents=True, exist_ok=True)
    try:  # a .deb already in the folder, else the manifest's sources (data/<deb>, apt-get download)
        with tempfile.TemporaryDirectory(prefix=".deb-", dir=base) as tmp:
            deb = base / manifest.filename
            deb = verify_file(deb, manifest) if deb.is_file() else fetch(manifest, tmp, offline=offline)
            _install_idx(target, _deb_members(deb, manifest.extra["deb_member_dir"], list(checks)),
                         checks, deb.name)
        summary["package"] = {"file": manifest.filename, "sha256": manifest.sha256, "size": manifest.size}
        return _from_idx_folder("fashion-mnist", target, checks, 10, summary)
    except DataMissingError as err:  # keep its list of sources tried, not its advice about the temp folder
        failures += [line.strip() for line in str(err).splitlines() if line.startswith("  ")]
    if not offline:
        try:
            _install_idx(target, _torchvision_fashion(), checks, "torchvision's FashionMNIST files")
            return _from_idx_folder("fashion-mnist", target, checks, 10, summary)
        except OSError as err:
            failures.append(f"torchvision FashionMNIST download: {err}")
    raise DataMissingError(
        f"Fashion-MNIST is missing: the four idx files {sorted(checks)} are in none of "
        f"{[str(f) for f in folders]}, and nothing could provide them{' (offline)' if offline else ''}.\n"
        f"{manifest.how_to_get.strip()}\nThe Debian package is {manifest.filename} ({manifest.size:,} bytes); "
        f"put it into {base} to use it without network.\nTried: " + "; ".join(failures))


def _cifar(name: str, root: Path | None, offline: bool) -> ImageData:
    manifest = load_manifest(name)
    archive = fetch(manifest, root if root is not None else default_cache_dir(), offline=offline)
    spec = manifest.extra
    folder, label_key, num_classes = spec["archive_dir"], spec["label_key"].encode(), int(spec["num_classes"])
    wanted = {f"{folder}/{m}" for m in spec["train_members"] + spec["test_members"]}
    found: dict[str, bytes] = {}
    with tarfile.open(archive, "r|gz") as tar:  # one streaming pass; the archive is never extracted
        for member in tar:
            if member.name in wanted and member.isfile():
                found[member.name] = tar.extractfile(member).read()
    if missing := sorted(wanted - set(found)):
        raise ImageFormatError(f"{archive}: lacks {missing}; it is not the {name} python archive")
    tensors = {}
    for split in ("train", "test"):
        images, labels = [], []
        for member in spec[f"{split}_members"]:
            # Safe to unpickle: the archive's sha256 and md5 matched the manifest above.
            batch = pickle.loads(found.pop(f"{folder}/{member}"), encoding="bytes")
            data, batch_labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key], dtype=np.int64)
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(batch_labels) != len(data):
                raise ImageFormatError(f"{archive}: {member} holds data {data.dtype} {data.shape} and "
                                     f"{len(batch_labels)} labels, not uint8 (n, 3072) with n labels")
            images.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
            labels.append(torch.from_numpy(batch_labels))
        tensors[f"{split}_images"], tensors[f"{split}_labels"] = torch.cat(images), torch.cat(labels)
        if int(tensors[f"{split}_labels"].max()) >= num_classes or int(tensors[f"{split}_labels"].min()) < 0:
            raise ImageFormatError(f"{archive}: {split} labels outside 0..{num_classes - 1}")
    mean, std = _channel_stats(tensors["train_images"])
    summary = {"name": name, "location": str(archive), "license": " ".join(manifest.license.split()),
               "files": {manifest.filename: {"sha256": manifest.sha256, "md5": manifest.md5,
                                             "size": manifest.size, "verified": True}},
               "labels": label_key.decode(), "n_train": len(tensors["train_labels"]),
               "n_test": len(tensors["test_labels"]), "num_classes": num_classes,
               "image_shape": [3, 32, 32], "mean": mean, "std": std, "preprocessing": "none"}
    return ImageData(name, num_classes=num_classes, mean=mean, std=std, summary=summary, **tensors)


def _synthetic_images(n: int, rng: np.random.Generator, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 uint8 images and their labels: class k is stripes at angle (k mod 5) * 36 degrees,
    period 4 px (k < 5) or 8 px (k >= 5), random phase, under a Gaussian window at a random
    centre, plus pixel noise, so the class is a local texture a convolution picks up fast."""
    labels = rng.permutation(np.arange(n) % num_classes)
    angle = (labels % 5) * np.pi / 5 + rng.normal(0, 0.08, n)
    period = np.where(labels < 5, 4.0, 8.0) * rng.uniform(0.9, 1.1, n)
    phase, centre = rng.uniform(0, 2 * np.pi, n), rng.uniform(-6, 6, (n, 2))
    y, x = np.mgrid[0:28, 0:28] - 13.5
    along = x * np.cos(angle)[:, None, None] + y * np.sin(angle)[:, None, None]
    stripes = 0.5 + 0.35 * np.cos(2 * np.pi * along / period[:, None, None] + phase[:, None, None])
    window = np.exp(-((y - centre[:, 0, None, None]) ** 2 + (x - centre[:, 1, None, None]) ** 2) / 162.0)
    images = stripes * window + rng.normal(0, 0.15, (n, 28, 28))
    return np.clip(np.rint(images * 255), 0, 255).astype(np.uint8), labels.astype(np.uint8)


def _synthetic(root: Path | None) -> ImageData:
    folder = (root if root is not None else default_cache_dir()) / f"synthetic-v{SYNTHETIC['version']}"
    if not all((folder / f).is_file() for f in IDX_FILES.values()):
        rng = np.random.default_rng(SYNTHETIC["seed"])  # train first, then test, from one stream
        for split in ("train", "test"):
            images, labels = _synthetic_images(SYNTHETIC[f"n_{split}"], rng, SYNTHETIC["num_classes"])
            write_idx(folder / IDX_FILES[f"{split}_images"], images)
            write_idx(folder / IDX_FILES[f"{split}_labels"], labels)
    summary = {"license": "generated here; no terms", "generator": dict(SYNTHETIC),
               "description": "oriented stripes (5 angles x 2 periods) under a shifted Gaussian window, plus noise"}
    return _from_idx_folder("synthetic", folder, {}, SYNTHETIC["num_classes"], summary)


def load_images(name: str, *, root: str | os.PathLike | None = None, offline: bool | None = None) -> ImageData:
    """Load an image set (``"fashion-mnist"``, ``"cifar10"``, ``"cifar100"`` or ``"synthetic"``), verified.

    Args:
        name: which set; see the module docstring for sources and licences.
        root: a folder holding the set's files (CIFAR archive, Fashion-MNIST idx files or
            its .deb), used instead of the cache; what is obtained is put there.
        offline: never use the network; default from ``$DALIGN_OFFLINE``.

    Returns:
        :class:`ImageData` with uint8 images ``(n, 3, 32, 32)`` and int64 labels ``(n,)``.

    Raises:
        ChecksumError: a file differs from its manifest; nothing is read from it.
        DataMissingError: the files are absent and no source could provide them; the
            message names the file, its size and where to put it.
        ImageFormatError: a file passed its checksum but is not in the expected format.
    """
    if name not in IMAGE_SETS:
        raise ValueError(f"unknown image set {name!r}; choose one of {', '.join(IMAGE_SETS)}")
    root = Path(root).expanduser() if root is not None else None
    offline = env_flag("DALIGN_OFFLINE") if offline is None else offline
    if name == "synthetic":
        return _synthetic(root)
    if name == "fashion-mnist":
        return _fashion_mnist(root, offline)
    return _cifar(name, root, offline)
