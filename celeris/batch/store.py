"""The output and error files of a batch job: append-only JSONL, one fsync per line, resumable.

A run that dies (even by SIGKILL) leaves at most one torn line at the end of a file; the next
run cuts it, skips every id already written, and carries on. A failure marked retryable (the
server was busy, out of memory, timed out) does not count as done: the next run tries again. A sidecar ``OUT.meta.json`` holds
the input's sha256, so a changed input is refused instead of being silently mixed in.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

META_VERSION = 1


def meta_path(output: Path) -> Path:
    return output.with_name(output.name + ".meta.json")


def repair(path: Path) -> list[dict[str, Any]]:
    """Cut a torn last line (no trailing newline) and return the records before it."""
    if not path.exists():
        return []
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    records = []
    for number, raw in enumerate(data[:keep].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw))
        except json.JSONDecodeError:
            raise ValueError(f"{path} line {number} is not valid JSON (only a torn last line "
                             "is repaired); fix or remove it, or pass --restart") from None
    return records


def record_key(record: dict[str, Any]) -> str:
    cid = record.get("custom_id")
    return cid if cid is not None else f"@line{record.get('line')}"


def is_retryable(record: dict[str, Any]) -> bool:
    return bool((record.get("error") or {}).get("retryable"))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResultStore:
    """Appends result and error records; knows which ids are done across restarts."""

    def __init__(self, output: Path, errors: Path, input_sha256: str, restart: bool,
                 meta: dict[str, Any] | None = None) -> None:
        self.output, self.errors = Path(output), Path(errors)
        self._lock = threading.Lock()
        self._check_meta(input_sha256, restart)
        if restart:
            for p in (self.output, self.errors):
                p.unlink(missing_ok=True)
        self.done_ok = {record_key(r) for r in repair(self.output)}
        self.done_failed = {record_key(r) for r in repair(self.errors) if not is_retryable(r)}
        self.retry_later: set[str] = set()   # failed retryably in this run
        _atomic_write(meta_path(self.output), json.dumps(
            {"version": META_VERSION, "input_sha256": input_sha256,
             "errors": str(self.errors), "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             **(meta or {})}, indent=2) + "\n")
        self._files = {"ok": open(self.output, "ab"), "failed": open(self.errors, "ab")}

    def _check_meta(self, input_sha256: str, restart: bool) -> None:
        if restart:
            return
        mp = meta_path(self.output)
        started = self.output.exists() and self.output.stat().st_size > 0
        if not mp.exists():
            if started:
                raise ValueError(f"{self.output} already holds results but has no {mp.name}; "
                                 "pass --restart to overwrite it, or choose another --output")
            return
        try:
            recorded = json.loads(mp.read_text(encoding="utf-8")).get("input_sha256")
        except (json.JSONDecodeError, AttributeError):
            raise ValueError(f"{mp} is damaged; pass --restart to start over") from None
        if recorded != input_sha256:
            raise ValueError(f"the input changed since {self.output} was started (sha256 "
                             f"{str(recorded)[:12]}... then, {input_sha256[:12]}... now); "
                             "pass --restart to start over, or choose another --output")

    def is_done(self, key: str) -> bool:
        return key in self.done_ok or key in self.done_failed

    @property
    def num_failed(self) -> int:
        """Lines that failed for good, plus those that failed retryably in this run."""
        return len(self.done_failed) + len(self.retry_later - self.done_ok)

    def write(self, kind: str, record: dict[str, Any]) -> None:
        """Append one record as one line and make it durable before returning."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            f = self._files[kind]
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            done = self.done_ok if kind == "ok" else \
                self.retry_later if is_retryable(record) else self.done_failed
            done.add(record_key(record))

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
