"""The conversation log: every ``run`` answer and ``chat`` turn in an SQLite database under
TileInfer's home (``logs.db``), for ``tileinfer logs`` and ``tileinfer chat --continue``.

Several commands may write at once: the database is in WAL mode and a writer waits up to
BUSY_TIMEOUT_S for another's lock. Logging comes after the answer is printed, and a log that
cannot be written (corrupt, locked, a read-only home) costs one warning line, never the answer.
``--no-log`` or ``TILEINFER_LOGS=0`` turns it off.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import uuid
from datetime import datetime, timezone

from .errors import UserError

ENV = "TILEINFER_LOGS"
BUSY_TIMEOUT_S = 5.0
COLUMNS = ("id", "conversation_id", "datetime_utc", "command", "model", "backend", "system",
           "prompt", "answer", "options", "prompt_tokens", "answer_tokens",
           "time_to_first_token", "seconds", "finish_reason")
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    datetime_utc TEXT NOT NULL,
    command TEXT NOT NULL,
    model TEXT,
    backend TEXT,
    system TEXT,
    prompt TEXT NOT NULL,
    answer TEXT NOT NULL,
    options TEXT,
    prompt_tokens INTEGER,
    answer_tokens INTEGER,
    time_to_first_token REAL,
    seconds REAL,
    finish_reason TEXT
);
CREATE INDEX IF NOT EXISTS responses_by_conversation ON responses (conversation_id, id);
"""


def logging_on(args) -> bool:
    """Off with --no-log, or TILEINFER_LOGS set to 0, off, false or no."""
    if getattr(args, "no_log", False):
        return False
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def db_path():
    from tileinfer.io.paths import tileinfer_home

    return tileinfer_home() / "logs.db"


def connect(create: bool = True) -> sqlite3.Connection:
    path = db_path()
    if not create and not path.exists():
        raise UserError(f"no conversation logged yet ({path} does not exist)")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    if create:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(SCHEMA)
    return conn


def add_log_flag(p):
    p.add_argument("--no-log", action="store_true",
                   help=f"do not log this in TileInfer's log database (or set {ENV}=0)")


def new_conversation_id() -> str:
    return uuid.uuid4().hex[:16]


class Log:
    """Writes the responses of one command; warns once on stderr if it cannot."""

    def __init__(self, args, command: str):
        self.enabled = logging_on(args)
        self.command = command
        self.warned = False

    def write(self, conversation_id: str, **fields) -> bool:
        if not self.enabled:
            return False
        row = {"conversation_id": conversation_id, "command": self.command,
               "datetime_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               **fields}
        if isinstance(row.get("options"), dict):
            row["options"] = json.dumps(row["options"], ensure_ascii=False)
        try:
            conn = connect()
            try:
                with conn:
                    conn.execute(f"INSERT INTO responses ({', '.join(row)}) VALUES "
                                 f"({', '.join('?' * len(row))})", list(row.values()))
            finally:
                conn.close()
        except (sqlite3.Error, OSError, ValueError) as e:
            if not self.warned:
                self.warned = True
                print(f"tileinfer: warning: the answer was not logged ({e}; {ENV}=0 or --no-log "
                      "turns logging off)", file=sys.stderr)
            return False
        return True


def _read(sql: str, params=()) -> list[dict]:
    try:
        conn = connect(create=False)
        try:
            return [dict(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise UserError(f"cannot read the log {db_path()}: {e}") from None


def recent(limit: int, query: str | None = None, conversation: str | None = None) -> list[dict]:
    """The latest ``limit`` responses (oldest first), optionally those whose prompt, answer or
    system message holds ``query``, or those of one conversation."""
    where, params = [], []
    if query:
        like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where.append("(prompt LIKE ? ESCAPE '\\' OR answer LIKE ? ESCAPE '\\' "
                     "OR system LIKE ? ESCAPE '\\')")
        params += [like] * 3
    if conversation:
        where.append("conversation_id = ?")
        params.append(conversation)
    sql = ("SELECT * FROM responses" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY id DESC" + (" LIMIT ?" if limit else ""))
    rows = _read(sql, params + ([limit] if limit else []))
    for r in rows:
        r["options"] = json.loads(r["options"]) if r.get("options") else {}
    return rows[::-1]


def conversation(cid: str | None) -> tuple[str, list[dict]]:
    """(id, responses oldest first) of conversation ``cid``, or of the latest one for None."""
    if cid is None:
        latest = _read("SELECT conversation_id FROM responses ORDER BY id DESC LIMIT 1")
        if not latest:
            raise UserError("no conversation logged yet")
        cid = latest[0]["conversation_id"]
    rows = recent(0, conversation=cid)
    if not rows:
        raise UserError(f"no conversation {cid!r} in the log (tileinfer logs lists them)")
    return cid, rows
