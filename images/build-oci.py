#!/usr/bin/env python3
"""Build a small single-layer OCI image layout, deterministically.

Python 3 standard library only. The same inputs always give the same bytes (fixed mtimes,
uid/gid 0, sorted entries, gzip without timestamp or name, canonical JSON), so the manifest
digest changes only when the content does.

Usage (every DEST is an absolute path inside the image):

  build-oci.py --out DIR --tag TAG [--tag TAG ...]
      [--entrypoint JSON_LIST] [--cmd JSON_LIST] [--env K=V ...] [--workdir PATH]
      [--label K=V ...] [--created RFC3339]
      [--file DEST[:MODE]=HOST_PATH ...]     copy a host file
      [--text DEST[:MODE]=CONTENT ...]       a file with the given content
      [--dir DEST[:MODE] ...]                a directory (parents are added as 0755)
      [--symlink DEST=TARGET ...]            a symbolic link
      [--applet-links DIR=HOST_BUSYBOX ...]  DIR/<applet> -> busybox for each `HOST_BUSYBOX --list`

MODE is octal (default 0644 for files, 0755 for directories; --file keeps the host file's
permission bits unless MODE is given). DIR is written as an OCI image layout
(oci-layout, index.json, blobs/sha256/...), replacing what was there; index.json names the
manifest once per --tag (annotation org.opencontainers.image.ref.name), so
`skopeo copy oci:DIR:TAG ...` works. The manifest digest is printed on stdout.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile

# 2024-01-01T00:00:00Z: every file's mtime and the image's creation time.
FIXED_EPOCH = 1704067200
FIXED_CREATED = "2024-01-01T00:00:00Z"

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"


class Layer:
    """The file tree of the single layer: path (no leading slash) -> entry."""

    def __init__(self):
        self.entries = {}

    @staticmethod
    def _norm(dest):
        if not dest.startswith("/"):
            raise SystemExit(f"build-oci: {dest!r}: paths inside the image must be absolute")
        path = posixpath.normpath(dest).lstrip("/")
        if not path or path.startswith(".."):
            raise SystemExit(f"build-oci: {dest!r}: not a usable path")
        return path

    def _parents(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            entry = self.entries.get(parent)
            if entry is None:
                self.entries[parent] = ("dir", 0o755, None)
            elif entry[0] != "dir":
                raise SystemExit(f"build-oci: /{parent} is needed as a directory")

    def _put(self, dest, entry, replace=True):
        path = self._norm(dest)
        self._parents(path)
        old = self.entries.get(path)
        if old is not None and not replace:
            return
        self.entries[path] = entry

    def add_dir(self, dest, mode=0o755):
        self._put(dest, ("dir", mode, None))

    def add_data(self, dest, data, mode=0o644):
        self._put(dest, ("file", mode, data))

    def add_symlink(self, dest, target, replace=True):
        self._put(dest, ("symlink", 0o777, target), replace=replace)

    def tar_bytes(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, mode, payload = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mtime = FIXED_EPOCH
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = mode
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = payload
                    tar.addfile(info)
                else:
                    info.type = tarfile.REGTYPE
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        return buf.getvalue()


def parse_mode(text, what):
    try:
        mode = int(text, 8)
    except ValueError:
        raise SystemExit(f"build-oci: {what}: bad octal mode {text!r}")
    if not 0 <= mode <= 0o7777:
        raise SystemExit(f"build-oci: {what}: bad mode {text!r}")
    return mode


def split_dest_mode(spec, what):
    """'DEST[:MODE]' -> (DEST, MODE or None)."""
    if ":" in spec:
        dest, mode = spec.rsplit(":", 1)
        return dest, parse_mode(mode, what)
    return spec, None


def split_eq(spec, what):
    if "=" not in spec:
        raise SystemExit(f"build-oci: {what} {spec!r}: expected LEFT=RIGHT")
    return spec.split("=", 1)


def json_list(text, what):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"build-oci: {what}: not JSON: {err}")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SystemExit(f"build-oci: {what}: expected a JSON list of strings")
    return value


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def gzip_bytes(data):
    buf = io.BytesIO()
    # No file name and mtime 0 in the gzip header; fixed level.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def busybox_applets(binary):
    out = subprocess.run([binary, "--list"], check=True, capture_output=True, text=True).stdout
    names = sorted({line.strip() for line in out.splitlines() if line.strip()})
    for name in names:
        if "/" in name or name in (".", ".."):
            raise SystemExit(f"build-oci: {binary} --list gave a strange applet name {name!r}")
    return names


def build_layer(args):
    layer = Layer()
    for spec in args.dir:
        dest, mode = split_dest_mode(spec, "--dir")
        layer.add_dir(dest, 0o755 if mode is None else mode)
    for spec in args.file:
        left, host = split_eq(spec, "--file")
        dest, mode = split_dest_mode(left, "--file")
        with open(host, "rb") as f:
            data = f.read()
        if mode is None:
            mode = os.stat(host).st_mode & 0o7777
        layer.add_data(dest, data, mode)
    for spec in args.text:
        left, content = split_eq(spec, "--text")
        dest, mode = split_dest_mode(left, "--text")
        layer.add_data(dest, content.encode(), 0o644 if mode is None else mode)
    for spec in args.symlink:
        dest, target = split_eq(spec, "--symlink")
        layer.add_symlink(dest, target)
    for spec in args.applet_links:
        directory, binary = split_eq(spec, "--applet-links")
        for name in busybox_applets(binary):
            if name == "busybox":
                continue
            # Never replace a file given explicitly.
            layer.add_symlink(posixpath.join(directory, name), "busybox", replace=False)
    return layer


def write_layout(out_dir, blobs, index):
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-oci-", dir=parent)
    try:
        blob_dir = os.path.join(tmp, "blobs", "sha256")
        os.makedirs(blob_dir)
        for digest, data in blobs.items():
            with open(os.path.join(blob_dir, digest.split(":", 1)[1]), "wb") as f:
                f.write(data)
        with open(os.path.join(tmp, "oci-layout"), "wb") as f:
            f.write(canonical_json({"imageLayoutVersion": "1.0.0"}))
        with open(os.path.join(tmp, "index.json"), "wb") as f:
            f.write(canonical_json(index))
        os.chmod(tmp, 0o755)
        old = None
        if os.path.lexists(out_dir):
            old = tempfile.mkdtemp(prefix=".build-oci-old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "layout"))
        os.rename(tmp, out_dir)
        tmp = None
        if old is not None:
            shutil.rmtree(old)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="OCI layout directory to (re)write")
    p.add_argument("--tag", action="append", required=True, help="ref name in index.json")
    p.add_argument("--entrypoint", help="JSON list, e.g. '[\"/pause\"]'")
    p.add_argument("--cmd", help="JSON list, e.g. '[\"sh\"]'")
    p.add_argument("--env", action="append", default=[], help="K=V")
    p.add_argument("--workdir")
    p.add_argument("--label", action="append", default=[], help="K=V")
    p.add_argument("--created", default=FIXED_CREATED)
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--text", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("--symlink", action="append", default=[])
    p.add_argument("--applet-links", action="append", default=[])
    args = p.parse_args(argv)

    layer = build_layer(args)
    tar = layer.tar_bytes()
    layer_gz = gzip_bytes(tar)

    image_config = {}
    if args.env:
        for kv in args.env:
            split_eq(kv, "--env")
        image_config["Env"] = list(args.env)
    if args.entrypoint is not None:
        image_config["Entrypoint"] = json_list(args.entrypoint, "--entrypoint")
    if args.cmd is not None:
        image_config["Cmd"] = json_list(args.cmd, "--cmd")
    if args.workdir:
        image_config["WorkingDir"] = args.workdir
    if args.label:
        image_config["Labels"] = dict(split_eq(kv, "--label") for kv in args.label)

    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": args.created,
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        "history": [{"created": args.created, "created_by": "nodelet images/build-oci.py"}],
    }
    config_bytes = canonical_json(config)

    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": sha256(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MT_LAYER_GZIP, "digest": sha256(layer_gz), "size": len(layer_gz)}],
    }
    manifest_bytes = canonical_json(manifest)
    manifest_digest = sha256(manifest_bytes)

    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {REF_NAME: tag},
            }
            for tag in args.tag
        ],
    }
    blobs = {
        sha256(layer_gz): layer_gz,
        sha256(config_bytes): config_bytes,
        manifest_digest: manifest_bytes,
    }
    write_layout(args.out, blobs, index)
    print(manifest_digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
