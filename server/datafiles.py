"""Files a scenario submitted through the API may read: the data folder, and nothing else.

A scenario names files (a trace to replay, a dataset of prompts). From a terminal that is
the user's own business; through the API it would let anyone holding the token read the
service host's files (`trace: {path: /etc/shadow}` once came back quoted in a 422), probe
which files exist, or hang a worker on a FIFO. So API scenarios may only name regular files
inside the operator's data folder (`tokenbench serve --data-dir`, which uploads also land
in), or beside the shipped scenarios for a shipped scenario; each file has a size limit; and
an error about a file never quotes its contents.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from bench.tokenizer import TOKENIZER_FILE

DEFAULT_MAX_FILE_MB = 1024  # ShareGPT V3 is ~670 MB
UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_WORD = re.compile(r"[^\s,;:'\"()\[\]{}=]{4,}")
CONTENT_SAMPLE_BYTES = 1 << 20


class DataFileError(ValueError):
    """A file a scenario names that the service will not read; the message is safe to show."""


class TooLargeError(DataFileError):
    """An upload over the size limit."""


class DataFolder:
    """The operator's data folder (None: API scenarios read no files) and the size limit."""

    def __init__(self, root: Path | None, max_file_mb: float = DEFAULT_MAX_FILE_MB) -> None:
        self.root = Path(root).expanduser().resolve() if root is not None else None
        self.max_bytes = int(max_file_mb * 1024 * 1024)
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)

    def resolve(self, given: str, field: str, extra_roots: tuple[Path, ...] = ()) -> Path:
        """The regular file `given` names inside a permitted folder, or DataFileError.

        The same message for a file outside the folders whether or not it exists, so the
        API cannot be used to probe the host's files.
        """
        roots = [r.resolve() for r in (*extra_roots, *([self.root] if self.root else []))]
        if not roots:
            raise DataFileError(
                f"{field}: this service has no data folder, so a scenario sent to it cannot "
                "read files; the operator can start it with `tokenbench serve --data-dir DIR`"
            )
        outside = DataFileError(
            f"{field} {given!r}: scenarios sent to the service may only read files in its "
            "data folder (give a name relative to it; upload files with PUT /api/data/NAME)"
        )
        for root in roots:
            candidate = Path(given) if Path(given).is_absolute() else root / given
            try:
                real = candidate.resolve(strict=True)
            except (OSError, RuntimeError):
                continue
            if not real.is_relative_to(root):
                continue
            return self._check_file(real, given, field)
        inside = any(_inside(Path(given), r) for r in roots) or not Path(given).is_absolute()
        if inside and ".." not in Path(given).parts:
            raise DataFileError(f"{field} {given!r}: no such file in the data folder")
        raise outside

    def resolve_tokenizer(self, given: str, field: str, extra_roots: tuple[Path, ...] = ()) -> Path:
        """A tokenizer is a tokenizer.json or a folder holding one: either way the file
        read must be a regular file inside a permitted folder (resolve's rules and errors).
        A folder is never listed in an error, unlike on the user's own terminal."""
        for root in [r.resolve() for r in (*extra_roots, *([self.root] if self.root else []))]:
            candidate = Path(given) if Path(given).is_absolute() else root / given
            with contextlib.suppress(OSError, RuntimeError):
                real = candidate.resolve(strict=True)
                if real.is_relative_to(root) and real.is_dir():
                    return self.resolve(str(Path(given) / TOKENIZER_FILE), field, extra_roots)
        return self.resolve(given, field, extra_roots)

    def _check_file(self, path: Path, given: str, field: str) -> Path:
        info = os.stat(path)  # stat never blocks, unlike opening a FIFO
        if not stat.S_ISREG(info.st_mode):
            raise DataFileError(f"{field} {given!r}: not a regular file")
        if info.st_size > self.max_bytes:
            raise DataFileError(
                f"{field} {given!r}: {info.st_size / 2**20:,.0f} MiB is over the service's "
                f"{self.max_bytes / 2**20:,.0f} MiB limit per file (--max-data-file-mb)"
            )
        return path

    def listing(self) -> list[dict]:
        if self.root is None:
            return []
        out = []
        for p in sorted(self.root.iterdir()):
            with contextlib.suppress(OSError):
                info = p.lstat()
                if stat.S_ISREG(info.st_mode) and not p.name.startswith("."):
                    out.append({"name": p.name, "bytes": info.st_size})
        return out

    async def save(self, name: str, chunks: AsyncIterator[bytes]) -> tuple[Path, int]:
        """Stream an upload into the folder (never whole in memory), atomically, capped."""
        if self.root is None:
            raise DataFileError(
                "this service has no data folder to upload to; start it with --data-dir DIR"
            )
        if not UPLOAD_NAME.match(name):
            raise DataFileError(
                f"name {name!r}: use letters, digits, '.', '_' or '-' (up to 100), "
                "starting with a letter or digit"
            )
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=self.root)
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise TooLargeError(
                            f"upload {name!r} is over the service's "
                            f"{self.max_bytes / 2**20:,.0f} MiB limit per file"
                        )
                    f.write(chunk)
            target = self.root / name
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return target, size


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def without_contents(message: str, paths: list[Path]) -> str:
    """The message with every word that occurs in one of the files replaced by '…'.

    Library errors about a bad file quote what they found (a CSV header, a timestamp), which
    is right on the user's own terminal and wrong in an API answer: it would hand anyone
    the first line of any file the service may read.
    """
    sample = b""
    for path in paths:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            sample += f.read(CONTENT_SAMPLE_BYTES) + b"\n"
    if not sample:
        return message
    text = sample.decode("utf-8", "replace")
    names = {str(p) for p in paths} | {p.name for p in paths}

    def mask(m: re.Match) -> str:
        word = m.group(0)
        if word in names or any(word in n for n in names):
            return word
        return "…" if word in text else word

    return _WORD.sub(mask, message)
