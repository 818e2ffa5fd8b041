"""What an image archive holds (services.frontend.image_import.inspect_archive): a `docker save` archive or
an OCI layout tarball of one image, read from the tar's index without extracting anything; anything else
is refused saying what was found."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from services.frontend.image_import import DOCKER_ARCHIVE, OCI_ARCHIVE, BadArchive, inspect_archive


def tar_of(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def docker_save(n_layers: int, n_images: int = 1) -> dict[str, bytes]:
    image = {"Config": "config.json", "RepoTags": ["x:latest"], "Layers": [f"{i}/layer.tar" for i in range(n_layers)]}
    return {"manifest.json": json.dumps([image] * n_images).encode(), "config.json": b"{}",
            **{f"{i}/layer.tar": b"" for i in range(n_layers)}}


def oci_layout(n_layers: int, media_type: str = "application/vnd.oci.image.manifest.v1+json") -> dict[str, bytes]:
    manifest = json.dumps({"schemaVersion": 2, "layers": [{"size": 1}] * n_layers}).encode()
    digest = hashlib.sha256(manifest).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{"mediaType": media_type, "digest": f"sha256:{digest}"}]}
    return {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index).encode(),
            f"blobs/sha256/{digest}": manifest}


def test_both_formats_and_their_layers(tmp_path: Path) -> None:
    assert inspect_archive(tar_of(tmp_path / "d.tar", docker_save(3)), 10).transport == DOCKER_ARCHIVE
    assert inspect_archive(tar_of(tmp_path / "d.tar", docker_save(3)), 10).layers == 3
    found = inspect_archive(tar_of(tmp_path / "o.tar", {f"./{k}": v for k, v in oci_layout(2).items()}), 10)
    assert (found.transport, found.layers) == (OCI_ARCHIVE, 2)


@pytest.mark.parametrize("files, words", [
    (docker_save(11), "11 layers, more than 10 (max_image_layers)"),
    (oci_layout(11), "11 layers"),
    (docker_save(1, n_images=2), "names 2 images"),
    (oci_layout(1, "application/vnd.oci.image.index.v1+json"), "several platforms"),
    ({"hello.txt": b"hi"}, "neither a `docker save` archive"),
    ({"manifest.json": b"{not json"}, "manifest.json is not JSON"),
    ({"oci-layout": b"{}", "index.json": json.dumps({"manifests": [{"digest": "sha256:" + "0" * 64}]}).encode()},
     "a manifest the layout does not hold"),
])
def test_what_is_not_one_image_is_refused_saying_why(tmp_path: Path, files: dict[str, bytes], words: str) -> None:
    with pytest.raises(BadArchive, match=words.replace("(", r"\(").replace(")", r"\)").replace("`", ".")):
        inspect_archive(tar_of(tmp_path / "x.tar", files), 10)


def test_not_a_tar(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x1f\x8b" + b"x" * 1000)
    with pytest.raises(BadArchive, match="not a tar archive"):
        inspect_archive(tmp_path / "junk", 10)
