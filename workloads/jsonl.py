"""One reader for the JSONL files a user hands us (serve workloads and traces, task data): every
non-blank line must be a JSON object, and every problem is one ValueError naming the file and
line (`<path>:N: ...`), so the CLI can print it as one line."""
from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator


def objects(path: str | os.PathLike) -> Iterator[tuple[int, str, dict]]:
    """(line number, where, object) per non-blank line of a JSONL or JSONL.gz file; `where` is
    the "<path>:N" prefix for the caller's own field errors."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                where = f"{path}:{n}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{where}: not UTF-8 text") from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
                yield n, where, obj
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ValueError(f"{path}: no such file") from None
    except (OSError, EOFError) as e:  # unreadable, or a broken .gz
        raise ValueError(f"{path}: cannot read ({e})") from None
