"""Fetch and verify the data a profile needs, one line per data set (``make data PROFILE=...``).

    smoke       the synthetic image set and the Shakespeare corpus
    cpu         the Shakespeare corpus and Fashion-MNIST
    gpu, paper  also CIFAR-10 and CIFAR-100 (network, or the archives in --root)

Usage: python scripts/fetch_data.py --profile cpu [--root DIR] [--offline]
Exit status 1 when any set could not be provided; the messages say how to get it.
"""

from __future__ import annotations

import argparse
import sys

from dalign_repro.config import PROFILES
from dalign_repro.data.images import load_images
from dalign_repro.data.manifest import ChecksumError, DataMissingError, fetch, load_manifest

NEEDS = {
    "smoke": ("synthetic", "shakespeare"),
    "lab": ("shakespeare", "fashion-mnist"),
    "cpu": ("shakespeare", "fashion-mnist"),
    "gpu": ("shakespeare", "fashion-mnist", "cifar10", "cifar100"),
    "paper": ("shakespeare", "fashion-mnist", "cifar10", "cifar100"),
}


def fetch_one(name: str, root: str | None, offline: bool | None) -> str:
    """Obtain and verify one data set; return the line that reports it."""
    if name == "shakespeare":
        manifest = load_manifest("shakespeare")
        path = fetch(manifest, offline=offline)
        return f"{name:14s} {path}  (sha256 {manifest.sha256[:12]}…, {manifest.size:,} bytes: verified)"
    data = load_images(name, root=root, offline=offline)
    checks = "checked on every load" if name == "synthetic" else "verified"
    return (f"{name:14s} {data.summary['location']}  ({len(data.train_labels):,} train + "
            f"{len(data.test_labels):,} test images, {data.num_classes} classes: {checks})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=PROFILES, default="cpu")
    parser.add_argument("--root", default=None,
                        help="folder with image files you already have "
                             "(CIFAR archives, Fashion-MNIST idx files or its .deb)")
    parser.add_argument("--offline", action="store_true", default=None, help="never use the network")
    args = parser.parse_args(argv)
    failed = []
    for name in NEEDS[args.profile]:
        try:
            print(fetch_one(name, args.root, args.offline), flush=True)
        except (DataMissingError, ChecksumError) as err:
            failed.append(name)
            print(f"{name:14s} FAILED: {err}", file=sys.stderr, flush=True)
    if failed:
        print(f"profile {args.profile}: could not provide {', '.join(failed)} (see above)", file=sys.stderr)
        return 1
    print(f"profile {args.profile}: all data present and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
