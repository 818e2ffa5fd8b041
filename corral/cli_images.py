"""`corral images`: billing projects' images in corral's own registry (docs/images.md).

`import FILE --project P --name N [--tag T]` loads a `docker save` archive or an OCI layout tarball into
the project, as `localhost/P/N:T`, the reference its jobs write; `ls [--project P]` lists the images a
project's jobs may run from corral's registry (its own, then the base images), of every project you may
see without `--project`, then the public images only workers hold, each with how many live workers hold it;
`rm localhost/P/N:T` deletes a tag.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.batch.v1 import image_pb2
from corral.cli_common import open_client, print_json, with_json
from corral.errors import UsageError
from corral.refusal_words import Option, option_words
from corral.sizes import binary_size

OWN = "localhost/"
"""How references name corral's own registry."""


def image_line(image: image_pb2.Image) -> str:
    """One image: reference, digest, size and layers in corral's registry (`-` for one only workers hold), and
    how many live workers hold it (`workers=?` when they could not be asked)."""
    workers = image.workers_holding if image.HasField("workers_holding") else "?"
    if not image.size_bytes and not image.layers and not image.billing_project:  # only workers hold it
        return f"{image.reference}  {image.digest}  -  layers=-  workers={workers}"
    return f"{image.reference}  {image.digest}  {binary_size(image.size_bytes)}  layers={image.layers}  workers={workers}"


def project_image(reference: str) -> tuple[str, str, str]:
    """`localhost/PROJECT/NAME[:TAG]` as (project, name, tag); UsageError for anything else."""
    rest = reference.removeprefix(OWN)
    project, slash, name = rest.partition("/")
    name, _, tag = name.partition(":")
    if not reference.startswith(OWN) or not slash or not project or not name or "/" in name or "@" in reference:
        raise UsageError(f"{reference!r}: name a project's image as localhost/PROJECT/NAME[:TAG]")
    return project, name, tag or "latest"


def _images(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "import":
            image = client.import_image(args.project, args.file, args.name, args.tag)
            if args.json:
                print_json([image])
            else:
                print(f"imported {image.reference} ({image.digest}, {binary_size(image.size_bytes)}): "
                      f"jobs of billing project {args.project} run it as image: {image.reference}")
            return 0
        if args.action == "rm":
            project, name, tag = project_image(args.reference)
            client.delete_image(project, name, tag)
            if not args.json:
                print(f"deleted {OWN}{project}/{name}:{tag}")
            return 0
        projects = [args.project] if args.project else [p.name for p in client.billing_projects()]
        images: list[image_pb2.Image] = []
        seen: set[str] = set()
        for project in projects:
            for image in client.images(project):
                if image.reference not in seen:  # the base images are every project's
                    seen.add(image.reference)
                    images.append(image)
    if args.json:
        print_json(images)
    elif not images:
        print("no images")
    else:
        for image in images:
            print(image_line(image))
        if any(not image.HasField("workers_holding") for image in images):
            print("workers=?: the drivers could not be asked what the workers hold", file=sys.stderr)
    return 0


def add_commands(commands: Any) -> None:
    """Add `images` with its subcommands."""
    images = commands.add_parser("images", help="billing projects' images in corral's own registry")
    actions = images.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    load = with_json(actions.add_parser(
        "import", help="import a `docker save` archive or an OCI layout tarball into a project (members)"))
    load.add_argument("file", help="the archive: docker save -o FILE.tar IMAGE, or skopeo copy ... "
                                   "docker-archive:FILE.tar / oci-archive:FILE.tar")
    load.add_argument("--project", required=True, help="the billing project the image goes into")
    load.add_argument("--name", required=True, help="the image's name in the project (e.g. my-tool)")
    load.add_argument("--tag", default="latest", help="its tag (default: %(default)s)")
    listing = with_json(actions.add_parser(
        "ls", help="the images a project's jobs may run from corral's registry and what the workers hold"))
    listing.add_argument("--project", help="only this billing project's (default: every project you may see)")
    remove = with_json(actions.add_parser("rm", help="delete a tag of a project's image (members)"))
    remove.add_argument("reference", help="localhost/PROJECT/NAME[:TAG]")
    images.set_defaults(run=_images, words=option_words({
        "header.billing_project": Option("--project"), "header.name": Option("--name"), "header.tag": Option("--tag"),
        "billing_project": Option("--project"), "name": Option("the image's name"), "tag": Option("the tag")}))
