# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Where -J and --plot write, checked before the run and written whole after it.

A result file is never written in place: the bytes go to a temporary file in the target's directory, which is then
renamed (or hard-linked) onto the final name, so a run killed mid-write, a full file system or two runs on the same
path leave either the complete new file or nothing, and never a truncated one. An existing JSON is kept and the new
one gets the next free FILE.json.0, .1, ... as nccl-tests names it, unless --overwrite.
"""

import errno
import os
import stat
import tempfile
from typing import Optional

# What matplotlib's Agg-based savefig writes (matplotlib.backend_bases: get_supported_filetypes of a default canvas).
FIGURE_FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff",
                  "webp")


def figure_format(path: str) -> str:
    return os.path.splitext(path)[1].lower().lstrip(".")


TEMP_PREFIX = ".tide-perf-"  # the temporary file's name: short, so that any legal final name leaves room for it


def _name_max(parent: str) -> int:
    try:
        return os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def output_problem(path: str, kind: str, overwrite: bool = True) -> Optional[str]:
    """Why `path` cannot take the run's JSON (kind "json") or figure ("plot"), None if it can: every check the write
    after the run would fail, made before it. The directory is probed by creating and removing a file in it as the
    write does: permission bits do not tell (root, read-only mounts, /proc). overwrite False: an existing file is
    kept and the next free name (`path`.N) written, whose length is checked too."""
    if not path:
        return "empty path: name a file"
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        return "ends with a path separator: name a file (e.g. DIR/results.json)"
    if kind == "plot" and figure_format(path) not in FIGURE_FORMATS:
        ext = figure_format(path)
        return f"unsupported figure format {('.' + ext) if ext else '(no extension)'}: use one of " + ", ".join(
            "." + f for f in FIGURE_FORMATS
        )
    if os.path.islink(path) and not os.path.exists(path):
        return "is a dangling symbolic link"
    if os.path.isdir(path):
        return "is a directory"
    if os.path.exists(path):
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            return "exists and is not a regular file (a FIFO, a device or a socket would block or discard the result)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    final = os.path.basename(path if overwrite else free_name(path))
    limit = _name_max(parent)
    if len(os.fsencode(final)) > limit:
        return f"the file name {final[:40]}... is {len(os.fsencode(final))} bytes; this file system takes {limit}"
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=TEMP_PREFIX, suffix=".tmp")
    except OSError as e:
        return f"directory {parent} is not writable ({e.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None


def free_name(path: str) -> str:
    """`path` if nothing is there, else nccl-tests' next free `path.N`."""
    if not os.path.lexists(path):
        return path
    n = 0
    while os.path.lexists(f"{path}.{n}"):
        n += 1
    return f"{path}.{n}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_whole(path: str, data: bytes, overwrite: bool) -> str:
    """Writes `data` to `path` through a temporary file and returns the name written: `path`, or with overwrite
    False and `path` taken meanwhile (another run), the next free name. Raises OSError; leaves no temporary file."""
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=TEMP_PREFIX, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # as open() would create it (mkstemp makes it 0600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
            return path
        tried = set()
        while True:
            target = free_name(path)
            if target in tried:  # a name that is neither free nor taken (a file where a directory is named)
                raise OSError(errno.EEXIST, f"{target} cannot be created", target)
            tried.add(target)
            try:
                os.link(tmp, target)  # fails if the name was taken since free_name looked
                return target
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # a file system without hard links: reserve the name, then rename over the reservation
                try:
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                except FileExistsError:
                    continue  # taken meanwhile: the next free name (a repeat is refused above)
                os.replace(tmp, target)
                return target
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
